"""FlashAttention-style forward pass with the Python API (twin of attention.ptxdsl).

O = softmax(Q K^T * scale) V for bf16 Q (B x H x S x D), K and V (B x KVH x S_kv x D), O like
Q, and the f32 log-sum-exp (B x H x S); causal masks align to the end (decode: S = 1).
`make_attention(d, causal)` builds it for head dim 64 or 128, causal or not; the module-level
kernel is the text file's default (d = 128, non-causal). The structure (one producer warp,
two or three consumer warpgroups of 64 query rows, the next block's S = Q K^T issued before
P V of the current one, P handed to wgmma from registers with frag(p, k), the wait for P V
held after the softmax with fence_cta(), the warpgroups optionally taking turns with
`k.turn()`) is described in attention.ptxdsl."""

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

import ptxdsl
from ptxdsl import array, bf16, f32, ptr, s32, tmap, u32
from ptxdsl.kernels.family import Family

from .params import kernel_of
from .wgmma import consumer_lanes

BN = 128  # keys per block (a tile has 64 query rows per consumer warpgroup: block_rows)
NEG = -1.0e30  # the score of a masked column: exp2 of it minus any real maximum is 0
EMPTY = -1.0e29  # the least max a window build subtracts: exp2 of NEG minus it is 0 too
LN2 = 0.6931471805599453


class Lengths(NamedTuple):
    """A tile's sequence: its query rows and keys, its key blocks, `off` (the causal build's
    kv_seq - seq) and, varlen, its first query row and key in the packed tensors."""

    seq: Any
    kv_seq: Any
    nkv: Any
    off: Any = None
    q0: Any = None
    k0: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Softmax:
    """A build's online softmax of one key block (its scores S in a consumer's registers,
    the accumulator layout of m64n128): the mask, the rows' maxima and sums, S turned into
    P in f32."""

    bm: int  # query rows of a tile
    causal: int  # 1: the causal mask (aligned to the end)
    plain: bool  # one length, no window: the pinned builds' masks
    lazy: int  # 1: a row's max moves only when it grows by more than 2^8
    offset: float = 0.0  # P is scaled by 2^offset (fp8: e4m3's normal range holds P)

    def __call__(self, k, s, mx, l, fac, c0, j, mb, r0, sq, scale_log2,  # noqa: E741
                 first: bool, win=None, cap=None) -> None:
        """Mask block j's scores, update the row maxima and sums, and turn S into P (f32).
        `sq`: the tile's Lengths; `win`: the window build's (left, right) bounds; `cap`: the
        softcap build's cap_scale."""
        bm, cz, plain = self.bm, self.causal, self.plain
        if cap is not None:  # capped before the mask: a masked score stays NEG
            with k.for_("x", 0, 64, unroll=True) as x:
                s[x] = k.tanh(s[x] * cap)
        if plain:
            edge = (c0 + 128 > sq.kv_seq) | (cz != 0) & (mb * bm + sq.off < j * 128 + 127)
        else:
            edge = c0 + 128 > sq.kv_seq
        if win is not None:  # some row's window ends before the block's end, or starts
            # after its start (row r's diagonal key, r + kv_seq - seq, kept off u32's wrap)
            edge = edge | (mb * bm + sq.kv_seq + win[1] < j * 128 + 127 + sq.seq) | \
                (j * 128 + win[0] + sq.seq < mb * bm + (bm - 1) + sq.kv_seq)
        with k.if_(edge):
            with k.for_("jj", 0, 16, unroll=True) as jj:
                with k.for_("e", 0, 4, unroll=True) as e:
                    cc = k.let("cc", c0 + jj * 8 + e % 2)
                    if plain:
                        masked = k.let("masked", (cc >= sq.kv_seq) |
                                       (cz != 0) & (cc > r0 + e / 2 * 8 + sq.off))
                    elif win is None:
                        masked = k.let("masked", cc >= sq.kv_seq)
                    else:  # the row's diagonal key: rr + kv_seq - seq
                        rr = r0 + e / 2 * 8 + sq.kv_seq
                        masked = k.let("masked", (cc >= sq.kv_seq) |
                                       (cc + sq.seq > rr + win[1]) | (cc + sq.seq + win[0] < rr))
                    s[4 * jj + e] = k.select(masked, NEG, s[4 * jj + e])
        with k.for_("i", 0, 2, unroll=True) as i:
            m = k.let("m", NEG if first else mx[i])
            with k.for_("jj", 0, 16, unroll=True) as jj:
                k.assign(m, k.max(m, k.max(s[4 * jj + 2 * i], s[4 * jj + 2 * i + 1])))
            k.assign(m, k.max(m, k.shfl_xor(m, 1)))
            k.assign(m, k.max(m, k.shfl_xor(m, 2)))
            if not first:
                with k.if_(self.lazy != 0):  # the max moves only by more than 2^8
                    k.assign(m, k.select((m - mx[i]) * scale_log2 > 8.0, m, mx[i]))
                fac[i] = k.ex2((mx[i] - m) * scale_log2)
            mx[i] = m
            top = m if first else mx[i]
            if not plain:  # a row whose keys so far are all masked: P = 0, not 2^(NEG - NEG)
                top = k.max(top, EMPTY)
            ms = k.let("ms", top * scale_log2 - self.offset if self.offset else top * scale_log2)
            total = k.let("sum", 0.0)
            with k.for_("jj", 0, 16, unroll=True) as jj:
                with k.for_("e", 0, 2, unroll=True) as e:
                    x = 4 * jj + 2 * i + e
                    s[x] = k.ex2(k.fma(s[x], scale_log2, -ms))
                    k.assign(total, total + s[x])
            l[i] = total if first else k.fma(l[i], fac[i], total)


class Walk(NamedTuple):
    """The persistent walk over the tiles (query block, batch x head): `ntiles` of them,
    `group` query heads a KV head, `pair` tiles a unit of work, `nunits` units."""

    ntiles: Any
    group: Any
    pair: Any
    nunits: Any


def walk(k, mblocks, batch, heads, kv_heads, causal: int) -> Walk:
    """The walk over `mblocks` query blocks of each batch x head: a head's query blocks go
    in the order last, first, last - 1, second, ... (walk_tile); causal, a CTA takes a long
    and a short one at a time, so that every CTA's share comes out even."""
    nbh = k.let("nbh", batch * heads)
    ntiles = k.let("ntiles", mblocks * nbh)
    group = k.let("group", heads / kv_heads)
    pair = k.let("pair", k.select((causal != 0) & (ntiles >= 2 * k.nctaid.x), 2, 1))
    return Walk(ntiles=ntiles, group=group, pair=pair,
                nunits=k.let("nunits", (ntiles + pair - 1) / pair))


@contextlib.contextmanager
def walk_tiles(k, wk: Walk, mblocks) -> Iterator[tuple[Any, Any]]:
    """Inside the loops over this CTA's units of the walk and each unit's tiles: the tile's
    (query block, batch x head)."""
    with k.for_("w", k.ctaid.x, wk.nunits, k.nctaid.x) as w:
        with k.for_("t", w * wk.pair, k.min(w * wk.pair + wk.pair, wk.ntiles)) as t:
            yield walk_tile(k, t, mblocks)


def walk_tile(k, t, mblocks) -> tuple[Any, Any]:
    """(query block, batch x head) of the walk's t-th tile (odd heads of an odd count of
    query blocks start with the middle one)."""
    bh = k.let("bh", t / mblocks)
    odd = (mblocks % 2 == 1) & (bh % 2 == 1)
    u = k.let("u", (t % mblocks + k.select(odd, mblocks - 1, 0)) % mblocks)
    return k.let("mb", k.select(u % 2 == 0, mblocks - 1 - u / 2, u / 2)), bh


def causal_stop(k, mb, sq: Lengths, bm: int, causal: int) -> Any:
    """The stop of the key blocks query block mb reads in a build of one length: causal, up
    to its last row's diagonal; else all of them."""
    return k.let("nblocks", k.select(causal != 0, k.min((mb * bm + (bm - 1) + sq.off) / 128 + 1,
                                                        sq.nkv), sq.nkv))


def store_o(k, o, acc, fac, os_, mb, bh, heads, lanes, bm: int, d: int) -> None:
    """A consumer warpgroup's 64 rows of O (acc times the row factors fac) into o through its
    swizzled staging tile os_[wg] and TMA stores of 64 columns each, left in flight."""
    wg, leader, row, col = lanes
    with k.if_(leader):
        k.bulk_wait_read(0)
    k.bar_sync(8 + wg, 128)
    with k.for_("jj", 0, d // 8, unroll=True) as jj:
        with k.for_("i", 0, 2, unroll=True) as i:
            os_[wg, jj / 8, row + i * 8, jj % 8 * 8 + col] = k.bf16x2(
                (acc[4 * jj + 2 * i] * fac[i]).to(bf16),
                (acc[4 * jj + 2 * i + 1] * fac[i]).to(bf16))
    k.fence_proxy_async()
    k.bar_sync(8 + wg, 128)
    with k.if_(leader):
        with k.for_("h", 0, d // 64, unroll=True) as h:
            k.tma_store(o, [(h * 64).to(s32), (mb * bm + wg * 64).to(s32),
                            (bh % heads).to(s32), (bh / heads).to(s32)], os_[wg, h])
        k.bulk_commit()


def make_attention(d: int = 128, causal: bool = False, pingpong: bool = False,
                   stages: tuple[int, int] = (2, 2), hold: bool = True,
                   nwg: int = 2, lazy: bool | None = None,
                   window: bool = False, varlen: bool = False,
                   softcap: bool = False) -> ptxdsl.KernelDef:
    """The forward kernel for head dim `d` (64 or 128), with the causal mask or without;
    `pingpong`: the consumer warpgroups take turns issuing their wgmmas (default: no, it
    no longer pays). `stages`: of the K and the V pipeline. `hold`: a fence_cta() keeps the
    wait for P V after the softmax (default: yes). `nwg`: consumer warpgroups (2,
    or 3 at head dim 64), 64 query rows each: a tile is 64 nwg rows (`block_rows`). `lazy`:
    a row's max moves only when it grows by more than 2^8, so O is rarely rescaled (default:
    at head dim 128, where it pays).

    `window`: sliding-window (local) attention, the window given at launch (`window_left`,
    `window_right`, u32 parameters last): query row r sees keys r + off - window_left ..
    r + off + window_right, off = kv_seq - seq (the diagonal aligned to the end, as the
    causal mask), a bound of kv_seq or more being none; a query tile reads only the key
    blocks its rows' windows reach and masks the blocks a window's edge crosses; a row that
    sees no key gets O = 0. Causal attention is the window (kv_seq, 0), so a window build is
    not also causal.

    `varlen`: packed sequences of different lengths (FlashAttention's varlen layout): Q
    (total_q, H, D), K and V (total_k, KVH, D) through 3-D tensor maps, sequence b's rows
    cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 and keys likewise (int32, B + 1 each, read
    on the GPU); `seq` is the longest sequence's query rows (the walk's blocks a head), O a
    contiguous (total_q, H, D) written row by row where a tile's rows are its sequence's,
    the LSE (H, total_q). Tiles never cross a sequence's end: a query block past its
    sequence's rows is skipped, keys past its keys are masked. Causal is the window.

    `softcap`: the scores capped before the softmax as FlashAttention's softcap does,
    s -> softcap tanh(s scale / softcap): an f32 `cap_scale` = scale / softcap (the last
    parameter), and scale_log2 = softcap log2 e (the capped scores are in units of the
    cap)."""
    if d not in (64, 128):
        raise ValueError(f"make_attention: head dim is 64 or 128, not {d}")
    if (window or varlen) and causal:
        raise ValueError("make_attention: a window or varlen build takes the causal mask as "
                         "the window (kv_seq, 0); it is not also causal")
    if nwg not in (2, 3) or nwg == 3 and d != 64:
        raise ValueError(f"make_attention: 2 consumer warpgroups, or 3 at head dim 64; not "
                         f"{nwg} at {d}")
    bm = block_rows(nwg)
    pp = bool(pingpong)
    hd = int(hold)
    hb = d // 64  # 64-wide column blocks of a tile (a 128-byte swizzle row each)
    cz = int(causal)
    lz = int(d == 128 if lazy is None else lazy)
    plain = not (window or varlen)  # the pinned builds: the causal mask or none, one length
    softmax = Softmax(bm=bm, causal=cz, plain=plain, lazy=lz)
    name = "attention" if (d, cz, pp, stages, hd, lz, plain) == \
        (128, 0, False, (2, 2), True, 1, True) else \
        f"attention_d{d}{'_causal' if cz else ''}{'_pp' if pp else ''}" + \
        ("" if stages == (2, 2) else f"_s{stages[0]}{stages[1]}") + ("_hold" if hd else "") + \
        ("" if nwg == 2 else f"_w{nwg}") + ("" if lz == (d == 128) else f"_lazy{lz}") + \
        ("_window" if window else "") + ("_varlen" if varlen else "") + \
        ("_softcap" if softcap else "")

    def to_bf16(k, s, p) -> None:
        with k.for_("x", 0, 64, unroll=True) as x:
            p[x] = s[x].to(bf16)

    def body(k, a: dict) -> None:
        """The kernel, its parameters by name in `a` (K's map is a["k"]; k is the context)."""
        q, kt, v = a["q"], a["k"], a["v"]
        seq, heads, kv_heads, batch = a["seq"], a["heads"], a["kv_heads"], a["batch"]
        win = (a["window_left"], a["window_right"]) if window else None
        qp = k.pipeline("qp", 1, q=(bf16, [hb, bm, 64], 1024, 128))
        kp = k.pipeline("kp", stages[0], k=(bf16, [hb, BN, 64], 1024, 128))
        vp = k.pipeline("vp", stages[1], v=(bf16, [hb, BN, 64], 1024, 128, "mn"))
        if not varlen:  # varlen stores O from registers: a tile may end inside the map
            os_ = k.shared("os", bf16, [nwg, hb, 64, 64], align=1024, swizzle=128)
        mblocks = k.let("mblocks", (seq + (bm - 1)) / bm)
        if not varlen:
            kv_seq = a["kv_seq"]
            lengths = Lengths(seq=seq, kv_seq=kv_seq, nkv=k.let("nkv", (kv_seq + 127) / 128),
                              off=k.let("off", kv_seq - seq) if plain else None)

        def sequence(bh) -> Lengths:
            """varlen: the lengths and first row and key of tile bh's sequence (at least one
            key block, all masked where it has no key, so that O is 0)."""
            b = k.let("b", bh / heads)
            q0 = k.let("q0", a["cu_seqlens_q"][b].to(u32))
            k0 = k.let("k0", a["cu_seqlens_k"][b].to(u32))
            n = k.let("nq", a["cu_seqlens_q"][b + 1].to(u32) - q0)
            nk = k.let("nk", a["cu_seqlens_k"][b + 1].to(u32) - k0)
            return Lengths(seq=n, kv_seq=nk, nkv=k.let("nkv", k.max((nk + 127) / 128, 1)),
                           q0=q0, k0=k0)

        def kv_blocks(mb, sq):
            """The first and the stop of the key blocks query block mb reads (causal: up to
            its last row's diagonal; a window: from its first row's left edge to its last
            row's right edge, at least one)."""
            if plain:
                return 0, causal_stop(k, mb, sq, bm, cz)
            if win is None:
                return 0, sq.nkv
            lo = k.let("lo", mb * bm + sq.kv_seq)  # the first row's diagonal key + seq
            hi = k.let("hi", lo + (bm - 1) + win[1])  # the last row's last key + seq
            return (k.let("jlo", k.select(lo > sq.seq + win[0],
                                          (lo - sq.seq - win[0]) / 128, 0)),
                    k.let("jhi", k.min(k.select(hi >= sq.seq, (hi - sq.seq) / 128 + 1, 1),
                                       sq.nkv)))

        def within(mb, sq):
            """varlen: the tile's rows begin inside its sequence (else nothing is loaded): a
            loop of 0 or 1 trips, not an `if`, since the verifier derives the pipelines'
            arrival counts through loops of any trip count but not through branches on
            memory."""
            if not varlen:
                return contextlib.nullcontext()
            return k.for_("live", 0, k.select(mb * bm < sq.seq, 1, 0))

        wk = walk(k, mblocks, batch, heads, kv_heads, cz)
        with k.role("producer", 0, 4, regs=24):
            with k.if_((k.warp == 0) & k.elect()):
                with walk_tiles(k, wk, mblocks) as (mb, bh):
                    qh = k.let("qh", (bh % heads).to(s32))  # coordinates (.., head, batch)
                    if varlen:  # coordinates (.., head, row)
                        sq = sequence(bh)
                    else:
                        sq, bb = lengths, k.let("bb", (bh / heads).to(s32))
                    kvh = k.let("kvh", (bh % heads / wk.group).to(s32))
                    with within(mb, sq):
                        first, stop = kv_blocks(mb, sq)
                        k.acquire(qp)
                        with k.for_("h", 0, hb, unroll=True) as h:
                            k.tma_load(qp.q[h], q, [(h * 64).to(s32), qh,
                                                    (sq.q0 + mb * bm).to(s32)] if varlen
                                       else [(h * 64).to(s32), (mb * bm).to(s32), qh, bb])
                        k.commit(qp)
                        with k.for_("j", first, stop) as j:
                            for pipe, buf, tm in ((kp, "k", kt), (vp, "v", v)):
                                k.acquire(pipe)
                                with k.for_("h", 0, hb, unroll=True) as h:
                                    k.tma_load(getattr(pipe, buf)[h], tm, [
                                        (h * 64).to(s32), kvh, (sq.k0 + j * 128).to(s32)]
                                        if varlen else [(h * 64).to(s32), (j * 128).to(s32),
                                                        kvh, bb])
                                k.commit(pipe)
        with k.role("consumer", 4, 4 + 4 * nwg, regs=240 if nwg == 2 else 160):
            wg, leader, row, col = consumer_lanes(k)
            with walk_tiles(k, wk, mblocks) as (mb, bh):
                sq = sequence(bh) if varlen else lengths
                with within(mb, sq):
                    consume(k, a, mb, bh, sq, kv_blocks(mb, sq), (wg, leader, row, col),
                            (qp, kp, vp), None if varlen else os_, win)
            if not varlen:
                with k.if_(leader):
                    k.bulk_wait(0)

    def consume(k, a, mb, bh, sq, blocks, lanes, pipes, os_, win) -> None:
        """A consumer warpgroup's tile: its 64 rows of O over key blocks `blocks` (first,
        stop), stored through os_ by TMA, or (varlen: os_ None) row by row from registers."""
        (first, stop), (wg, _, row, col), (qp, kp, vp) = blocks, lanes, pipes
        scale_log2, heads = a["scale_log2"], a["heads"]
        r0 = k.let("r0", mb * bm + wg * 64 + row)
        s = k.let("s", type=array(f32, 64))
        p = k.let("p", type=array(bf16, 64))
        acc = k.let("acc", type=array(f32, d // 2))
        mx = k.let("mx", type=array(f32, 2))
        l = k.let("l", type=array(f32, 2))  # noqa: E741
        fac = k.let("fac", type=array(f32, 2))

        def qk() -> None:
            """S = Q K_j^T, issued as one group."""
            k.wgmma_fence()
            with k.for_("kk", 0, d // 16, unroll=True) as kk:
                k.wgmma(s, qp.q[kk / 4, wg * 64, kk % 4 * 16],
                        kp.k[kk / 4, 0, kk % 4 * 16], kk > 0)
            k.wgmma_commit()

        def pv(accumulate) -> None:
            """O += P V_j with P from registers, issued as one group."""
            k.wgmma_fence()
            with k.for_("kk", 0, 8, unroll=True) as kk:
                k.wgmma(acc, k.frag(p, kk), vp.v[0, kk * 16, 0], accumulate | (kk > 0))
            k.wgmma_commit()

        k.wait(qp)
        k.wait(kp)
        with k.turn(pp):
            qk()
        k.wgmma_wait(0)
        k.release(kp)
        c0 = col if win is None else k.let("cfirst", first * 128 + col)
        cap = a["cap_scale"] if softcap else None
        softmax(k, s, mx, l, fac, c0, first, mb, r0, sq, scale_log2, True, win, cap)
        to_bf16(k, s, p)
        with k.for_("j", first + 1, stop) as j:
            k.wait(kp)
            k.wait(vp)
            with k.turn(pp):
                qk()
                pv(j > first + 1)
            k.wgmma_wait(1)
            k.release(kp)
            c0 = k.let("c0", j * 128 + col)
            softmax(k, s, mx, l, fac, c0, j, mb, r0, sq, scale_log2, False, win, cap)
            with k.if_(hd != 0):
                k.fence_cta()  # the wait stays after the softmax
            k.wgmma_wait(0)
            k.release(vp)
            with k.if_((lz == 0) | (fac[0] != 1.0) | (fac[1] != 1.0)):
                with k.for_("x", 0, d // 2, unroll=True) as x:
                    acc[x] = acc[x] * fac[x % 4 / 2]
            to_bf16(k, s, p)
        k.wait(vp)
        with k.turn(pp):
            pv(stop > first + 1)
        k.wgmma_wait(0)
        k.release(vp)
        k.release(qp)
        with k.for_("i", 0, 2, unroll=True) as i:
            l[i] = l[i] + k.shfl_xor(l[i], 1)
            l[i] = l[i] + k.shfl_xor(l[i], 2)
            # a row that sees no key (a window, or a sequence without keys) has l = 0: O = 0
            fac[i] = k.rcp(l[i]) if plain else k.select(l[i] > 0.0, k.rcp(l[i]), 0.0)
            with k.if_((k.laneid % 4 == 0) & (r0 + i * 8 < sq.seq)):
                at = (bh % heads * a["total_q"] + sq.q0 if varlen else bh * sq.seq) + r0 + i * 8
                a["lse"][at] = (mx[i] * scale_log2 + k.lg2(l[i])) * LN2
        if varlen:
            with k.for_("i", 0, 2, unroll=True) as i:
                with k.if_(r0 + i * 8 < sq.seq):  # rows past the sequence's are the next's
                    at = k.let("at", ((sq.q0 + r0 + i * 8) * heads + bh % heads) * d + col)
                    with k.for_("jj", 0, d // 8, unroll=True) as jj:
                        a["o"][at + jj * 8] = k.bf16x2(
                            (acc[4 * jj + 2 * i] * fac[i]).to(bf16),
                            (acc[4 * jj + 2 * i + 1] * fac[i]).to(bf16))
            return
        store_o(k, a["o"], acc, fac, os_, mb, bh, heads, lanes, bm, d)

    params = [(x, tmap(bf16, 3 if varlen else 4)) for x in "qkv"] + \
        [("o", ptr(bf16) if varlen else tmap(bf16, 4)), ("lse", ptr(f32))] + \
        ([("cu_seqlens_q", ptr(s32)), ("cu_seqlens_k", ptr(s32)), ("seq", u32),
          ("total_q", u32)] if varlen else [("seq", u32), ("kv_seq", u32)]) + \
        [("heads", u32), ("kv_heads", u32), ("batch", u32), ("scale_log2", f32)] + \
        ([("window_left", u32), ("window_right", u32)] if window else []) + \
        ([("cap_scale", f32)] if softcap else [])

    return kernel_of(body, params, 128 * (nwg + 1), name)


def block_rows(nwg: int = 2) -> int:
    """Query rows of a tile with `nwg` consumer warpgroups (the Q tensor map's box)."""
    return 64 * nwg


attention = make_attention()


def window_mask(seq: int, kv_seq: int, causal: bool = False,
                window: tuple[int, int] = (-1, -1)) -> np.ndarray:
    """The (seq, kv_seq) keys each query row sees: causal, or the window (left, right) in
    keys, -1 unbounded (FlashAttention's window_size), both aligned to the end: row r's
    diagonal is key r + kv_seq - seq."""
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    rel = np.arange(kv_seq)[None, :] - np.arange(seq)[:, None] - (kv_seq - seq)
    return ((left < 0) | (rel >= -left)) & ((right < 0) | (rel <= right))


def scores(q: np.ndarray, k: np.ndarray, causal: bool, scale: float,
           window: tuple[int, int] = (-1, -1), softcap: float = 0.0) -> np.ndarray:
    """The float64 scores Q K^T scale (B, H, S, S_kv) of float Q (B, H, S, D) and K (B, KVH,
    S_kv, D), capped to softcap tanh(s / softcap) where `softcap` > 0, -inf where the
    causal mask or the window (aligned to the end: window_mask) hides the key."""
    k = np.repeat(k, q.shape[1] // k.shape[1], axis=1).astype(np.float64)
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if causal or window != (-1, -1):
        s = np.where(window_mask(*s.shape[-2:], causal, window), s, -np.inf)
    return s


def row_softmax(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(P, LSE) of scores along the last axis; a row of only -inf (it sees no key) gets
    P = 0 and LSE -inf."""
    mx = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(mx), mx, 0.0))
    total = e.sum(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        return e / np.maximum(total, 1e-300), (mx + np.log(total))[..., 0]


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, scale: float,
              window: tuple[int, int] = (-1, -1), softcap: float = 0.0):
    """(O, LSE) in float64 for float Q (B, H, S, D), K and V (B, KVH, S_kv, D); the causal
    mask and the window are aligned to the end, the scores capped by `softcap` > 0
    (scores). A row that sees no key gets O = 0 and LSE -inf."""
    p, lse = row_softmax(scores(q, k, causal, scale, window, softcap))
    v = np.repeat(v, q.shape[1] // k.shape[1], axis=1).astype(np.float64)
    return np.einsum("bhqk,bhkd->bhqd", p, v), lse


def example(rng: np.random.Generator, batch: int = 1, heads: int = 2, kv_heads: int = 1,
            seq: int = 200, d: int = 128, causal: bool = False, grid: int | None = None,
            defines: dict | None = None, kv_seq: int | None = None, nwg: int = 2,
            window: tuple[int, int] | None = None, softcap: float = 0.0) -> dict:
    """Random bf16 Q, K, V; the reference is attention in float64 on the bf16 values.
    `defines` (the text sample's -D D=64 -D CAUSAL=1) override d and causal (the kernel is
    built by the caller; the inputs do not depend on PINGPONG). `kv_seq`: the keys' length
    (default `seq`; at least `seq` when causal). `nwg`: the kernel's consumer warpgroups (its
    tile's query rows, `block_rows`; -D NWG=3). `window`: (left, right) for a window build
    (make_attention(window=True)), -1 unbounded, at least kv_seq keys. `softcap` > 0: for a
    softcap build, the scores capped (cap_scale and scale_log2 as make_attention says)."""
    from ptxdsl.runtime.dtypes import bf16_to_f32, f32_to_bf16

    if defines:
        d = int(str(defines.get("D", d)), 0)
        causal = bool(int(str(defines.get("CAUSAL", int(causal))), 0))
        nwg = int(str(defines.get("NWG", nwg)), 0)
    kv_seq = seq if kv_seq is None else kv_seq
    if (causal or window) and kv_seq < seq:
        raise ValueError(f"causal or windowed attention needs kv_seq >= seq, got {kv_seq} < "
                         f"{seq}")
    shape = (batch, heads, seq, d)
    kv_shape = (batch, kv_heads, kv_seq, d)
    q = f32_to_bf16(rng.standard_normal(shape, np.float32))
    k = f32_to_bf16(rng.standard_normal(kv_shape, np.float32))
    v = f32_to_bf16(rng.standard_normal(kv_shape, np.float32))
    scale = 1.0 / math.sqrt(d)
    ref_o, ref_lse = reference(bf16_to_f32(q), bf16_to_f32(k), bf16_to_f32(v), causal, scale,
                               window or (-1, -1), softcap)
    bm = block_rows(nwg)
    tiles = -(-seq // bm) * batch * heads
    box = {"swizzle": "128B"}
    return {"grid": grid or min(132, tiles),
            "inputs": {"q": q, "k": k, "v": v, "seq": seq, "kv_seq": kv_seq, "heads": heads,
                       "kv_heads": kv_heads, "batch": batch,
                       "scale_log2": np.float32((softcap or scale) * math.log2(math.e)),
                       **({} if window is None else dict(zip(
                           ("window_left", "window_right"), window_bounds(window, kv_seq),
                           strict=True))),
                       **({"cap_scale": np.float32(scale / softcap)} if softcap else {})},
            "tensor_maps": {"q": {"box": (1, 1, bm, 64), **box},
                            "k": {"box": (1, 1, BN, 64), **box},
                            "v": {"box": (1, 1, BN, 64), **box},
                            "o": {"box": (1, 1, 64, 64), **box}},
            "outputs": {"o": np.zeros(shape, np.uint16),
                        "lse": np.zeros(batch * heads * seq, np.float32)},
            "expected": {"o": ref_o, "lse": ref_lse.reshape(-1)},
            "rtol": 2 ** -6, "atol": 2 ** -6}


def window_bounds(window: tuple[int, int], kv_seq: int) -> tuple[int, int]:
    """A window build's window_left and window_right for FlashAttention's window_size
    (left, right), -1 unbounded: kv_seq keys are unbounded (a row's diagonal is a key)."""
    left, right = window
    return (kv_seq if left < 0 else min(left, kv_seq), kv_seq if right < 0 else min(right, kv_seq))


def example_varlen(rng: np.random.Generator, lengths: list[tuple[int, int]], heads: int = 2,
                   kv_heads: int = 1, d: int = 64, nwg: int = 2,
                   window: tuple[int, int] | None = None, grid: int | None = None) -> dict:
    """Random bf16 packed sequences for a varlen build (make_attention(varlen=True), with
    window=True where `window` is given): `lengths` is each sequence's (query rows, keys);
    Q (total_q, heads, d), K and V (total_k, kv_heads, d); the reference is attention in
    float64 per sequence (O = 0 for a sequence without keys), the LSE (heads, total_q)."""
    from ptxdsl.runtime.dtypes import bf16_to_f32, f32_to_bf16

    nq, nk = (np.array([n[i] for n in lengths]) for i in (0, 1))
    cu_q, cu_k = (np.concatenate([[0], np.cumsum(n)]).astype(np.int32) for n in (nq, nk))
    total_q, total_k = int(cu_q[-1]), int(cu_k[-1])
    q = f32_to_bf16(rng.standard_normal((total_q, heads, d), np.float32))
    k, v = (f32_to_bf16(rng.standard_normal((total_k, kv_heads, d), np.float32)) for _ in "kv")
    scale = 1.0 / math.sqrt(d)
    ref_o = np.zeros((total_q, heads, d))
    ref_lse = np.zeros((heads, total_q))
    for b in range(len(lengths)):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if nk[b] == 0:  # queries without keys: O = 0 (FlashAttention's), the LSE -inf
            ref_lse[:, rows] = -np.inf
            continue
        o_b, lse_b = reference(*(bf16_to_f32(x[part]).transpose(1, 0, 2)[None]
                                 for x, part in ((q, rows), (k, keys), (v, keys))),
                               False, scale, window or (-1, -1))
        ref_o[rows], ref_lse[:, rows] = o_b[0].transpose(1, 0, 2), lse_b[0]
    bm = block_rows(nwg)
    seq = int(nq.max())
    box = {"swizzle": "128B"}
    inputs = {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k, "seq": seq,
              "total_q": total_q, "heads": heads, "kv_heads": kv_heads, "batch": len(lengths),
              "scale_log2": np.float32(scale * math.log2(math.e))}
    if window is not None:
        left, right = window_bounds(window, total_k)
        inputs |= {"window_left": left, "window_right": right}
    return {"grid": grid or min(132, -(-seq // bm) * len(lengths) * heads),
            "inputs": inputs,
            "tensor_maps": {"q": {"box": (bm, 1, 64), **box},
                            "k": {"box": (BN, 1, 64), **box},
                            "v": {"box": (BN, 1, 64), **box}},
            "outputs": {"o": np.zeros((total_q, heads, d), np.uint16),
                        "lse": np.zeros(heads * total_q, np.float32)},
            "expected": {"o": ref_o, "lse": ref_lse.reshape(-1)},
            "rtol": 2 ** -6, "atol": 2 ** -6}


SMALL = {"batch": 1, "heads": 2, "kv_heads": 1, "seq": 100, "kv_seq": 190, "grid": 2}


# the benchmarked default configuration (BENCHMARKS.md)
FAMILY = Family(
    name="attention",
    summary="FlashAttention-3-style forward attention, bf16, head dim 64 or 128",
    factory=make_attention,
    defaults={"d": 128, "causal": False, "pingpong": False, "hold": True, "nwg": 2},
    source="attention.ptxdsl",
)
