"""Split-K and stream-K bf16 GEMM with TMA reductions, with the Python API (twin of
gemm_splitk.ptxdsl).

C = A @ B^T (A: M x K, B: N x K, row-major bf16; C: M x N bf16) for skinny outputs and long
K. A tile schedule (`k.schedule`) gives each CTA of a persistent grid its work items: a 128 x
256 tile and a range of its 64-wide K steps.
- split-K (the default): each tile's K steps in min(`splits`, K steps) near-equal ranges;
- stream-K (`make_splitk(streamk=True)`): the tiles of the last partial wave plus one full
  wave are shared K step by K step among all CTAs, the other tiles are whole.
An item runs the wgmma main loop of wgmma.py (one wgmma group in flight). One that owns its
whole tile stores bf16 C from its accumulators. Otherwise it adds its f32 partial into a
workspace (M x N f32, zero between launches) with TMA reduce-add through the tensor map
`ws`, 32-column chunks through a swizzled staging buffer, and counts the K steps it added on
a grid semaphore per half-tile (`sem`, one u32 per consumer warpgroup and tile, zero between
launches):

- unordered (`ordered` = 0): every range reduce-adds; its warpgroup leader waits for the
  reductions to complete (bulk_wait(0)), then adds its K steps to the semaphore (acq_rel);
  the one that brings it to all of the tile's K steps finishes the half-tile;
- deterministic (`ordered` = 1): a range waits (acquire-load spin) until the semaphore says
  every K step before it is in; the first range stores, the others reduce-add, each waits
  for completion and releases its end; the last range finishes. Additions happen in one
  fixed order, so repeated runs are bit-identical. (With stream-K a shared tile's ranges
  belong to consecutive CTAs; walking each run from its end, a CTA first does the ranges
  that its successor waits for.)

Finishing a half-tile: read the f32 sum through `wsp` (a pointer to the same workspace; all
loads in flight at once), leave zeros behind, store bf16 C, and reset the semaphore.

The two-kernel form (`make_splitk(slots=True)`, then `make_splitk_reduce()`): every item
stores its partial into slot w.split of a slots x M x N workspace (`ws` a 3-D tensor map)
with no semaphore and no finisher (`wsp`, `c`, `sem` and `ordered` go unused), and the
second kernel sums the slots in order into C: deterministic, and no range waits for another.
The striped sum (`make_splitk(slots=True, stripes=True)`) does that sum in the same kernel: a
half-tile's ranges meet at its semaphore once their slots are stored, then range s sums stripe
s of the half-tile over all slots, in slot order (deterministic, one launch, every range in
flight at once).
`make_splitk(stages, chunks, streamk, slots)` builds the variants; the module-level kernel is
the one that gemm_splitk.ptxdsl spells out."""

import numpy as np

import ptxdsl
from ptxdsl import bf16, f32, ptr, s32, tmap, u32
from ptxdsl.kernels.family import Family
from ptxdsl.runtime.occupancy import streamk_parts

from .wgmma import consumer_lanes, load_stage, main_loop

BM, BN, BK = 128, 256, 64  # tile rows, columns, and K step (64 bf16 = one 128-byte row)
PART = 32  # f32 columns per staging chunk (128 bytes, the swizzle span)


def make_splitk(stages: int = 4, chunks: int = 2, streamk: bool = False,
                slots: bool = False, cluster: int = 1, stripes: bool = False
                ) -> ptxdsl.KernelDef:
    """The split-K kernel with a `stages`-deep ring and `chunks` 64 x 32 f32 staging chunks
    per consumer warpgroup (8 / chunks reduction passes); `streamk` walks a stream-K schedule
    instead of `splits` ranges per tile (the `splits` argument is then unused). `slots`: the
    two-kernel form, where range s of a tile (whole or not) stores its partial into slot s of
    the workspace (a 3-D tensor map: [column, row, slot]) with no semaphore and no finisher,
    and `splitk_reduce` then sums the slots in order into C (deterministic, and no range
    waits; slots a tile does not use stay zero). `cluster=2`: the CTAs of a 2-CTA cluster
    take two vertically adjacent tiles with the same K range, each loading half of the
    shared B slice and multicasting it to both (split-K only; the grid is whole clusters).
    `stripes` (with `slots`): the slots are summed in this kernel: a half-tile's ranges meet
    at its semaphore (each adds one once its slot is stored; all wait for `splits`), then
    range s sums stripe s of the half-tile over every slot, in slot order, into C, and the
    last to leave resets the semaphore. Deterministic, one launch; every range must be in
    flight at once: at most one item per CTA, all CTAs resident (`launch_grid`'s grid)."""
    if cluster not in (1, 2) or cluster == 2 and streamk:
        raise ValueError(f"make_splitk: cluster is 1, or 2 without streamk; not {cluster}")
    if stripes and (not slots or streamk):
        raise ValueError("make_splitk: stripes sums the slots of a split-K walk: slots=True, "
                         "streamk=False")
    cm = cluster
    passes = BN // PART // chunks
    name = "gemm_splitk" if (stages, chunks) == (4, 2) else f"gemm_splitk_s{stages}_c{chunks}"
    name = name.replace("splitk", "streamk") if streamk else name
    name += ("_stripes" if stripes else "_slots" if slots else "") + ("_x2" if cm > 1 else "")

    def gemm_splitk(k, a: tmap(bf16, 2), b: tmap(bf16, 2), ws: tmap(f32, 3 if slots else 2),
                    wsp: ptr(f32),
                    c: ptr(bf16), sem: ptr(u32), m: u32, n: u32, kdim: u32, splits: u32,
                    ordered: u32):
        ring = k.pipeline("ring", stages, a=(bf16, [BM, BK], 1024, 128),
                          b=(bf16, [cm, BN // cm, BK] if cm > 1 else [BN, BK], 1024, 128))
        if slots and not stripes:  # splitk_reduce may be scheduled now: it waits for this grid
            k.griddep_launch_dependents()
        part = k.shared("part", f32, [2, chunks, 64, PART], align=1024, swizzle=128)
        last = k.shared("last", u32, [2])
        ktiles = k.let("ktiles", (kdim + (BK - 1)) / BK)
        tm = (m + (BM - 1)) / BM  # tile rows (with a cluster, walked in pairs)
        if cm > 1:
            tm = k.let("tm", tm)
        work = k.schedule("work", ((tm + (cm - 1)) / cm if cm > 1 else tm, (n + (BN - 1)) / BN),
                          group=8, ksteps=ktiles, splits=None if streamk else splits,
                          streamk=streamk, clusters=cm > 1)
        with k.role("producer", 0, 4, regs=40):
            with k.if_((k.warp == 0) & k.elect()):
                with k.for_("w", work) as w:
                    m0 = k.let("m0", tile_row(k, w) * BM) if cm > 1 else w.m * BM
                    with k.for_("kt", w.k0, w.k1) as kt:
                        load_stage(k, ring, a, b, (kt * BK).to(s32), [m0.to(s32)],
                                   [(w.n * BN).to(s32)], (w.n * BN, BN) if cm > 1 else None)
                        k.commit(ring)
        with k.role("consumer", 4, 12, regs=232):
            wg, leader, row, col = consumer_lanes(k)
            with k.for_("w", work) as w:
                consume(k, w, ring, part, last, ws, wsp, c, sem, m, n, tm, ktiles, ordered,
                        wg, leader, row, col)
            if slots:
                with k.if_(leader):
                    k.bulk_wait(0)

    def tile_row(k, w):
        """The tile-row of work item w's tile; with a cluster pair, w is a pair of vertically
        adjacent tiles and the CTA of rank r takes its r-th."""
        return w.m * cm + k.cluster_ctarank if cm > 1 else w.m

    def consume(k, w, ring, part, last, ws, wsp, c, sem, m, n, tm, ktiles, ordered, wg,
                leader, row, col):
        """One work item of a consumer warpgroup: its K range, then its share of C."""
        acc = k.let("acc", type=ptxdsl.array(f32, BN // 2))
        main_loop(k, ring, [acc], wg, w.k0, w.k1, steps=BK // 16, cluster=cm)
        mt = k.let("mt", tile_row(k, w)) if cm > 1 else w.m
        r0 = k.let("r0", mt * BM + wg * 64)
        n0 = k.let("n0", w.n * BN)
        if slots and not stripes:  # every item, whole or not: splitk_reduce writes all of C
            if cm > 1:  # a pair's rowless second tile has nothing to store
                with k.if_(mt < tm):
                    store_slot(k, w, part, ws, acc, r0, n0, wg, leader, row, col)
            else:
                store_slot(k, w, part, ws, acc, r0, n0, wg, leader, row, col)
            return
        write = k.let("write", w.whole)
        # a pair's second tile past the last tile-row (odd tile-rows) loaded B for its
        # partner and has nothing to add
        adds = ~w.whole & (mt < tm) if cm > 1 else ~w.whole
        if stripes:
            with k.if_(adds):
                store_slot(k, w, part, ws, acc, r0, n0, wg, leader, row, col)
                sum_stripe(k, w, wsp, c, sem, m, n, mt, r0, n0, wg, leader)
        else:  # the one-kernel sum: reduce-add, count, the last range finishes
            with k.if_(adds):
                idx = k.let("idx", (mt * ((n + (BN - 1)) / BN) + w.n) * 2 + wg if cm > 1
                            else w.tile * 2 + wg)
                first = k.let("first", (ordered != 0) & (w.k0 == 0))
                with k.if_(leader & (ordered != 0)):
                    with k.while_(k.ld_acquire(sem[idx]) != w.k0):
                        pass
                    k.fence_proxy_async_global()
                # the partial tile into the workspace, `chunks` 32-column chunks per pass
                def add(p, h) -> None:
                    at = [(n0 + (p * chunks + h) * PART).to(s32), r0.to(s32)]
                    with k.if_(first):
                        k.tma_store(ws, at, part[wg, h])
                    with k.else_():
                        k.tma_reduce_add(ws, at, part[wg, h])

                staged(k, part, acc, wg, leader, row, col, False, add)
                with k.if_(leader):
                    k.bulk_wait(0)  # complete, not just read: the semaphore publishes the sums
                    done = k.let("done", w.k1 == ktiles)
                    with k.if_(ordered != 0):
                        with k.if_(~done):
                            k.st_release(sem[idx], w.k1)
                    with k.else_():
                        k.assign(done, k.atomic_add(sem[idx], w.k1 - w.k0, "acq_rel")
                                 + (w.k1 - w.k0) == ktiles)
                    with k.if_(done):
                        sem[idx] = 0  # ready for the next launch
                    last[wg] = k.select(done, 1, 0)
                k.bar_sync(8 + wg, 128)
                k.assign(write, last[wg] != 0)
                # the last range of this half-tile reads the sum back: every load in flight at
                # once (out-of-range elements read element 0 and are not stored)
                with k.if_(write):
                    with k.for_("j2", 0, BN // 8, unroll=True) as j:
                        with k.for_("i2", 0, 2, unroll=True) as i:
                            gr, gc = r0 + row + i * 8, n0 + j * 8 + col
                            at = k.let("at", k.select((gr < m) & (gc < n), gr * n + gc, 0))
                            v = k.let("v", k.vload(wsp[at], 2))
                            acc[4 * j + 2 * i] = v[0]
                            acc[4 * j + 2 * i + 1] = v[1]
        # bf16 C from the accumulators (leaving zeros behind in the workspace)
        with k.if_(write):
            with k.for_("j3", 0, BN // 8, unroll=True) as j:
                with k.for_("i3", 0, 2, unroll=True) as i:
                    gr, gc = r0 + row + i * 8, n0 + j * 8 + col
                    with k.if_((gr < m) & (gc < n)):
                        at = k.let("at2", gr * n + gc)
                        with k.if_(~w.whole):
                            wsp[at] = k.f32x2(0.0, 0.0)
                        c[at] = k.bf16x2(acc[4 * j + 2 * i].to(bf16),
                                         acc[4 * j + 2 * i + 1].to(bf16))

    def sum_stripe(k, w, wsp, c, sem, m, n, mt, r0, n0, wg, leader, unroll: int = 8) -> None:
        """`stripes`: once every range of the half-tile has stored its slot, range s sums
        stripe s of the half-tile (float4 groups, a 64 x 256 half-tile being 4096 of them)
        over all slots in slot order into bf16 C; the semaphore counts arrivals to `splits`,
        departures to 2 `splits`, and the last to leave resets it."""
        idx = k.let("idx", (mt * ((n + (BN - 1)) / BN) + w.n) * 2 + wg if cm > 1
                    else w.tile * 2 + wg)
        with k.if_(leader):
            k.bulk_wait(0)  # this slot's stores complete, not just read
            k.let("arrived", k.atomic_add(sem[idx], 1, "acq_rel"))
            with k.while_(k.ld_acquire(sem[idx]) < w.splits):
                pass
        k.bar_sync(8 + wg, 128)
        groups = 64 * BN // 4
        lo = k.let("lo", w.split * groups / w.splits)
        hi = k.let("hi", (w.split + 1) * groups / w.splits)
        plane = k.let("plane", m * n)  # one slot
        with k.for_("g", lo + k.tid.x % 128, hi, 128) as g:
            gr = k.let("gr", r0 + g / (BN // 4))
            gc = k.let("gc", n0 + g % (BN // 4) * 4)
            with k.if_((gr < m) & (gc < n)):
                at = k.let("at", gr * n + gc)
                total = k.let("total", k.vload(wsp[at], 4))
                with k.for_("s0", 1, w.splits, unroll) as s0:
                    with k.for_("s", 0, unroll, unroll=True) as sl:
                        # past the last slot, read slot 0 again and add nothing
                        here = k.let("here", s0 + sl < w.splits)
                        v = k.let("v", k.vload(wsp[k.select(here, (s0 + sl) * plane + at, at)],
                                                4))
                        for e in range(4):
                            total[e] = total[e] + k.select(here, v[e], 0.0)
                c[at] = k.bf16x4(*(total[e].to(bf16) for e in range(4)))
        k.bar_sync(8 + wg, 128)  # every thread's reads done before the semaphore can reset
        with k.if_(leader):
            left = k.let("left", k.atomic_add(sem[idx], 1, "relaxed") + 1)
            with k.if_(left == 2 * w.splits):
                sem[idx] = 0  # ready for the next launch

    def store_slot(k, w, part, ws, acc, r0, n0, wg, leader, row, col) -> None:
        """The partial tile into slot w.split of the workspace (an item's first pass also
        waits: the previous item's stores may still read the staging chunks)."""
        def store(p, h) -> None:
            k.tma_store(ws, [(n0 + (p * chunks + h) * PART).to(s32), r0.to(s32),
                             w.split.to(s32)], part[wg, h])

        staged(k, part, acc, wg, leader, row, col, True, store)

    def staged(k, part, acc, wg, leader, row, col, first_waits: bool, issue) -> None:
        """The f32 accumulators through the swizzled staging chunks, `chunks` 32-column
        chunks per pass, `issue(p, h)` sending chunk h of pass p; a pass waits until the
        previous pass's stores have read the chunks (the first pass too with
        `first_waits`)."""
        with k.for_("p", 0, passes, unroll=True) as p:
            def chunks_free() -> None:
                with k.if_(leader):
                    k.bulk_wait_read(0)
                k.bar_sync(8 + wg, 128)

            if first_waits:
                chunks_free()
            else:
                with k.if_(p > 0):
                    chunks_free()
            with k.for_("j", 0, 4 * chunks, unroll=True) as j:
                with k.for_("i", 0, 2, unroll=True) as i:
                    e = 16 * chunks * p + 4 * j + 2 * i
                    part[wg, j / 4, row + i * 8, j % 4 * 8 + col] = k.f32x2(acc[e], acc[e + 1])
            k.fence_proxy_async()
            k.bar_sync(8 + wg, 128)
            with k.if_(leader):
                with k.for_("h", 0, chunks, unroll=True) as h:
                    issue(p, h)
                k.bulk_commit()

    if cm > 1:
        return ptxdsl.kernel(threads=384, name=name, cluster=cm)(gemm_splitk)
    return ptxdsl.kernel(threads=384, name=name)(gemm_splitk)


def make_splitk_reduce(threads: int = 256, unroll: int = 8) -> ptxdsl.KernelDef:
    """The second kernel of the two-kernel split-K: C = the sum of `slots` f32 workspace
    slots of `total` elements each, in slot order, as bf16; four elements a thread, `unroll`
    slots' loads in flight at a time. It waits for the grid before it (`griddep_wait`), so it
    is launched with programmatic dependent launch and starts as the split-K grid ends."""

    @ptxdsl.kernel(threads=threads, name="splitk_reduce")
    def splitk_reduce(k, ws: ptr(f32), c: ptr(bf16), total: u32, slots: u32):
        # launched early (programmatic dependent launch, derived from this wait): the
        # split-K grid before it must be complete before the slots are read
        k.griddep_wait()
        i = k.let("i", (k.ctaid.x * threads + k.tid.x) * 4)
        with k.if_(i < total):
            acc = k.let("acc", k.vload(ws[i], 4))
            with k.for_("s0", 1, slots, unroll) as s0:
                with k.for_("s", 0, unroll, unroll=True) as sl:
                    # past the last slot, read slot 0 again and add nothing
                    here = k.let("here", s0 + sl < slots)
                    v = k.let("v", k.vload(ws[k.select(here, (s0 + sl) * total + i, i)], 4))
                    for e in range(4):
                        acc[e] = acc[e] + k.select(here, v[e], 0.0)
            c[i] = k.bf16x4(*(acc[e].to(bf16) for e in range(4)))

    return splitk_reduce


gemm_splitk = make_splitk()

SMS = 132  # H100 / H200
SMALL = {"m": 128, "n": 256, "k": 128, "splits": 2}


def tiles(m: int, n: int) -> int:
    return -(-m // BM) * -(-n // BN)


def pick_splits(m: int, n: int, k: int, sms: int = SMS) -> int:
    """As many K slices as fill the GPU once with tiles x splits CTAs (each slice at least
    four K steps)."""
    return max(1, min(sms // tiles(m, n), -(-k // BK) // 4))


def max_splits(m: int, n: int, k: int, grid: int) -> int:
    """The most ranges a stream-K walk over `grid` CTAs cuts any tile into (the slots its
    two-kernel form needs), by the schedule's own arithmetic."""
    return streamk_parts(tiles(m, n), -(-k // BK), grid)


def launch_grid(m: int, n: int, k: int, splits: int, streamk: bool = False,
                sms: int = SMS, cluster: int = 1, stripes: bool = False) -> int:
    """CTAs for a launch: one per work item, at most one per SM (the grid is persistent: a
    CTA walks its items in turn). Stream-K always fills the SMs. With `cluster=2` an item
    is a pair of vertically adjacent tiles for a 2-CTA cluster: whole clusters. `stripes`
    (the striped sum: every range in flight at once) raises ValueError where the items
    outnumber the SMs (taking `sms` CTAs, or `sms` / 2 clusters, to be resident together:
    true of the H100 and H200 at one CTA an SM; occupancy is not asked)."""
    if splits < 1 and not streamk:
        raise ValueError(f"splits must be at least 1, got {splits}")
    if streamk:
        return sms
    tile_rows = -(-m // BM)
    pairs = -(-tile_rows // cluster) * -(-n // BN)
    items = pairs * min(splits, -(-k // BK))
    if stripes and items > sms // cluster:
        raise ValueError(f"the striped sum needs every range in flight at once: "
                         f"{items * cluster} CTAs, more than {sms // cluster * cluster}")
    return min(items, sms // cluster) * cluster


def example(rng: np.random.Generator, m: int = 512, n: int = 512, k: int = 8192,
            splits: int | None = None, ordered: int = 0, streamk: bool = False,
            grid: int | None = None, cluster: int = 1, stripes: bool = False) -> dict:
    """Random bf16 A (m x k) and B (n x k); the reference is A @ B^T in f32. The workspace
    (one array behind both `ws` and `wsp`) and the semaphores start at zero and are left at
    zero. `streamk` is for make_splitk(streamk=True), `cluster` for make_splitk(cluster=2)
    (each CTA loads half of a B slice), `stripes` for make_splitk(slots=True, stripes=True)
    (a slot per range, left holding the partials); `grid` overrides the persistent grid."""
    from ptxdsl.runtime.dtypes import bf16_to_f32, f32_to_bf16

    splits = splits or pick_splits(m, n, k)
    a = f32_to_bf16(rng.standard_normal((m, k), np.float32))
    b = f32_to_bf16(rng.standard_normal((n, k), np.float32))
    ref = bf16_to_f32(a) @ bf16_to_f32(b).T
    box = {"swizzle": "128B"}
    nslots = min(splits, -(-k // BK))
    ws = np.zeros((nslots, m, n) if stripes else (m, n), np.float32)
    nsem = 2 * tiles(m, n)
    return {"grid": grid or launch_grid(m, n, k, splits, streamk, cluster=cluster,
                                        stripes=stripes),
            "inputs": {"a": a, "b": b, "ws": ws, "wsp": ws, "sem": np.zeros(nsem, np.uint32),
                       "m": m, "n": n, "kdim": k, "splits": splits, "ordered": ordered},
            "tensor_maps": {"a": {"box": (BM, BK), **box},
                            "b": {"box": (BN // cluster, BK), **box},
                            "ws": {"box": (1, 64, PART) if stripes else (64, PART), **box}},
            "outputs": {"c": np.zeros((m, n), np.uint16)},
            "expected": {"c": ref, "sem": np.zeros(nsem, np.uint32),
                         **({} if stripes else {"wsp": np.zeros((m, n), np.float32)})},
            "rtol": 2 ** -7, "atol": 2 ** -7 * float(np.sqrt(k)) * 4}


# the benchmarked default configuration (BENCHMARKS.md)
FAMILY = Family(
    name="gemm_splitk",
    summary="bf16 split-K / stream-K GEMM for skinny outputs and long K (TMA reduce-add)",
    factory=make_splitk,
    defaults={"stages": 4, "chunks": 2},
    source="gemm_splitk.ptxdsl",
)
