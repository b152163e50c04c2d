"""GEMM + all-reduce in one launch (a row-parallel linear layer for decoding), with the Python
API: every rank holds A_r (M x K_r activations, M = 1 to 256) and W_r (N x K_r weights), a
K-shard of the layer, and ends with C = sum over ranks r of A_r W_r^T (M x N bf16), the same
bits on every rank.

The main loop is the small-M GEMM's (gemm_smallm.py: swap-AB, C^T = W A^T, `bw`-row weight
tiles, `mp`-row activation tiles, split-K into `splits` ranges of a tile's K steps); only
what happens to a work item's f32 accumulators differs.

- Push: each work item (tile t, K range s) of rank r stores its f32 partial, as the
  accumulator fragments lie in registers (four values a thread at a time, coalesced), into
  slot (r, s) of tile t in every rank's workspace (`ws`: every rank's region back to back, rank
  q's at q * ws_stride elements; its own by a local store, the others' over NVLink), and once
  the warpgroup's stores are in (a named barrier) thread q stores the epoch into rank q's
  flag word for (t, r, s) with release at system scope. Stores only: no load crosses the link
  before the sum, and no atomics.
- Sum: the item of K range 0 of each tile, on every rank, after the CTA has pushed all its
  items, waits (acquire, system scope; a thread a flag word) until every rank's words for the
  tile read the epoch or later, then sums the tile's world x splits slots from its own
  region in slot order, rank-major (rank 0's ranges in K order, then rank 1's, ...), in f32
  from zero, rounds once to bf16 and stores C (masked at the M and N edges). Every rank reads
  the same slots and adds them in the same order, so every rank stores the same bits.

Waiting only after pushing every item means no CTA waits for a work item that sits behind a
wait: with every CTA resident (the grid is at most one CTA an SM, and a CTA takes most of
shared memory) every push happens, so every wait ends.

Reuse across launches without a reset is all_reduce.py's: flags hold epochs (the launch
count, compared as a signed difference, never cleared), and the slots are double-buffered by
the epoch's parity. Rank q's launch e + 2 writes rank p's slots of parity e % 2 only after
q's launch e + 1 ended, in which q's sum of every tile saw p's pushes of launch e + 1; p
pushes only after `griddep_wait`, so after its launch e (which read those slots) ended.

Traffic: a rank sends each of its world - 1 peers splits x N x (M rounded up to an even
number, past 8: to mp) f32 (a thread's vector of the partial holds two adjacent rows of C, so
a vector wholly past M is not sent), against bf16 M x N for a one-shot all-reduce of C: the
host keeps splits small as mp grows (`pick_splits`)."""

from typing import Any

import numpy as np

import ptxdsl
from ptxdsl import array, bf16, f32, ptr, s32, tmap, u32, u64
from ptxdsl.kernels.family import Family

from . import gemm_smallm as sm
from .wgmma import consumer_lanes, load_stage, main_loop


def make_gemm_allreduce(mp: int = 8, bw: int = 128, stages: int | None = None,
                        consumer_regs: int = 232) -> ptxdsl.KernelDef:
    """The kernel for activation tiles of `mp` rows (8 to 256, a multiple of 8) and weight
    tiles of `bw` rows (64, 128 or 256, as gemm_smallm.make_smallm takes them), with a
    `stages`-deep TMA ring (default: as deep as shared memory allows)."""
    if mp % 8 or not 8 <= mp <= 256:
        raise ValueError(f"make_gemm_allreduce: mp is a multiple of 8 from 8 to 256, got {mp}")
    if bw not in (64, 128, 256):
        raise ValueError(f"make_gemm_allreduce: bw is 64, 128 or 256, got {bw}")
    if mp > sm.max_mp(bw):
        raise ValueError(f"make_gemm_allreduce: with bw {bw} the accumulators fit registers "
                         f"for mp up to {sm.max_mp(bw)}, got mp {mp}")
    stages = stages or sm.stages_for(bw, mp)
    consumers = min(bw // 64, 2)
    wm = bw // consumers  # weight rows per consumer warpgroup
    mw = wm // 64  # its m64 accumulators
    nacc = mp // 2  # f32 per thread of an m64 x mp C^T accumulator
    plane = 64 * mp  # f32 of one m64 block's slot
    block = mw * plane  # f32 of a warpgroup's slot
    unroll = max(1, min(4, 128 // (mw * nacc)))  # slots summed at a time: loads in flight
    name = f"gemm_allreduce_m{mp}_w{bw}_s{stages}"

    def gemm_allreduce(k, w: tmap(bf16, 2), x: tmap(bf16, 2), c: ptr(bf16), ws: ptr(f32),
                       ws_stride: u64, sig: ptr(u32), sig_stride: u32, rank: u32, world: u32,
                       m: u32, n: u32, kdim: u32, splits: u32, epoch: u32):
        ring = k.pipeline("ring", stages, a=(bf16, [bw, sm.BK], 1024, sm.SWIZZLE),
                          b=(bf16, [mp, sm.BK], 1024, sm.SWIZZLE))
        with k.if_(k.tid.x == 0):  # the descriptors are parameters: fetched while we wait
            k.tma_prefetch_desc(w)
            k.tma_prefetch_desc(x)
        # A is often the grid before's output; and our pushes must wait for our own launch
        # before to end (the slots' parity argument)
        k.griddep_wait()
        ktiles = k.let("ktiles", (kdim + (sm.BK - 1)) / sm.BK)
        tiles_n = k.let("tiles_n", (n + (bw - 1)) / bw)
        tiles_m = k.let("tiles_m", (m + (mp - 1)) / mp)
        work = k.schedule("work", (tiles_n, tiles_m), ksteps=ktiles, splits=splits)
        with k.role("producer", 0, 4, regs=40):
            with k.if_((k.warp == 0) & k.elect()):
                with k.for_("it", work) as it:
                    with k.for_("kt", it.k0, it.k1) as kt:
                        load_stage(k, ring, w, x, (kt * sm.BK).to(s32), [(it.m * bw).to(s32)],
                                   [(it.n * mp).to(s32)])
                        k.commit(ring)
        with k.role("consumer", 4, 4 * (1 + consumers), regs=consumer_regs):
            wg, _, row, col = consumer_lanes(k)
            t = k.let("t", k.tid.x % 128)
            # this launch's half of every region: warpgroup slots of every tile
            half = k.let("half", (epoch % 2) * (tiles_n * tiles_m * consumers))
            names = ["acc" if mw == 1 else f"acc{r}" for r in range(mw)]
            with k.for_("it", work) as it:
                accs = [k.let(nm, type=array(f32, nacc)) for nm in names]
                main_loop(k, ring, accs, wg, it.k0, it.k1, steps=sm.BK // 16, wm=wm)
                push(k, it, accs, ws, ws_stride, sig, sig_stride, rank, world, epoch, half,
                     wg, t, col, m)
            with k.for_("it2", work) as it:
                with k.if_(it.split == 0):
                    accs = [k.let(f"s{nm}", type=array(f32, nacc)) for nm in names]
                    sum_slots(k, it, accs, ws, ws_stride, sig, sig_stride, rank, world, epoch,
                              half, wg, t)
                    store(k, it, accs, c, m, n, wg, row, col)

    def slots_of(k, it, world, half, wg):
        """(this warpgroup's tile and launch half in slot units, the tile's slots)."""
        nslots = k.let("nslots", world * it.splits)
        return k.let("tw", (half + it.tile * consumers + wg) * nslots), nslots

    def push(k, it, accs, ws, ws_stride, sig, sig_stride, rank, world, epoch, half, wg, t,
             col, m):
        """This item's partial into slot (rank, split) of every rank's region; then each
        rank's flag word for it, released once the warpgroup's stores are in. A thread's
        vector v holds columns 8 v + col and 8 v + col + 1 of the activation tile: where
        both lie past M (zero rows of A, never stored into C) it is not sent, so that at M 1
        in an 8-row tile a quarter of the tile crosses the link."""
        tw, nslots = slots_of(k, it, world, half, wg)
        slot = k.let("slot", tw + rank * it.splits + it.split)
        mine = k.let("mine", slot * block + t * 4)
        with k.for_("q", 0, world) as q:
            dst = k.let("dst", q.to(u64) * ws_stride + mine.to(u64))
            for r, acc in enumerate(accs):
                with k.for_(f"v{r}" if r else "v", 0, nacc // 4, unroll=True) as v:
                    with k.if_(it.n * mp + v * 8 + col < m):
                        ws[dst + (v * 512 + r * plane).to(u64)] = k.f32x4(
                            acc[4 * v], acc[4 * v + 1], acc[4 * v + 2], acc[4 * v + 3])
        k.bar_sync(8 + wg, 128)
        flag = k.let("flag", slot - half * nslots)  # flags are not double-buffered
        with k.for_("fq", t, world, 128) as fq:
            k.st_release(sig[fq * sig_stride + flag], epoch, "sys")

    def sum_slots(k, it, accs, ws, ws_stride, sig, sig_stride, rank, world, epoch, half, wg,
                  t):
        """Wait for every rank's pushes of the tile, then its slots summed in order into
        `accs` (columns past M, never pushed, add up stale values that are never stored)."""
        tw, nslots = slots_of(k, it, world, half, wg)
        words = k.let("words", rank * sig_stride + (tw - half * nslots))
        with k.for_("f", t, nslots, 128) as f:
            with k.while_((k.ld_acquire(sig[words + f], "sys") - epoch).to(s32) < 0):
                pass
        k.bar_sync(8 + wg, 128)  # every thread reads what the waiting threads saw
        for r, acc in enumerate(accs):
            with k.for_(f"e{r}" if r else "e", 0, nacc, unroll=True) as e:
                acc[e] = 0.0
        base = k.let("base", rank.to(u64) * ws_stride + (tw * block + t * 4).to(u64))
        with k.for_("s0", 0, nslots, unroll) as s0:
            with k.for_("s", 0, unroll, unroll=True) as sl:
                # past the last slot, read the first again and add nothing (+0.0 leaves a
                # sum from +0.0 unchanged, bit for bit)
                here = k.let("here", s0 + sl < nslots)
                at = k.let("at", base + (k.select(here, s0 + sl, 0) * block).to(u64))
                for r, acc in enumerate(accs):
                    with k.for_(f"q2{r}" if r else "q2", 0, nacc // 4, unroll=True) as q:
                        vv = k.let(f"vv{r}" if r else "vv",
                                   k.vload(ws[at + (q * 512 + r * plane).to(u64)], 4))
                        for e in range(4):
                            acc[4 * q + e] = acc[4 * q + e] + k.select(here, vv[e], 0.0)

    def store(k, it, accs, c, m, n, wg, row, col) -> None:
        """C from the C^T fragments: acc[4 j + 2 i + e] of m64 block r is C^T row (64 r + row
        + 8 i) and column (8 j + col + e) of the warpgroup's rows of the tile."""
        n0 = k.let("n0", it.m * bw + wg * wm + row)
        m0 = k.let("m0", it.n * mp + col)

        def put(gm, gn, v, r, i) -> None:
            c[gm * n + gn] = v.to(bf16)

        sm.store_fragments(k, accs, n0, m0, mp, m, n, put)

    return ptxdsl.kernel(threads=128 * (1 + consumers), name=name)(gemm_allreduce)


gemm_allreduce = make_gemm_allreduce()  # the family's default build: M up to 8, bw 128


# ----------------------------------------------------------------------------- host arithmetic


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pick_splits(m: int, n: int, k: int, bw: int, mp: int, sms: int = sm.SMS) -> int:
    """The small-M GEMM's K ranges a tile (as many as fill the SMs once), at most 128 // mp
    (one for mp of 128 and more): every range's f32 partial crosses the link to every peer,
    mp rows of it, so taller activation tiles take fewer."""
    return max(1, min(sm.pick_splits(m, n, k, bw, mp, sms), 128 // mp))


def ranges(k: int, splits: int) -> int:
    """K ranges a tile has (the schedule's min(splits, K steps))."""
    return max(1, min(splits, cdiv(k, sm.BK)))


def slot_elems(m: int, n: int, bw: int, mp: int) -> int:
    """f32 of one rank's slots of one K range, one launch half: every tile's mp x bw."""
    return cdiv(n, bw) * cdiv(m, mp) * bw * mp


def region_elems(m: int, n: int, k: int, bw: int, mp: int, splits: int, world: int) -> int:
    """f32 of one rank's workspace region: two launch halves of world x ranges slots."""
    return 2 * world * ranges(k, splits) * slot_elems(m, n, bw, mp)


def flag_words(m: int, n: int, k: int, bw: int, mp: int, splits: int, world: int) -> int:
    """u32 flag words of one rank: one per warpgroup of a tile and slot."""
    return cdiv(n, bw) * cdiv(m, mp) * min(bw // 64, 2) * world * ranges(k, splits)


def arguments(w: Any, x: Any, c: Any, ws: Any, ws_stride: int, sig: Any, sig_stride: int,
              rank: int, world: int, m: int, n: int, k: int, splits: int,
              epoch: int) -> dict[str, Any]:
    """The kernel's arguments for launch `epoch` (1, 2, ...; wrapped at 2^32, whose parity
    the slots keep), by parameter name in the kernel's order. `ws` and `sig` are every rank's
    region back to back, `ws_stride` f32 and `sig_stride` words apart."""
    return {"w": w, "x": x, "c": c, "ws": ws, "ws_stride": ws_stride, "sig": sig,
            "sig_stride": sig_stride, "rank": rank, "world": world, "m": m, "n": n, "kdim": k,
            "splits": splits, "epoch": epoch % (1 << 32)}


# ----------------------------------------------------------------------------- interpreter


def fragments(region: np.ndarray, m: int, n: int, bw: int, mp: int, nslots: int,
              half: int) -> np.ndarray:
    """The slots of launch half `half` of one rank's region as partial products: an f32
    array (nslots, m, n) (slot order: rank-major, then K range), each slot's warpgroup blocks
    laid out as the kernel pushes them (thread t's values of accumulator element 4 v + e at
    t * 4 + v * 512 + e, m64 block r at r * 64 mp); rows past m (stale: not pushed) cut off."""
    consumers = min(bw // 64, 2)
    mw = bw // consumers // 64
    tn, tm = cdiv(n, bw), cdiv(m, mp)
    nv = mp // 8
    blocks = region.reshape(2, tn * tm * consumers, nslots, mw, nv, 128, 4)[half]
    t = np.arange(128)
    lane = t % 32
    row = t // 32 * 16 + lane // 4  # C^T row of element e < 2; + 8 for e >= 2
    col = lane % 4 * 2
    out = np.zeros((nslots, tm * mp, tn * bw), np.float32)
    for tile in range(tn * tm):
        tile_n, tile_m = tile % tn, tile // tn  # the schedule's order: tile-rows of N first
        for wg in range(consumers):
            b = blocks[tile * consumers + wg]  # (nslots, mw, nv, 128, 4)
            for r in range(mw):
                for v in range(nv):
                    for e in range(4):
                        gn = tile_n * bw + wg * (bw // consumers) + r * 64 + row + 8 * (e // 2)
                        gm = tile_m * mp + v * 8 + col + e % 2
                        out[:, gm, gn] = b[:, r, v, :, e]
    return out[:, :m, :n]


def reference(partials: np.ndarray) -> np.ndarray:
    """The slots summed in order in f32 from zero, rounded once to bf16 (as uint16 bits)."""
    from ptxdsl.runtime.dtypes import f32_to_bf16

    acc = np.zeros(partials.shape[1:], np.float32)
    for p in partials:
        acc = acc + p
    return f32_to_bf16(acc)


def interp(world: int, m: int = 3, n: int = 72, k: int = 256, *, mp: int = 8, bw: int = 64,
           splits: int = 2, grid: int = 2, epochs: int = 2, seed: int = 0,
           launch: list[int] | None = None, first: int = 1) -> dict:
    """The kernel for `world` ranks at once in the CPU interpreter (`run_ranks`), launched
    `epochs` times on fresh random A_r and W_r (the regions and flags carry over, as on the
    GPU; C is poisoned before each launch): returns each rank's C (bf16 bits) and region, the
    last launch's inputs, the numpy product sum and the flags. `launch`: the ranks that
    launch (default all); `first`: the first launch's epoch (the flags then hold the one
    before)."""
    from ptxdsl.interp import TensorMapModel, run_ranks
    from ptxdsl.runtime.dtypes import bf16_to_f32, f32_to_bf16

    rng = np.random.default_rng(seed)
    size = region_elems(m, n, k, bw, mp, splits, world)
    stride = size + 64  # rank regions a little apart, as the VMM granularity leaves them
    ws = np.full((world, stride), np.nan, np.float32)
    words = flag_words(m, n, k, bw, mp, splits, world)
    sig = np.full((world, words), (first - 1) % (1 << 32), np.uint32)
    kern = make_gemm_allreduce(mp, bw, stages=3).ir
    ranks = list(range(world)) if launch is None else launch
    cs = [np.empty((m, n), np.uint16) for _ in range(world)]
    flat_ws, flat_sig = ws.reshape(-1), sig.reshape(-1)
    box = {"swizzle": "128B", "dtype": "bf16"}
    for i in range(epochs):
        a = f32_to_bf16(rng.standard_normal((world, m, k), np.float32))
        w = f32_to_bf16(rng.standard_normal((world, n, k), np.float32))
        for c in cs:
            c.fill(0xFFFF)
        args = [arguments(TensorMapModel(w[r], (bw, sm.BK), **box),
                          TensorMapModel(a[r], (mp, sm.BK), **box), cs[r], flat_ws, stride,
                          flat_sig, words, r, world, m, n, k, splits, first + i)
                for r in ranks]
        run_ranks(kern, grid, args, seed=seed + i)
    want = sum(bf16_to_f32(a[r]) @ bf16_to_f32(w[r]).T for r in range(world))
    return {"c": cs, "ws": ws[:, :size], "a": a, "w": w, "want": want, "sig": sig,
            "half": (first + epochs - 1) % 2, "nslots": world * ranges(k, splits)}


FAMILY = Family(
    name="gemm_allreduce",
    summary="bf16 decode GEMM + all-reduce in one launch (row-parallel linear): the swap-AB "
            "small-M main loop, f32 partials pushed to every rank, summed in rank order",
    factory=make_gemm_allreduce,
    defaults={"mp": 8, "bw": 128},
)
