"""GEMM + all-reduce in one launch (a row-parallel linear layer for decoding), with the Python
API: every rank holds A_r (M x K_r activations, M = 1 to 256) and W_r (N x K_r weights), a
K-shard of the layer, and ends with C = sum over ranks r of A_r W_r^T (M x N bf16), the same
bits on every rank.

The main loop is the small-M GEMM's (gemm_smallm.py: swap-AB, C^T = W A^T, `bw`-row weight
tiles, `mp`-row activation tiles, split-K into `splits` ranges of a tile's K steps); only
what happens to a work item's f32 accumulators differs. Two paths, by the activation tile:

M up to 8 (mp 8; one crossing of the link, the latency decoding one token waits for):
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
- Traffic: a rank sends each of its world - 1 peers splits x N x (M rounded up to an even
  number) f32 (a thread's vector of the partial holds two adjacent rows of C, so a vector
  wholly past M is not sent): the host keeps splits at most 128 // mp (`pick_splits`).

M past 8 (mp 16 and more; the owner path: bytes matter more than a second crossing). A
thread's part of a warpgroup's slot is nv vectors (four f32: mp / 8 an m64 block). They are
cut two ways into runs of about equal length in vector order (fewer vectors than runs: one
each): into world runs, owned by the ranks in rank order from rank (the warpgroup's tile) %
world, so that ownership turns with the tile and every rank sums and sends its share of C;
and into one share a K range, so that after the main loop every work item of a tile, not
only one, works on it. Each CTA walks its work items four times:
- Home: each item stores its f32 partial into its K range's slot of the tile in this rank's
  own region, then flags it (release, GPU scope).
- To the owners: each item waits for the tile's range flags (acquire, GPU scope), sums the
  ranges' slots in K order in f32 from zero over its share's vectors, rounds them to bf16
  (the rank's product for the tile, as a bf16 GEMM returns it) and stores each vector into
  the rank's slot r of the tile in the vector's owner's `res` region (bf16; NVLink unless
  the owner is this rank); then flags (share, r) at every rank (release, system scope).
- Owners: each item, on every rank, waits for its share's flag from every rank (acquire,
  system scope), sums the vectors of its share that this rank owns over the world slots in
  rank order in f32 from zero, rounds to bf16 and stores them into the tile's result slot
  of every rank's `res` region (its own too), then flags (share, owner) at every rank.
- Copy: each item waits for its share's flag from every owner and copies its share of the
  bf16 result into C (masked at the M and N edges). One rank rounds each element, every
  rank stores its bits.
- Traffic: a rank sends (world - 1) / world of C as bf16 to the owners and the same share
  from them, 4 (world - 1) / world bytes an element of C (a ring all-reduce's), however many
  K ranges: the host takes as many as fill the SMs. The K ranges' f32 slots stay in the
  GPU's own memory.
- Numerics: two roundings, as torch.mm's bf16 output all-reduced by NCCL has (which rounds
  more): C is off the exact sum by about half a bf16 ulp of each rank's product plus half
  an ulp of C. f32 sums would cost half as many bytes again.

No CTA waits for work that sits behind a wait: on the mp 8 path every CTA pushes all its
items before its first wait; on the owner path each walk waits only for stores of the walks
before it (home: none; to the owners: the homes; owners: the to-the-owners; copy: the
owners), and every CTA finishes a walk before it starts the next. With every CTA resident
(the grid is at most one CTA an SM, and a CTA takes most of shared memory) every wait ends,
by induction over the walks.

Reuse across launches without a reset. Flags hold epochs (the launch count, compared as a
signed difference, never cleared). A rank writes slots only after `griddep_wait`, so after
its own launch before ended.
- mp 8 (all_reduce.py's argument): the slots are double-buffered by the epoch's parity. Rank
  q's launch e + 2 writes rank p's slots of parity e % 2 only after q's launch e + 1 ended,
  in which q's sum of every tile saw p's pushes of launch e + 1; p pushes only after
  `griddep_wait`, so after its launch e (which read those slots) ended.
- Owner path: one buffer, every read of a slot happens before the next write to it. The K
  ranges' slots are written and read by their own rank. Rank r writes a share's vectors of
  its slot of tile t at owner p in launch e + 1 after r's launch e ended, in which r's copy
  of that share of tile t waited for p's result flag of the share, which p stored after
  reading those vectors in launch e. Owner p writes a share's vectors of rank r's result
  slot of tile t in launch e + 1 after it saw r's flag of the share of launch e + 1, which r
  stored after its launch e ended, in which r read those vectors."""

from typing import Any

import numpy as np

import ptxdsl
from ptxdsl import array, bf16, f32, ptr, s32, tmap, u32, u64
from ptxdsl.kernels.family import Family
from ptxdsl.types import vector_type

from . import gemm_smallm as sm
from .all_reduce import cdiv
from .wgmma import consumer_lanes, load_stage, main_loop

# Activation tiles of this many rows and more take the owner path; 8-row tiles (M up to 8)
# push every partial to every rank: little data, and one crossing of the link instead of two
OWNERS_FROM = 16
BF16X4 = vector_type(bf16, 4)


def owners(mp: int) -> bool:
    """Whether the kernel for activation tiles of `mp` rows takes the owner path."""
    return mp >= OWNERS_FROM


def make_gemm_allreduce(mp: int = 8, bw: int = 128, stages: int | None = None,
                        consumer_regs: int = 232) -> ptxdsl.KernelDef:
    """The kernel for activation tiles of `mp` rows (8 to 256, a multiple of 8; the owner
    path from OWNERS_FROM) and weight tiles of `bw` rows (64, 128 or 256, as
    gemm_smallm.make_smallm takes them), with a `stages`-deep TMA ring (default: as deep as
    shared memory allows)."""
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
    plane = 64 * mp  # elements of one m64 block's slot
    block = mw * plane  # elements of a warpgroup's slot
    unroll = max(1, min(4, 128 // (mw * nacc)))  # slots summed at a time: loads in flight
    names = ["acc" if mw == 1 else f"acc{r}" for r in range(mw)]
    name = f"gemm_allreduce_m{mp}_w{bw}_s{stages}"

    def body(k, w, x, c, ws, ws_stride, res, res_stride, sig, sig_stride, rank, world, m, n,
             kdim, splits, epoch) -> None:
        ring = k.pipeline("ring", stages, a=(bf16, [bw, sm.BK], 1024, sm.SWIZZLE),
                          b=(bf16, [mp, sm.BK], 1024, sm.SWIZZLE))
        with k.if_(k.tid.x == 0):  # the descriptors are parameters: fetched while we wait
            k.tma_prefetch_desc(w)
            k.tma_prefetch_desc(x)
        # A is often the grid before's output; and our stores into slots must wait for our
        # own launch before to end (the reuse argument)
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

            def fresh(prefix: str) -> list:
                return [k.let(prefix + nm, type=array(f32, nacc)) for nm in names]

            def product(it) -> list:
                accs = fresh("")
                main_loop(k, ring, accs, wg, it.k0, it.k1, steps=sm.BK // 16, wm=wm)
                return accs

            def put(it, accs, vector, send, keep=None) -> None:
                """Each vector of the accumulators, `vector(acc, v)` (a thread's vector v of
                m64 block r: accumulators 4 v to 4 v + 3), sent by `send(r, v, off, value)`
                to element `off` (u64) of a slot past its start and this thread's t * 4;
                with `keep`, only where keep(r, v). Vector v holds columns 8 v + col and
                8 v + col + 1 of the activation tile: where both lie past M (zero rows of A,
                never stored into C) it is not sent, so that at M 1 in an 8-row tile a
                quarter of the tile crosses the link."""
                for r, acc in enumerate(accs):
                    with k.for_(f"v{r}" if r else "v", 0, nacc // 4, unroll=True) as v:
                        live = it.n * mp + v * 8 + col < m
                        with k.if_(live if keep is None else live & keep(r, v)):
                            send(r, v, (v * 512 + r * plane).to(u64), vector(acc, v))

            def into(dst, at):
                """A `send` into the slot at element `at` of `dst` (t * 4 included)."""
                def send(r, v, off, value) -> None:
                    dst[at + off] = value
                return send

            def f32x4(acc, v):
                return k.f32x4(acc[4 * v], acc[4 * v + 1], acc[4 * v + 2], acc[4 * v + 3])

            def bf16x4(acc, v):
                o = k.let("o", type=BF16X4)
                for e in range(4):
                    o[e] = acc[4 * v + e].to(bf16)
                return o

            def signal(word, lo, hi, scope: str) -> None:
                """Once the warpgroup's stores are in (a named barrier), thread t stores the
                epoch into word `word` of rank lo + t's flags, for ranks lo to hi - 1."""
                k.bar_sync(8 + wg, 128)
                with k.for_("fq", lo + t, hi, 128) as fq:
                    k.st_release(sig[fq * sig_stride + word], epoch, scope)

            def wait(words, count, scope: str) -> None:
                """Until this rank's `count` flags from word `words` read the epoch or later
                (a thread a flag); then every thread reads what the waiting threads saw."""
                with k.for_("f", t, count, 128) as f:
                    with k.while_((k.ld_acquire(sig[words + f], scope) - epoch).to(s32) < 0):
                        pass
                k.bar_sync(8 + wg, 128)

            def add(prefix: str, base, count, keep=None, src=None) -> list:
                """`count` slots of this rank's region from slot `base` (slot units) summed
                in order in f32 from zero: of `ws`, or with `src` the bf16 slots of `res`;
                with `keep`, only the vectors where keep(r, v) (the others are left unset).
                Columns past M, never stored, add up stale values that are never stored
                into C."""
                src, stride, vt = (ws, ws_stride, None) if src is None else \
                    (res, res_stride, BF16X4)
                accs = fresh(prefix)
                for r, acc in enumerate(accs):
                    with k.for_(f"e{r}" if r else "e", 0, nacc, unroll=True) as e:
                        acc[e] = 0.0
                at0 = k.let("at0", rank.to(u64) * stride + (base * block + t * 4).to(u64))
                with k.for_("s0", 0, count, unroll) as s0:
                    with k.for_("s", 0, unroll, unroll=True) as sl:
                        # past the last slot, read the first again and add nothing (+0.0
                        # leaves a sum from +0.0 unchanged, bit for bit)
                        here = k.let("here", s0 + sl < count)
                        at = k.let("at", at0 + (k.select(here, s0 + sl, 0) * block).to(u64))
                        for r, acc in enumerate(accs):
                            with k.for_(f"q{r}" if r else "q", 0, nacc // 4, unroll=True) as q:
                                with k.if_(True if keep is None else keep(r, q)):
                                    vv = k.let(f"vv{r}" if r else "vv",
                                               k.vload(src[at + (q * 512 + r * plane).to(u64)],
                                                       4), type=vt)
                                    for e in range(4):
                                        acc[4 * q + e] = acc[4 * q + e] + \
                                            k.select(here, vv[e] if vt is None else
                                                     vv[e].to(f32), 0.0)
                return accs

            def store(it, accs) -> None:
                """C from the C^T fragments: acc[4 j + 2 i + e] of m64 block r is C^T row
                (64 r + row + 8 i) and column (8 j + col + e) of the warpgroup's rows of
                the tile."""
                n0 = k.let("n0", it.m * bw + wg * wm + row)
                m0 = k.let("m0", it.n * mp + col)

                def to_c(gm, gn, v, r, i) -> None:
                    c[gm * n + gn] = v.to(bf16)

                sm.store_fragments(k, accs, n0, m0, mp, m, n, to_c)

            def everyone(work) -> None:
                """M up to 8: every partial to every rank, summed by every rank."""
                # this launch's half of every region: warpgroup slots of every tile
                half = k.let("half", (epoch % 2) * (tiles_n * tiles_m * consumers))
                with k.for_("it", work) as it:
                    accs = product(it)
                    nslots = k.let("nslots", world * it.splits)
                    tw = k.let("tw", (half + it.tile * consumers + wg) * nslots)
                    slot = k.let("slot", tw + rank * it.splits + it.split)
                    at = k.let("at", (slot * block + t * 4).to(u64))
                    with k.for_("q", 0, world) as q:
                        put(it, accs, f32x4, into(ws, q.to(u64) * ws_stride + at))
                    signal(slot - half * nslots, 0, world, "sys")  # flags: not by halves
                with k.for_("it2", work) as it:
                    with k.if_(it.split == 0):
                        nslots = k.let("nslots", world * it.splits)
                        tw = k.let("tw", (half + it.tile * consumers + wg) * nslots)
                        wait(rank * sig_stride + (tw - half * nslots), nslots, "sys")
                        store(it, add("s", tw, nslots))

            def copy(it, at, keep) -> None:
                """The result slot at element `at` of `res` (t * 4 included) into C, the
                vectors where keep(r, v): element 2 i + e of vector j of m64 block r is C^T
                row (64 r + row + 8 i) and column (8 j + col + e) of the warpgroup's rows of
                the tile (as `store`)."""
                n0 = k.let("n0", it.m * bw + wg * wm + row)
                m0 = k.let("m0", it.n * mp + col)
                for r in range(mw):
                    with k.for_(f"j{r}" if r else "j", 0, nacc // 4, unroll=True) as j:
                        with k.if_((m0 + j * 8 < m) & keep(r, j)):  # as `put` sent
                            g = k.let("g", k.vload(res[at + (j * 512 + r * plane).to(u64)], 4),
                                      type=BF16X4)
                            for i in range(2):
                                for e in range(2):
                                    gm, gn = m0 + j * 8 + e, n0 + (r * 64 + i * 8)
                                    with k.if_((gm < m) & (gn < n)):
                                        c[gm * n + gn] = g[2 * i + e]

            def owned(work) -> None:
                """mp from OWNERS_FROM: the K ranges summed at home, each vector of the
                rank's sum in bf16 to its owner, the owners' sums to every rank; each work item
                of a tile takes its share of the tile's vectors in each walk after the
                first."""
                nv = mw * (nacc // 4)  # vectors of a thread's part of a warpgroup's slot

                def places(it):
                    """(the warpgroup's tile tw, its first K-range slot, its first owner slot
                    in `res` (one a rank), the first flag word of the item's share for the ranks'
                    sums (one a rank) and for the owners' results (one an owner), the owner
                    of its first vector); worked out where needed, so that nothing more than
                    the accumulators stays live through the main loop."""
                    tiles = k.let("tiles", tiles_n * tiles_m)
                    tw = k.let("tw", it.tile * consumers + wg)
                    ranges0 = k.let("ranges0", tiles * consumers * it.splits)
                    sums = k.let("sums", ranges0 + (tw * it.splits + it.split) * world)
                    own = k.let("own", tiles * consumers + tw * world)  # in res, past results
                    return (tw, k.let("first", tw * it.splits), own,
                            sums, k.let("done", sums + tiles * consumers * it.splits * world),
                            k.let("rot", tw % world))

                def run(r, v, of):
                    """Which of `of` runs of about nv / of vectors, in order, vector v of m64
                    block r lies in (fewer vectors than runs: one each)."""
                    return (v + r * (nacc // 4)) * of / nv

                def owner(rot, r, v):
                    """The owner of vector v of m64 block r: the ranks own runs in rank
                    order from rank `rot`, which turns with the tile so that every rank owns
                    its share."""
                    ow = k.let("ow", run(r, v, world) + rot)
                    return ow - k.select(ow >= world, world, 0)

                with k.for_("it", work) as it:  # the partial into this rank's region
                    accs = product(it)
                    _, first, _, _, _, _ = places(it)
                    slot = k.let("slot", first + it.split)
                    put(it, accs, f32x4, into(ws, rank.to(u64) * ws_stride +
                                              (slot * block + t * 4).to(u64)))
                    signal(slot, rank, rank + 1, "gpu")
                with k.for_("it2", work) as it:  # the rank's sum, a vector to its owner
                    _, first, own, sums, _, rot = places(it)
                    # the rank's slot of the tile at every owner, worked out before the sum
                    # holds the registers
                    mine = k.let("mine", ((own + rank) * block + t * 4).to(u64))

                    def share(r, v):
                        return run(r, v, it.splits) == it.split

                    def to_owner(r, v, off, value) -> None:
                        res[owner(rot, r, v).to(u64) * res_stride + mine + off] = value

                    wait(rank * sig_stride + first, it.splits, "gpu")
                    put(it, add("r", first, it.splits, share), bf16x4, to_owner, share)
                    signal(sums + rank, 0, world, "sys")
                with k.for_("it3", work) as it:  # each rank: its vectors, to every rank
                    tw, _, own, sums, done, rot = places(it)
                    ours = k.let("ours", (tw * block + t * 4).to(u64))

                    def owned_share(r, v):
                        return (owner(rot, r, v) == rank) & (run(r, v, it.splits) == it.split)

                    def to_all(r, v, off, value) -> None:
                        with k.for_("q", 0, world) as q:
                            res[q.to(u64) * res_stride + ours + off] = value

                    wait(rank * sig_stride + sums, world, "sys")
                    put(it, add("s", own, world, owned_share, res), bf16x4, to_all,
                        owned_share)
                    signal(done + rank, 0, world, "sys")
                with k.for_("it4", work) as it:  # this share of the owners' sums into C
                    tw, _, _, _, done, _ = places(it)
                    wait(rank * sig_stride + done, world, "sys")
                    copy(it, rank.to(u64) * res_stride + (tw * block + t * 4).to(u64),
                         lambda r, v: run(r, v, it.splits) == it.split)

            if res is None:
                everyone(work)
            else:
                owned(work)

    def gemm_allreduce(k, w: tmap(bf16, 2), x: tmap(bf16, 2), c: ptr(bf16), ws: ptr(f32),
                       ws_stride: u64, sig: ptr(u32), sig_stride: u32, rank: u32, world: u32,
                       m: u32, n: u32, kdim: u32, splits: u32, epoch: u32):
        body(k, w, x, c, ws, ws_stride, None, None, sig, sig_stride, rank, world, m, n, kdim,
             splits, epoch)

    def gemm_allreduce_owned(k, w: tmap(bf16, 2), x: tmap(bf16, 2), c: ptr(bf16),
                             ws: ptr(f32), ws_stride: u64, res: ptr(bf16), res_stride: u64,
                             sig: ptr(u32), sig_stride: u32, rank: u32, world: u32, m: u32,
                             n: u32, kdim: u32, splits: u32, epoch: u32):
        body(k, w, x, c, ws, ws_stride, res, res_stride, sig, sig_stride, rank, world, m, n,
             kdim, splits, epoch)

    fn = gemm_allreduce_owned if owners(mp) else gemm_allreduce
    return ptxdsl.kernel(threads=128 * (1 + consumers), name=name)(fn)


gemm_allreduce = make_gemm_allreduce()  # the family's default build: M up to 8, bw 128


# ----------------------------------------------------------------------------- host arithmetic


def pick_splits(m: int, n: int, k: int, bw: int, mp: int, sms: int = sm.SMS) -> int:
    """The small-M GEMM's K ranges a tile (as many as fill the SMs once). On the owner path
    the ranges are summed at home and only a rank's sum crosses the link, so that is all; on
    the other (mp 8) every range's f32 partial crosses the link to every peer, mp rows of it,
    so at most 128 // mp."""
    fill = sm.pick_splits(m, n, k, bw, mp, sms)
    return fill if owners(mp) else max(1, min(fill, 128 // mp))


def ranges(k: int, splits: int) -> int:
    """K ranges a tile has (the schedule's min(splits, K steps))."""
    return max(1, min(splits, cdiv(k, sm.BK)))


def tiles(m: int, n: int, bw: int, mp: int) -> int:
    return cdiv(n, bw) * cdiv(m, mp)


def slot_elems(m: int, n: int, bw: int, mp: int) -> int:
    """Elements of one slot of every tile (a tile's is bw x mp)."""
    return tiles(m, n, bw, mp) * bw * mp


def region_elems(m: int, n: int, k: int, bw: int, mp: int, splits: int, world: int) -> int:
    """f32 of one rank's workspace region: owner path, a slot of every tile for each K range;
    else two launch halves of world x ranges slots of every tile."""
    if owners(mp):
        return ranges(k, splits) * slot_elems(m, n, bw, mp)
    return 2 * world * ranges(k, splits) * slot_elems(m, n, bw, mp)


def result_elems(m: int, n: int, bw: int, mp: int, world: int) -> int:
    """bf16 of one rank's result region (owner path): a slot of every tile for the results,
    then one for each rank (its rounded sum's vectors this rank owns)."""
    return (1 + world) * slot_elems(m, n, bw, mp)


def flag_words(m: int, n: int, k: int, bw: int, mp: int, splits: int, world: int) -> int:
    """u32 flag words of one rank, per warpgroup of a tile: one a slot (mp 8: world x K
    ranges); owner path: one a K range, and for each K range's share of the tile one a
    rank's sum and one an owner's result."""
    per = (1 + 2 * world if owners(mp) else world) * ranges(k, splits)
    return per * tiles(m, n, bw, mp) * min(bw // 64, 2)


def arguments(w: Any, x: Any, c: Any, ws: Any, ws_stride: int, sig: Any, sig_stride: int,
              rank: int, world: int, m: int, n: int, k: int, splits: int, epoch: int,
              res: Any = None, res_stride: int = 0) -> dict[str, Any]:
    """The kernel's arguments for launch `epoch` (1, 2, ...; wrapped at 2^32, whose parity
    the slots keep), by parameter name in the kernel's order. `ws`, `res` (owner path only)
    and `sig` are every rank's region back to back, `ws_stride`, `res_stride` elements and
    `sig_stride` words apart."""
    args = {"w": w, "x": x, "c": c, "ws": ws, "ws_stride": ws_stride}
    if res is not None:
        args |= {"res": res, "res_stride": res_stride}
    return args | {"sig": sig, "sig_stride": sig_stride, "rank": rank, "world": world, "m": m,
                   "n": n, "kdim": k, "splits": splits, "epoch": epoch % (1 << 32)}


# ----------------------------------------------------------------------------- interpreter


def fragments(region: np.ndarray, m: int, n: int, bw: int, mp: int, nslots: int,
              half: int = 0) -> np.ndarray:
    """`nslots` slots of every tile from the start of launch half `half` of one rank's region
    (the mp 8 path's halves; the owner path's K-range slots: half 0) as partial products: an
    f32 array (nslots, m, n), each slot's warpgroup blocks laid out as the kernel stores them
    (thread t's values of accumulator element 4 v + e at t * 4 + v * 512 + e, m64 block r at
    r * 64 mp); rows past m (stale: never stored) cut off."""
    consumers = min(bw // 64, 2)
    mw = bw // consumers // 64
    tn, tm = cdiv(n, bw), cdiv(m, mp)
    nv = mp // 8
    size = nslots * slot_elems(m, n, bw, mp)
    blocks = region[half * size:(half + 1) * size].reshape(tn * tm * consumers, nslots, mw, nv,
                                                            128, 4)
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


def in_order(parts: Any) -> np.ndarray:
    """The partials added in order in f32 from zero."""
    acc = np.zeros(parts[0].shape, np.float32)
    for p in parts:
        acc = acc + p
    return acc


def reference(partials: np.ndarray) -> np.ndarray:
    """mp 8 path: the slots (rank-major, then K range) summed in order in f32 from zero,
    rounded once to bf16 (as uint16 bits)."""
    from ptxdsl.runtime.dtypes import f32_to_bf16

    return f32_to_bf16(in_order(partials))


def reference_owned(by_rank: list[np.ndarray]) -> np.ndarray:
    """Owner path: each rank's K-range partials summed in K order in f32 from zero and
    rounded to bf16, those sums in rank order in f32 from zero, rounded to bf16 (as uint16
    bits)."""
    from ptxdsl.runtime.dtypes import bf16_to_f32, f32_to_bf16

    return f32_to_bf16(in_order([bf16_to_f32(f32_to_bf16(in_order(p))) for p in by_rank]))


def interp(world: int, m: int = 3, n: int = 72, k: int = 256, *, mp: int = 8, bw: int = 64,
           splits: int = 2, grid: int = 2, epochs: int = 2, seed: int = 0,
           launch: list[int] | None = None, first: int = 1) -> dict:
    """The kernel for `world` ranks at once in the CPU interpreter (`run_ranks`), launched
    `epochs` times on fresh random A_r and W_r (the regions and flags carry over, as on the
    GPU; C is poisoned before each launch): returns each rank's C (bf16 bits), workspace and
    result regions, the last launch's inputs, the numpy product sum and the flags. `launch`:
    the ranks that launch (default all); `first`: the first launch's epoch (the flags then
    hold the one before)."""
    from ptxdsl.interp import TensorMapModel, run_ranks
    from ptxdsl.runtime.dtypes import bf16_to_f32, f32_to_bf16

    rng = np.random.default_rng(seed)
    size = region_elems(m, n, k, bw, mp, splits, world)
    stride = size + 64  # rank regions a little apart, as the VMM granularity leaves them
    ws = np.full((world, stride), np.nan, np.float32)
    rsize = result_elems(m, n, bw, mp, world)
    res = np.full((world, rsize + 64), 0x7FC0, np.uint16)  # bf16 NaN
    words = flag_words(m, n, k, bw, mp, splits, world)
    sig = np.full((world, words), (first - 1) % (1 << 32), np.uint32)
    kern = make_gemm_allreduce(mp, bw, stages=3).ir
    ranks = list(range(world)) if launch is None else launch
    cs = [np.empty((m, n), np.uint16) for _ in range(world)]
    flat_ws, flat_sig = ws.reshape(-1), sig.reshape(-1)
    own = {"res": res.reshape(-1), "res_stride": res.shape[1]} if owners(mp) else {}
    box = {"swizzle": "128B", "dtype": "bf16"}
    for i in range(epochs):
        a = f32_to_bf16(rng.standard_normal((world, m, k), np.float32))
        w = f32_to_bf16(rng.standard_normal((world, n, k), np.float32))
        for c in cs:
            c.fill(0xFFFF)
        args = [arguments(TensorMapModel(w[r], (bw, sm.BK), **box),
                          TensorMapModel(a[r], (mp, sm.BK), **box), cs[r], flat_ws, stride,
                          flat_sig, words, r, world, m, n, k, splits, first + i, **own)
                for r in ranks]
        run_ranks(kern, grid, args, seed=seed + i)
    want = sum(bf16_to_f32(a[r]) @ bf16_to_f32(w[r]).T for r in range(world))
    return {"c": cs, "ws": ws[:, :size], "res": res[:, :rsize], "a": a, "w": w, "want": want,
            "sig": sig, "half": (first + epochs - 1) % 2, "ranges": ranges(k, splits)}


FAMILY = Family(
    name="gemm_allreduce",
    summary="bf16 decode GEMM + all-reduce in one launch (row-parallel linear): the swap-AB "
            "small-M main loop; M up to 8: f32 partials pushed to every rank, summed in rank "
            "order; more: each rank's sum in bf16 to the owner of each part of a tile, which "
            "sums in rank order and pushes its part to all",
    factory=make_gemm_allreduce,
    defaults={"mp": 8, "bw": 128},
)
