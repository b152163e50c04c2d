"""The attention backward's masks (attention_bwd.py): which query blocks a key block's CTA
walks, which key blocks add to a query block's dQ (the deterministic mode's order), and
which scores of a tile of 64 keys by 64 query rows are masked; for the causal mask, a
sliding window and packed varlen sequences, as the forward (attention.py) takes them.

The window (left, right), given at launch as the forward's window build takes it: query row
r sees keys r + off - left .. r + off + right, off = kv_seq - seq (the diagonal aligned to
the end of each sequence). Every comparison adds `seq` to both sides so that no u32 value
goes below 0 (a varlen sequence may have more rows than keys). A key block and a query
block meet when some of the block's 128 keys and some of the 64 rows are in the band (keys
past kv_seq and rows past seq counted in): the key block's CTA walks the query blocks it
meets, the query block's dQ gets the adds of the key blocks it meets, the same pairs from
both sides, so a deterministic count of a dQ tile's adds comes out right."""

from typing import Any, NamedTuple

BN = 128  # keys of a CTA (64 per consumer warpgroup)
BM = 64  # query rows of a block


class Walk(NamedTuple):
    """A CTA's sequence: its query rows and keys, its key blocks and query blocks; varlen,
    its first query row and key in the packed tensors and its first row in the LSE and
    dPsum buffers (`rows0`, padded per sequence: varlen_rows0)."""

    seq: Any
    kv_seq: Any
    nkv: Any
    mblocks: Any
    q0: Any = None
    k0: Any = None
    rows0: Any = None


def padded(seq: int) -> int:
    """Query rows rounded up to whole blocks: the row count of the LSE and dPsum buffers."""
    return -(-seq // BM) * BM


def varlen_rows0(k, b, q0) -> Any:
    """Sequence b's first row in a head's padded LSE and dPsum rows (FlashAttention's
    layout): (q0 + 64 b) rounded down to a block, past the previous sequence's padded rows
    and with room for its own (head_rows)."""
    return k.let("rows0", (q0 + BM * b) / BM * BM)


def head_rows(total_q: int, batch: int) -> int:
    """A head's rows in the varlen LSE and dPsum buffers: every sequence's varlen_rows0 and
    padded rows fit."""
    return padded(total_q + BM * batch)


def query_blocks(k, n, sq: Walk, causal: bool, win, off) -> tuple[Any, Any]:
    """(first, stop) of the query blocks that key block n's CTA walks: causal, from the
    block holding its first key's diagonal; a window, those whose rows' windows reach its
    keys; varlen, none where n is past the sequence's keys."""
    if win is None:
        first = k.select(n * BN > off, (n * BN - off) / BM, 0) if causal else 0
        if sq.q0 is None:
            return k.let("m0", first), sq.mblocks
        return k.let("m0", first), k.let("m1", k.select(n < sq.nkv, sq.mblocks, 0))
    left, right = win
    lo = k.let("lo", n * BN + sq.seq)  # the first key + seq
    hi = k.let("hi", lo + (BN - 1) + left)  # the last key + seq + left
    stop = k.select(hi >= sq.kv_seq, k.min((hi - sq.kv_seq) / BM + 1, sq.mblocks), 0)
    if sq.q0 is not None:
        stop = k.select(n < sq.nkv, stop, 0)
    return (k.let("m0", k.select(lo > sq.kv_seq + right, (lo - sq.kv_seq - right) / BM, 0)),
            k.let("m1", stop))


def key_blocks(k, m, sq: Walk, causal: bool, win, off) -> tuple[Any, Any]:
    """(first, last) of the key blocks that add to query block m's dQ (called by a CTA that
    adds to it, so that the band reaches the block: nothing wraps)."""
    if win is None:
        return 0, k.min((m * BM + (BM - 1) + off) / BN, sq.nkv - 1) if causal else sq.nkv - 1
    left, right = win
    top = m * BM + sq.kv_seq  # the first row's diagonal key + seq
    return (k.select(top > sq.seq + left, (top - sq.seq - left) / BN, 0),
            k.min((top + (BM - 1) + right - sq.seq) / BN, sq.nkv - 1))


def edge(k0, m, sq: Walk, causal: bool, win, off) -> Any:
    """Whether the tile of keys k0 .. k0 + 63 and query block m has a masked score."""
    out = (k0 + 64 > sq.kv_seq) | (m * BM + BM > sq.seq)
    if causal:
        out = out | (k0 + 63 > m * BM + off)
    if win is not None:  # a row's window ends before the last key, or starts after the first
        out = out | (k0 + 63 + sq.seq > m * BM + sq.kv_seq + win[1]) | \
            (k0 + sq.seq + win[0] < m * BM + (BM - 1) + sq.kv_seq)
    return out


def masked(kr, qr, sq: Walk, causal: bool, win, off) -> Any:
    """Whether key kr is masked for query row qr."""
    out = (kr >= sq.kv_seq) | (qr >= sq.seq)
    if causal:
        out = out | (kr > qr + off)
    if win is not None:
        out = out | (kr + sq.seq > qr + sq.kv_seq + win[1]) | \
            (kr + sq.seq + win[0] < qr + sq.kv_seq)
    return out
