"""The warp-specialised persistent bf16 GEMM with the Python API (twin of gemm.ptxdsl).

C = A @ B^T: A is M x K and B is N x K, both row-major (what torch.nn.functional.linear
computes), f32 accumulation, C (M x N, row-major) in the input type. `make_gemm(...)` builds
it for any tile shape, stage count and input type; the module-level kernel is the one that
gemm.ptxdsl spells out (128 x 256 x 64 tiles, 3 stages, bf16).

`make_gemm(streamk=True)` walks a stream-K schedule: the tiles that would leave the last wave
partial, plus one full wave, are shared K step by K step among all CTAs, the rest are whole
tiles stored as above. A warpgroup holding part of a shared tile stores its f32 partial in
the part's slot of a workspace (`ws`: shared tiles x `slots` parts x bm x bn f32, the most
parts any tile is cut into), then counts it on a semaphore per warpgroup and shared tile
(`sem`: the warpgroup's rows; zero between launches); the part that completes the count
adds the other parts' slots to its own accumulators (leaving the semaphore zero) and stores
the tile as a whole one does. Each part stores with all its stores in flight and never
waits for another part."""

import numpy as np

import ptxdsl
from ptxdsl import array, bf16, f16, f32, ptr, s32, tmap, u32
from ptxdsl.kernels.family import Family
from ptxdsl.runtime.occupancy import streamk_workspace
from ptxdsl.swizzle import chunk_box, chunk_columns

from .wgmma import consumer_lanes, count_part, load_stage, main_loop, store_c

SWIZZLE = 128  # bytes per shared-memory row: the K extent of a tile (64 bf16)


def make_gemm(bm: int = 128, bn: int = 256, stages: int = 3, dtype=bf16, group: int = 8,
              consumers: int = 2, cluster: tuple[int, int, int] = (1, 1, 1),
              producer_regs: int = 40, consumer_regs: int = 232, streamk: bool = False
              ) -> ptxdsl.KernelDef:
    """A GEMM kernel with bm x bn x 64 tiles, `consumers` warpgroups of bm / consumers rows
    each (64 or 128), `stages` pipeline stages and tiles walked in groups of `group`
    tile-rows. Each consumer keeps one k-block's wgmma group in flight while it issues the
    next (wgmma_wait(1), then the lagging release of the stage the older group read), so
    `stages` >= 2. `cluster=(2, 1, 1)` pairs the CTAs of a cluster on two vertically adjacent
    tiles of one tile-column: each loads its own A tile and half of the shared B tile,
    multicast to both, so every B tile crosses L2 once per pair (the pipeline derives the
    bytes each full barrier expects and the remote releases of the empty barriers).
    `streamk`: the stream-K walk of the module docstring (no cluster)."""
    cm = cluster[0]
    if tuple(cluster) not in ((1, 1, 1), (2, 1, 1)):
        raise ValueError(f"make_gemm: cluster is (1, 1, 1) or (2, 1, 1), not {cluster}")
    assert dtype in (bf16, f16), "inputs are bf16 or f16"
    bk = SWIZZLE // dtype.nbytes
    wm = bm // consumers  # rows per consumer warpgroup
    assert wm in (64, 128) and wm * consumers == bm, "each consumer owns 64 or 128 rows"
    assert bn % 32 == 0 and 64 <= bn <= 256, "bn is a multiple of 32 from 64 to 256"
    if streamk and cm > 1:
        raise ValueError("make_gemm: streamk takes no cluster")
    mw = wm // 64  # m64 wgmmas per k-step
    nacc = bn // 2  # f32 accumulators per thread per m64 block
    # columns of a C chunk (one TMA store each): 128 bytes, or 64 where that does not divide
    # bn (224-wide tiles: 2 x 64 of them fill 128 SMs where 256-wide ones leave 20 idle)
    cw = chunk_columns(bn, dtype.nbytes)
    chunks = bn // cw
    threads = 128 * (1 + consumers)
    default = (bm, bn, stages, dtype, group, consumers, producer_regs, consumer_regs, cm) == \
        (128, 256, 3, bf16, 8, 2, 40, 232, 1)
    name = "gemm" if default else (f"gemm_{dtype}_{bm}x{bn}x{bk}_s{stages}_c{consumers}_g{group}"
                                   f"_r{producer_regs}_{consumer_regs}{'_x2' if cm == 2 else ''}")
    if streamk:
        name = name.replace("gemm", "gemm_streamk", 1)

    def row0(k, w):
        """The first row of work item w's tile; with a cluster pair, w is a pair of
        vertically adjacent tiles and the CTA of rank r takes its r-th."""
        return (w.m * cm + k.cluster_ctarank) * bm if cm > 1 else w.m * bm

    def body(k, a, b, c, m, n, kk_, ws=None, sem=None, slots=None):
        ring = k.pipeline("ring", stages, a=(dtype, [bm, bk], 1024, SWIZZLE),
                          b=(dtype, [cm, bn // cm, bk] if cm > 1 else [bn, bk], 1024, SWIZZLE))
        cs = k.shared("cs", dtype, [consumers, mw * chunks, 64, cw], align=1024,
                      swizzle=cw * dtype.nbytes)
        if streamk:
            last = k.shared("last", u32, [consumers])  # a warpgroup's 'my part completed it'
        # work items: tiles, or with a cluster pair, pairs of vertically adjacent tiles
        tiles_m = k.let("tiles_m", (m + (bm * cm - 1)) / (bm * cm))
        tiles_n = k.let("tiles_n", (n + (bn - 1)) / bn)
        # >= 1 (a tensor map has no empty dimension): the first k-block is issued before the loop
        ktiles = k.let("ktiles", (kk_ + (bk - 1)) / bk)
        # each CTA (cluster) walks the output tiles persistently, in bands of `group`
        work = k.schedule("work", (tiles_m, tiles_n), group=group, clusters=cm > 1,
                          **({"ksteps": ktiles, "streamk": True} if streamk else {}))
        with k.role("producer", 0, 4, regs=producer_regs):
            with k.if_((k.warp == 0) & k.elect()):
                with k.for_("w", work) as w:
                    m0 = k.let("m0", row0(k, w))
                    n0 = k.let("n0", w.n * bn)
                    with k.for_("kt", *((w.k0, w.k1) if streamk else (0, ktiles))) as kt:
                        load_stage(k, ring, a, b, (kt * bk).to(s32), [m0.to(s32)],
                                   [n0.to(s32)], (n0, bn) if cm > 1 else None)
                        k.commit(ring)
        with k.role("consumer", 4, 4 * (1 + consumers), regs=consumer_regs):
            wg, leader, row, col = consumer_lanes(k)
            with k.for_("w", work) as w:
                m0 = k.let("m0", row0(k, w))
                n0 = k.let("n0", w.n * bn)
                # one m64nN accumulator per 64 rows the consumer owns
                accs = [k.let("acc" if mw == 1 else f"acc{r}", type=array(f32, nacc))
                        for r in range(mw)]

                main_loop(k, ring, accs, wg, *((w.k0, w.k1) if streamk else (0, ktiles)),
                          steps=bk // 16, wm=wm, cluster=cm)
                if streamk:  # a part of a shared tile: the sum, if this part completes it
                    write = k.let("write", w.whole)
                    with k.if_(~w.whole):
                        k.assign(write, fixup(k, w, accs, last, ws, sem, slots, wg, leader,
                                              row, col))
                    with k.if_(write):
                        epilogue(k, accs, cs, c, m0, n0, wg, leader, row, col)
                else:
                    epilogue(k, accs, cs, c, m0, n0, wg, leader, row, col)
            with k.if_(leader):
                k.bulk_wait(0)

    def epilogue(k, accs, cs, c, m0, n0, wg, leader, row, col) -> None:
        """The tile's rows of this warpgroup, as the input type (C chunks of cw columns)."""
        store_c(k, accs, cs, c, m0, n0, wg, leader, row, col, bn=bn, wm=wm, cw=cw,
                chunks=chunks, dtype=dtype)

    def fixup(k, w, accs, last, ws, sem, slots, wg, leader, row, col):
        """Store this part's f32 partial in its slot of the workspace (slot w.split of tile
        w.tile; plain stores, all in flight), count it on the semaphore of this warpgroup's
        rows of the tile, and in the part that completes the count add the other parts'
        slots into `accs` (leaving the semaphore zero). Returns the predicate 'this part
        completed the tile'."""
        half = bm * bn // consumers  # f32 elements of a warpgroup's rows of the tile
        idx = k.let("idx", w.tile * consumers + wg)
        at = k.let("at", (row * bn + col) + wg * half)  # this thread's first element
        mine = k.let("mine", (w.tile * slots + w.split) * (bm * bn) + at)
        for r, acc in enumerate(accs):  # m64 block r: 64 rows further down
            with k.for_(f"jw{r}" if r else "jw", 0, bn // 8, unroll=True) as j:
                with k.for_(f"iw{r}" if r else "iw", 0, 2, unroll=True) as i:
                    ws[mine + (r * 64 * bn + i * 8 * bn) + j * 8] = k.f32x2(
                        acc[4 * j + 2 * i], acc[4 * j + 2 * i + 1])
        # the release publishes only the workspace, but the verifier asks that a previous
        # tile's C stores be complete (long done: issued a main loop ago)
        write = count_part(k, sem, idx, w.splits, last, wg, leader, lambda: k.bulk_wait(0))
        with k.if_(write):  # the other parts, a slot at a time, its loads all in flight
            with k.for_("s", 0, w.splits) as sl:
                with k.if_(sl != w.split):
                    base = k.let("base", (w.tile * slots + sl) * (bm * bn) + at)
                    for r, acc in enumerate(accs):
                        with k.for_(f"jr{r}" if r else "jr", 0, bn // 8, unroll=True) as j:
                            with k.for_(f"ir{r}" if r else "ir", 0, 2, unroll=True) as i:
                                v = k.let(f"v{r}" if r else "v", k.vload(
                                    ws[base + (r * 64 * bn + i * 8 * bn) + j * 8], 2))
                                acc[4 * j + 2 * i] = acc[4 * j + 2 * i] + v[0]
                                acc[4 * j + 2 * i + 1] = acc[4 * j + 2 * i + 1] + v[1]
        return write

    def gemm_streamk(k, a: tmap(dtype, 2), b: tmap(dtype, 2), c: tmap(dtype, 2), m: u32,
                     n: u32, kdim: u32, ws: ptr(f32), sem: ptr(u32), slots: u32):
        body(k, a, b, c, m, n, kdim, ws, sem, slots)

    def gemm(k, a: tmap(dtype, 2), b: tmap(dtype, 2), c: tmap(dtype, 2), m: u32, n: u32,
             kdim: u32):
        body(k, a, b, c, m, n, kdim)

    if cm > 1:
        return ptxdsl.kernel(threads=threads, name=name, cluster=cm)(gemm)
    return ptxdsl.kernel(threads=threads, name=name)(gemm_streamk if streamk else gemm)


gemm = make_gemm()

SMS = 132  # H100 / H200
SMALL = {"m": 256, "n": 256, "k": 256, "grid": 2}


def tiles(m: int, n: int, bm: int = 128, bn: int = 256) -> int:
    return -(-m // bm) * -(-n // bn)


def example(rng: np.random.Generator, m: int = 1000, n: int = 1528, k: int = 1000,
            grid: int | None = None, bm: int = 128, bn: int = 256, cluster: int = 1,
            streamk: bool = False) -> dict:
    """Random bf16 A (m x k) and B (n x k); the reference is A @ B^T in f32 (m, n, k need
    not be tile multiples; k and n are multiples of 8, as TMA wants 16-byte row pitches).
    With `cluster=2` (make_gemm(cluster=(2, 1, 1))) each CTA loads half of a B tile;
    `streamk` is for make_gemm(streamk=True) (its semaphores start and end at zero)."""
    from ptxdsl.runtime.dtypes import bf16_to_f32, f32_to_bf16

    a = f32_to_bf16(rng.standard_normal((m, k), np.float32))
    b = f32_to_bf16(rng.standard_normal((n, k), np.float32))
    ref = bf16_to_f32(a) @ bf16_to_f32(b).T
    box = {"swizzle": "128B"}
    # with a cluster pair, whole clusters, each on two vertically adjacent tiles
    items = -(-m // (bm * cluster)) * -(-n // bn)
    grid = grid or (SMS if streamk else min(SMS // cluster, items) * cluster)
    ex = {"grid": grid,
          "inputs": {"a": a, "b": b, "m": m, "n": n, "kdim": k},
          "tensor_maps": {"a": {"box": (bm, 64), **box}, "b": {"box": (bn // cluster, 64), **box},
                          "c": dict(zip(("box", "swizzle"), chunk_box(64, bn, 2),
                                        strict=True))},
          "outputs": {"c": np.zeros((m, n), np.uint16)}, "expected": {"c": ref},
          "rtol": 2 ** -7, "atol": 2 ** -7 * float(np.sqrt(k)) * 4}
    if streamk:
        size, nsem, slots = streamk_workspace(m, n, k, grid, bm, bn, consumers=2)
        ex["inputs"].update(ws=np.zeros(size, np.float32), sem=np.zeros(nsem, np.uint32),
                            slots=slots)
        ex["expected"]["sem"] = np.zeros(nsem, np.uint32)
    return ex


# the benchmarked default configuration (BENCHMARKS.md)
FAMILY = Family(
    name="gemm",
    summary="bf16 GEMM C = A @ B^T, warp-specialised wgmma, persistent (streamk: stream-K walk)",
    factory=make_gemm,
    defaults={"bm": 128, "bn": 256, "stages": 3},
    source="gemm.ptxdsl",
)
