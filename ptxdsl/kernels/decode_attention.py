"""Decode attention with a split KV cache (flash-decoding), with the Python API.

O = softmax(Q K^T * scale) V for the few new tokens of each sequence against its KV cache:
bf16 Q (B x S x H x D, S = 1 to 16 new tokens, row-major), the cache K and V either paged,
(pages x page_size x KVH x D) with a block table (B x pages per sequence, s32), or contiguous
(B x S_max x KVH x D), both through 4-D tensor maps; per-sequence lengths `lens` (s32 on the
GPU, clamped to [0, the cache's capacity]); O like Q. Causal, new token t of a sequence of
length n sees keys 0 .. n - S + t (the new tokens are the last S keys, as the prefill op
aligns its mask to the end); a row that sees no key (n = 0, or n < S) is zero.

GQA packing: the `group` = H / KVH query heads that share a KV head, times the S new tokens,
are the rows of one 64-row tile (row R = t * group + g; the tensor cores' smallest M is 64,
rows past S * group repeat the last real row and are never stored), so each K / V block is
read once for all of them. More than 64 rows (group 8 x 16 tokens) take several tiles.

Split-KV: a work item is (sequence, KV head, row tile, split); a persistent grid (at most a
CTA an SM, `launch_grid`) walks them, CTA c taking items c, c + grid, ..., its producer
streaming the next item's blocks while the consumer finishes the last one. Split s of a
sequence of nb 128-key blocks takes blocks [s per, (s + 1) per) with per = ceil(nb /
splits), so a sequence's blocks spread over `splits` items whatever its length (`ranges` =
ceil(nb / per) of them are not empty; the others are skipped). A range that is its
sequence's only one stores O; otherwise it stores its unnormalised partial O and its rows'
max and sum (f32, only the tile's real rows: 4 of 64 for one token of GQA 4) into its slot of
`ws`, counts itself on the tile's semaphore (`sem`, zero between launches), and the range that
completes the count merges every slot in slot order into O (repeated runs are bit-identical),
a thread a row's four columns with the loads of four slots in flight at once, and leaves the
semaphore zero. The combine in the same launch needs no second kernel and no
workspace traffic when a sequence is not split; a separate combine kernel (one CTA per tile,
after the grid) would free the last CTA from the extra pass, at the cost of a second launch.

K / V blocks arrive by TMA, `box` keys a copy: a block of 128 keys is 128 / box copies, each
from its own page (box = min(page_size, 128); one copy at page sizes of 128 and up, and for a
contiguous cache). A copy past the sequence's end points at page -1, which TMA fills with
zeros without reading memory; the block table is read only at slots below pages_per_seq, and
TMA cannot read outside the cache's tensor map, so no length or table entry reads outside the
cache. The keys of the last block between the length and the end of its copy are whatever the
page holds (a torch.empty cache may hold NaN, and 0 x NaN is NaN in P V), so the consumer
zeroes those rows of V in shared memory before its last P V.

One producer warp streams K and V blocks into two pipelines; one consumer warpgroup loads the
Q tile itself (16-byte loads, a few KB) and, per block, computes S = Q K^T, masks it, updates
the rows' running max and sum (a row with no key yet keeps P = 0), rescales O and adds P V
with P from registers (frag). Decoding is bound by the cache's bandwidth: the ring is as deep
as shared memory allows (`stages_for`), and the consumer does not overlap blocks. The kernel
waits for the grid before it (`griddep_wait`) after its prologue, so it is launched with
programmatic dependent launch: a call's launch and barrier setup overlap the previous
kernel's last CTAs."""

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

import ptxdsl
from ptxdsl import array, bf16, f32, ptr, s32, tmap, u32
from ptxdsl.kernels.family import Family

from .wgmma import consumer_lanes, count_part

BN = 128  # keys per block
BM = 64  # rows of a tile (wgmma's M)
NEG = -1.0e30  # the score of a masked key
MAX_STAGES = 8
INFLIGHT = 96 * 1024  # bytes of K and V blocks a CTA's ring holds
SMS = 132  # H100 / H200
MIN_BLOCKS = 4  # the fewest 128-key blocks a split is worth
BOXES = (16, 32, 64, 128)  # keys per TMA copy: a page size below 128, or 128
UNROLL = 4  # slots the merge loads at a time


def stages_for(d: int) -> int:
    """The K / V ring's depth: INFLIGHT bytes of blocks a CTA, at least two stages (so the
    next block loads while one is used). Deeper rings measured slower on the H200 (d 128:
    2 stages 0.7% faster than 3; d 64: 3 stages up to 10% faster than 6): a CTA an SM with
    ~100 KB in flight already covers the memory's latency, and more outstanding requests
    only lower the DRAM's efficiency."""
    return max(2, min(MAX_STAGES, INFLIGHT // (2 * d * BN * 2)))


def slot_floats(d: int) -> int:
    """f32 elements of one split's slot: a tile's BM rows of d unnormalised O values, then
    each row's (max, sum); only the tile's real rows are written and read."""
    return BM * (d + 2)


def make_decode_attention(d: int = 128, box: int = 128,
                          stages: int | None = None) -> ptxdsl.KernelDef:
    """The decode kernel for head dim `d` (64 or 128) whose K / V copies are `box` keys (16,
    32, 64 or 128: min(page size, 128), or 128 for a contiguous cache), with a `stages`-deep
    ring (default: as deep as shared memory allows)."""
    if d not in (64, 128):
        raise ValueError(f"make_decode_attention: head dim is 64 or 128, not {d}")
    if box not in BOXES:
        raise ValueError(f"make_decode_attention: box is 16, 32, 64 or 128 keys, not {box}")
    stages = stages or stages_for(d)
    hb = d // 64  # 64-wide column blocks (a 128-byte swizzle row each)
    nsub = BN // box  # copies a block
    slot = slot_floats(d)
    name = f"decode_attention_d{d}_b{box}_s{stages}"

    def decode_attention(k, q: ptr(bf16), kc: tmap(bf16, 4), vc: tmap(bf16, 4), o: ptr(bf16),
                         lens: ptr(s32), table: ptr(s32), ws: ptr(f32), sem: ptr(u32),
                         seq: u32, heads: u32, kv_heads: u32, batch: u32, capacity: u32,
                         page_size: u32, pages_per_seq: u32, paged: u32, causal: u32,
                         splits: u32, scale_log2: f32):
        qs = k.shared("qs", bf16, [hb, BM, 64], align=1024, swizzle=128)
        # K: a column block's copies one after another, so its 128 keys are contiguous
        # (wgmma reads them as one B operand); V: a copy's column blocks side by side, box x
        # 64 apart (the MN-major descriptor's block stride)
        kp = k.pipeline("kp", stages, k=(bf16, [hb, nsub, box, 64], 1024, 128))
        vp = k.pipeline("vp", stages, v=(bf16, [nsub, hb, box, 64], 1024, 128, "mn"))
        last = k.shared("last", u32, [1])
        with k.if_(k.tid.x == 0):  # the descriptors are parameters: fetched while we wait
            k.tma_prefetch_desc(kc)
            k.tma_prefetch_desc(vc)
        # everything above is this CTA's own; Q, the cache, the lengths, the workspace and
        # the semaphores may be the grid before's to write (the append, the QKV projection)
        k.griddep_wait()
        group = k.let("group", heads / kv_heads)
        rows = k.let("rows", seq * group)
        mtiles = k.let("mtiles", (rows + (BM - 1)) / BM)
        nitems = k.let("nitems", batch * kv_heads * mtiles * splits)
        with k.role("producer", 0, 4, regs=40):
            with k.if_((k.warp == 0) & k.elect()):
                with k.for_("w", k.ctaid.x, nitems, k.nctaid.x) as w:
                    at = place_of(k, w, splits, mtiles, kv_heads)
                    it = item(k, w, splits, mtiles, kv_heads, lens[at.b], capacity)
                    with k.for_("j", it.j0, it.j1) as j:  # an idle split's range is empty
                        at = [place(k, j, p, box, it.b, it.n, table, page_size, pages_per_seq,
                                    paged) for p in range(nsub)]
                        k.acquire(kp)
                        for p, (row, page) in enumerate(at):
                            with k.for_(f"h{p}" if p else "h", 0, hb, unroll=True) as h:
                                k.tma_load(kp.k[h, p], kc,
                                           [(h * 64).to(s32), it.kvh.to(s32), row, page])
                        k.commit(kp)
                        k.acquire(vp)
                        for p, (row, page) in enumerate(at):
                            with k.for_(f"hv{p}" if p else "hv", 0, hb, unroll=True) as h:
                                k.tma_load(vp.v[p, h], vc,
                                           [(h * 64).to(s32), it.kvh.to(s32), row, page])
                        k.commit(vp)
        with k.role("consumer", 4, 8, regs=232):
            wg, leader, row, col = consumer_lanes(k)
            t = k.let("t", k.tid.x % 128)
            s = k.let("s", type=array(f32, 64))
            p_ = k.let("p", type=array(bf16, 64))
            acc = k.let("acc", type=array(f32, d // 2))
            mx = k.let("mx", type=array(f32, 2))
            l = k.let("l", type=array(f32, 2))  # noqa: E741
            fac = k.let("fac", type=array(f32, 2))
            # the next item's Q share and length are loaded an item ahead, so that a CTA
            # moving on does not wait for them while its ring sits full
            first = place_of(k, k.ctaid.x, splits, mtiles, kv_heads)
            qn = [k.let(f"qn{i}", v) for i, v in
                  enumerate(q_loads(k, d, q, t, first, rows, group, seq, heads))]
            nlen = k.let("nlen", lens[first.b])
            with k.for_("w", k.ctaid.x, nitems, k.nctaid.x) as w:
                it = item(k, w, splits, mtiles, kv_heads, nlen, capacity)
                n = it.n
                store_q(k, d, qs, qn, t)
                nxt = place_of(k, k.min(w + k.nctaid.x, nitems - 1), splits, mtiles, kv_heads)
                for i, v in enumerate(q_loads(k, d, q, t, nxt, rows, group, seq, heads)):
                    k.assign(qn[i], v)
                k.assign(nlen, lens[nxt.b])
                with k.for_("x", 0, d // 2, unroll=True) as x:
                    acc[x] = 0.0
                tok = []
                for i in range(2):
                    mx[i] = NEG
                    l[i] = 0.0
                    tok.append(k.let(f"tok{i}", (it.mt * BM + row + 8 * i) / group))
                with k.for_("j", it.j0, it.j1) as j:
                    k.wait(kp)
                    k.wgmma_fence()
                    with k.for_("kk", 0, d // 16, unroll=True) as kk:
                        k.wgmma(s, qs[kk / 4, 0, kk % 4 * 16],
                                kp.k[kk / 4, 0, 0, kk % 4 * 16], kk > 0)
                    k.wgmma_commit()
                    k.wgmma_wait(0)
                    k.release(kp)
                    with k.if_((j + 1) * BN + causal * (seq - 1) > n):  # keys to mask
                        with k.for_("jj", 0, 16, unroll=True) as jj:
                            with k.for_("e", 0, 4, unroll=True) as e:
                                cc = k.let("cc", j * BN + col + jj * 8 + e % 2)
                                late = k.select(e / 2 == 0, cc + seq > n + tok[0],
                                                cc + seq > n + tok[1])
                                masked = k.let("masked", (cc >= n) | (causal != 0) & late)
                                s[4 * jj + e] = k.select(masked, NEG, s[4 * jj + e])
                    softmax(k, s, mx, l, fac, scale_log2)
                    with k.for_("x", 0, d // 2, unroll=True) as x:
                        acc[x] = acc[x] * fac[x % 4 / 2]
                    with k.for_("x", 0, 64, unroll=True) as x:
                        p_[x] = s[x].to(bf16)
                    k.wait(vp)
                    with k.if_((j + 1) * BN > n):  # the rows past the length: zero V
                        zero = k.let("zero", k.bf16x2(k.let("z", 0.0).to(bf16), 0.0))
                        with k.for_("r", n - j * BN + t / 32, BN, 4) as r:
                            with k.for_("h", 0, hb, unroll=True) as h:
                                vp.v[r / box, h, r % box, t % 32 * 2] = zero
                        k.fence_proxy_async()
                        k.bar_sync(8, 128)
                    k.wgmma_fence()
                    for kk in range(8):
                        k.wgmma(acc, k.frag(p_, kk),
                                vp.v[kk * 16 // box, 0, kk * 16 % box, 0], True)
                    k.wgmma_commit()
                    k.wgmma_wait(0)
                    k.release(vp)
                for i in range(2):
                    l[i] = l[i] + k.shfl_xor(l[i], 1)
                    l[i] = l[i] + k.shfl_xor(l[i], 2)
                with k.if_(it.active & (it.ranges == 1)):
                    store(k, d, acc, l, o, it.b, it.kvh, it.mt, row, col, rows, group, seq,
                          heads)
                with k.if_(it.active & (it.ranges != 1)):
                    combine(k, acc, mx, l, ws, sem, last, o, it, splits, t, wg, leader, row,
                            col, rows, group, seq, heads, scale_log2)

    def combine(k, acc, mx, l, ws, sem, last, o, it, splits, t, wg, leader, row, col,  # noqa: E741
                rows, group, seq, heads, scale_log2):
        """Store this range's partial (the tile's real rows only: its unnormalised O rows,
        then each row's max and sum) in its slot and count it; the range that completes the
        count merges every slot into O, a thread a (row, 4 columns), the slots in order."""
        real = k.let("real", k.min(rows - it.mt * BM, BM))
        base = k.let("base", it.tile * splits * slot)
        mine = k.let("mine", base + it.split * slot)
        for i in range(2):
            r = k.let(f"prow{i}", row + 8 * i)
            with k.if_(r < real):
                with k.for_(f"pj{i}", 0, d // 8, unroll=True) as jj:
                    ws[mine + r * d + jj * 8 + col] = k.f32x2(acc[4 * jj + 2 * i],
                                                              acc[4 * jj + 2 * i + 1])
                with k.if_(col == 0):
                    ws[mine + BM * d + r * 2] = k.f32x2(mx[i], l[i])
        total = count_part(k, sem, it.tile, it.ranges, last, wg, leader)
        with k.if_(total):
            with k.for_("ci", t, real * (d // 4), 128) as ci:
                r = k.let("cr", ci / (d // 4))
                c = k.let("cc4", ci % (d // 4) * 4)
                top = k.let("top", NEG)
                sm = k.let("csum", 0.0)
                out = [k.let(f"co{e}", 0.0) for e in range(4)]
                with k.for_("sl", 0, it.ranges, UNROLL) as sl:
                    # UNROLL slots' loads issued together (a slot past the last re-reads it
                    # and counts nothing): the merge waits on memory UNROLL times fewer
                    got = []
                    for u in range(UNROLL):
                        at = k.let(f"cat{u}", base + k.min(sl + u, it.ranges - 1) * slot)
                        got.append((k.let(f"cml{u}", k.vload(ws[at + BM * d + r * 2], 2)),
                                    k.let(f"cpv{u}", k.vload(ws[at + r * d + c], 4))))
                    for u, (ml, pv) in enumerate(got):
                        m = k.let(f"cm{u}", k.select(sl + u < it.ranges, ml[0], NEG))
                        new = k.let(f"ctop{u}", k.max(top, m))
                        old = k.let(f"cold{u}", k.ex2((top - new) * scale_log2))
                        wt = k.let(f"cw{u}", k.ex2((m - new) * scale_log2))
                        k.assign(sm, k.fma(sm, old, ml[1] * wt))
                        for e in range(4):
                            k.assign(out[e], k.fma(out[e], old, pv[e] * wt))
                        k.assign(top, new)
                inv = k.let("cinv", k.select(sm > 0.0, k.rcp(sm), 0.0))
                rr = k.let("crr", it.mt * BM + r)
                at = k.let("cout", ((it.b * seq + rr / group) * heads + it.kvh * group
                                    + rr % group) * d + c)
                o[at] = k.bf16x4(*[(v * inv).to(bf16) for v in out])

    return ptxdsl.kernel(threads=256, name=name)(decode_attention)


@dataclass(frozen=True)
class Item:
    """A work item's place and key blocks (kernel values)."""

    split: Any
    tile: Any  # (sequence, KV head, row tile): its semaphore and slots
    mt: Any
    kvh: Any
    b: Any
    n: Any  # the sequence's length, clamped
    ranges: Any  # the sequence's splits that are not empty
    j0: Any  # this split's key blocks: j0 .. j1
    j1: Any
    active: Any  # the split is not empty (or it is the one of a sequence with no key)


@dataclass(frozen=True)
class Place:
    """Where work item w's rows are: sequence b, KV head kvh, row tile mt (kernel values)."""

    b: Any
    kvh: Any
    mt: Any


def place_of(k, w, splits, mtiles, kv_heads) -> Place:
    tile = w / splits
    return Place(b=tile / mtiles / kv_heads, kvh=tile / mtiles % kv_heads, mt=tile % mtiles)


def item(k, w, splits, mtiles, kv_heads, length, capacity) -> Item:
    """Work item w of a sequence `length` keys long (as loaded from lens): split w % splits
    of tile w / splits; the sequence's nb blocks cut into ranges of ceil(nb / splits)."""
    split = k.let("split", w % splits)
    tile = k.let("tile", w / splits)
    b = k.let("b", tile / mtiles / kv_heads)
    n = k.let("n", k.min(k.max(length, 0).to(u32), capacity))
    nb = k.let("nb", (n + (BN - 1)) / BN)
    per = k.let("per", k.max((nb + splits - 1) / splits, 1))
    ranges = k.let("ranges", k.max((nb + per - 1) / per, 1))
    j0 = k.let("j0", split * per)
    return Item(split=split, tile=tile, mt=k.let("mt", tile % mtiles),
                kvh=k.let("kvh", tile / mtiles % kv_heads), b=b, n=n, ranges=ranges, j0=j0,
                j1=k.let("j1", k.min(j0 + per, nb)), active=k.let("active", split < ranges))


def place(k, j, p: int, box: int, b, n, table, page_size, pages_per_seq, paged):
    """(row, page) coordinates (s32) of copy p of key block j: the page from the block table
    (a paged cache) or the sequence's own (a contiguous one); page -1 (zeros, nothing read)
    for a copy that starts past the length."""
    key0 = k.let(f"key{p}", j * BN + p * box)
    page = k.let(f"page{p}", b.to(s32))
    row = k.let(f"row{p}", key0.to(s32))
    with k.if_(paged != 0):
        slot = k.min(key0 / page_size, pages_per_seq - 1)
        k.assign(page, table[b * pages_per_seq + slot])
        k.assign(row, (key0 % page_size).to(s32))
    k.assign(page, k.select(key0 < n, page, -1))
    return row, page


def q_loads(k, d: int, q, t, at: Place, rows, group, seq, heads) -> list:
    """This thread's share of the Q tile at `at`, 16 bytes a load: load i is row r, columns
    c .. c + 7 (`q_cell`); row R of the tile is token R / group of query head kvh * group +
    R % group (rows past the real ones repeat the last)."""
    out = []
    for i in range(BM * d // 8 // 128):
        r, c = q_cell(k, d, t, i)
        real = k.min(at.mt * BM + r, rows - 1)
        out.append(k.vload(q[((at.b * seq + real / group) * heads + at.kvh * group
                              + real % group) * d + c], 8))
    return out


def q_cell(k, d: int, t, i: int) -> tuple[Any, Any]:
    chunks = d // 8
    return (i * 128 + t) / chunks, (i * 128 + t) % chunks * 8


def store_q(k, d: int, qs, qn: list, t) -> None:
    """The loaded Q share into the tile, visible to the warpgroup's wgmmas."""
    for i, v in enumerate(qn):
        r, c = q_cell(k, d, t, i)
        qs[c / 64, r, c % 64] = v
    k.fence_proxy_async()
    k.bar_sync(8, 128)


def softmax(k, s, mx, l, fac, scale_log2) -> None:  # noqa: E741
    """Update the rows' running max and sum with block scores s and turn s into P; fac: the
    factor that brings O to the new max. A row whose keys are all masked so far keeps max
    NEG and P = 0 (its shift is 0, not NEG)."""
    with k.for_("i", 0, 2, unroll=True) as i:
        m = k.let("m", mx[i])
        with k.for_("jj", 0, 16, unroll=True) as jj:
            k.assign(m, k.max(m, k.max(s[4 * jj + 2 * i], s[4 * jj + 2 * i + 1])))
        k.assign(m, k.max(m, k.shfl_xor(m, 1)))
        k.assign(m, k.max(m, k.shfl_xor(m, 2)))
        fac[i] = k.ex2((mx[i] - m) * scale_log2)
        mx[i] = m
        ms = k.let("ms", k.select(m == NEG, 0.0, m * scale_log2))
        total = k.let("sum", 0.0)
        with k.for_("jj", 0, 16, unroll=True) as jj:
            with k.for_("e", 0, 2, unroll=True) as e:
                x = 4 * jj + 2 * i + e
                s[x] = k.ex2(k.fma(s[x], scale_log2, -ms))
                k.assign(total, total + s[x])
        l[i] = k.fma(l[i], fac[i], total)


def store(k, d: int, acc, l, o, b, kvh, mt, row, col, rows, group, seq, heads) -> None:  # noqa: E741
    """O from the accumulators divided by the rows' sums (0 for a row that saw no key):
    thread rows row and row + 8 of the tile, two adjacent columns per 8-column group."""
    for i in range(2):
        inv = k.let(f"inv{i}", k.select(l[i] > 0.0, k.rcp(l[i]), 0.0))
        r = k.let(f"orow{i}", mt * BM + row + 8 * i)
        with k.if_(r < rows):
            at = k.let(f"oat{i}", ((b * seq + r / group) * heads + kvh * group + r % group) * d
                       + col)
            with k.for_(f"oj{i}", 0, d // 8, unroll=True) as jj:
                o[at + jj * 8] = k.bf16x2((acc[4 * jj + 2 * i] * inv).to(bf16),
                                          (acc[4 * jj + 2 * i + 1] * inv).to(bf16))


decode_attention = make_decode_attention()  # the family's default build: contiguous, d 128


def box_for(page_size: int | None) -> int:
    """Keys a copy for pages of `page_size` keys (None: a contiguous cache)."""
    return BN if page_size is None else min(page_size, BN)


def row_tiles(seq: int, group: int) -> int:
    """64-row tiles of the S x group packed rows."""
    return -(-seq * group // BM)


def pick_splits(batch: int, kv_heads: int, tiles: int, capacity: int, sms: int = SMS) -> int:
    """Splits per sequence that give the SMs one item each, not more (a CTA takes an SM's
    shared memory: a 17th split of 8 heads would make 4 CTAs walk a second item), for
    sequences as long as the capacity (each split at least MIN_BLOCKS blocks of it)."""
    items = batch * kv_heads * tiles
    return max(1, min(sms // items, -(-capacity // BN) // MIN_BLOCKS))


def launch_grid(batch: int, kv_heads: int, tiles: int, splits: int, sms: int = SMS) -> int:
    """One CTA per work item, at most one per SM (a CTA walks its items in turn)."""
    return min(batch * kv_heads * tiles * splits, sms)


def workspace(batch: int, kv_heads: int, tiles: int, splits: int, d: int) -> tuple[int, int]:
    """(f32 elements of the workspace, u32 semaphores) of a launch, at least one of each."""
    items = batch * kv_heads * tiles
    return (items * splits * slot_floats(d) if splits > 1 else 1), items


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, lens: np.ndarray, causal: bool,
              scale: float) -> np.ndarray:
    """O in float64 for float Q (B, S, H, D) and contiguous K, V (B, S_max, KVH, D): sequence
    b sees its first lens[b] keys, new token t up to key lens[b] - S + t when causal; a row
    that sees no key is zero."""
    bsz, sq, h, d = q.shape
    group = h // k.shape[2]
    out = np.zeros(q.shape, np.float64)
    for bi in range(bsz):
        n = int(lens[bi])
        kk = np.repeat(k[bi, :n].astype(np.float64), group, axis=1)  # (n, H, D)
        vv = np.repeat(v[bi, :n].astype(np.float64), group, axis=1)
        s = np.einsum("thd,khd->htk", q[bi].astype(np.float64), kk) * scale
        if causal:
            see = np.arange(n)[None, :] <= (n - sq + np.arange(sq))[:, None]
            s = np.where(see[None], s, -np.inf)
        mx = s.max(-1, keepdims=True, initial=-np.inf)
        e = np.exp(s - np.where(np.isfinite(mx), mx, 0.0))
        total = e.sum(-1, keepdims=True)
        o = np.einsum("htk,khd->htd", e, vv) / np.where(total > 0, total, 1.0)
        out[bi] = o.transpose(1, 0, 2)
    return out


def example(rng: np.random.Generator, batch: int = 2, seq: int = 1, heads: int = 4,
            kv_heads: int = 1, d: int = 64, lens: tuple[int, ...] = (5, 200),
            page_size: int | None = None, capacity: int = 256, causal: bool = True,
            splits: int | None = None, grid: int | None = None) -> dict:
    """Random bf16 Q and cache; the cache past each length holds NaN (what an unwritten
    page may hold), so a kernel that lets it into O fails. `page_size`: a paged cache (pages
    shuffled, capacity / page_size per sequence, one spare) or None (contiguous, S_max =
    capacity)."""
    from ptxdsl.runtime.dtypes import bf16_to_f32, f32_to_bf16

    group = heads // kv_heads
    tiles = row_tiles(seq, group)
    splits = splits or pick_splits(batch, kv_heads, tiles, capacity)
    shape = (batch, seq, heads, d)
    q = f32_to_bf16(rng.standard_normal(shape, np.float32))
    kc = f32_to_bf16(rng.standard_normal((batch, capacity, kv_heads, d), np.float32))
    vc = f32_to_bf16(rng.standard_normal((batch, capacity, kv_heads, d), np.float32))
    n = np.array(lens, np.int32)
    scale = 1.0 / math.sqrt(d)
    seen = np.clip(n, 0, capacity)  # what the kernel clamps the lengths to
    ref = reference(bf16_to_f32(q), bf16_to_f32(kc), bf16_to_f32(vc), seen, causal, scale)
    for bi in range(batch):  # stale cache rows: NaN
        kc[bi, seen[bi]:] = 0x7FC0
        vc[bi, seen[bi]:] = 0x7FC0
    box = box_for(page_size)
    if page_size is None:
        kmap, vmap, table, per = kc, vc, np.zeros(1, np.int32), 1
    else:
        per = capacity // page_size
        order = rng.permutation(batch * per + 1)[: batch * per]  # one page never used
        pages = batch * per + 1
        kmap = np.full((pages, page_size, kv_heads, d), 0x7FC0, np.uint16)
        vmap = kmap.copy()
        kmap[order] = kc.reshape(batch * per, page_size, kv_heads, d)
        vmap[order] = vc.reshape(batch * per, page_size, kv_heads, d)
        table = order.reshape(batch, per).astype(np.int32)
    size, nsem = workspace(batch, kv_heads, tiles, splits, d)
    tm = {"box": (1, box, 1, 64), "swizzle": "128B"}
    return {"grid": grid or launch_grid(batch, kv_heads, tiles, splits),
            "inputs": {"q": q, "kc": kmap, "vc": vmap, "lens": n, "table": table,
                       "ws": np.zeros(size, np.float32), "sem": np.zeros(nsem, np.uint32),
                       "seq": seq, "heads": heads, "kv_heads": kv_heads, "batch": batch,
                       "capacity": capacity, "page_size": page_size or capacity,
                       "pages_per_seq": per, "paged": int(page_size is not None),
                       "causal": int(causal), "splits": splits,
                       "scale_log2": np.float32(scale * math.log2(math.e))},
            "tensor_maps": {"kc": tm, "vc": tm},
            "outputs": {"o": np.zeros(shape, np.uint16)},
            "expected": {"o": ref, "sem": np.zeros(nsem, np.uint32)},
            "rtol": 2 ** -6, "atol": 2 ** -6}


FAMILY = Family(
    name="decode_attention",
    summary="split-KV (flash-decoding) attention for 1-16 new tokens against a paged or "
            "contiguous bf16 KV cache, GQA heads packed into the tile's rows",
    factory=make_decode_attention,
    defaults={"d": 128, "box": 128},
)
