"""The small-M (decode) GEMM, bf16 or e4m3: swap-AB with split-K, with the Python API.

C = A @ W^T (A: M x K activations, W: N x K weights, row-major bf16 or e4m3; C: M x N bf16,
f32 accumulation) for the few token rows of decoding (M = 1 to 256), where the work is streaming
W from memory. The tensor cores' smallest tile is 64 rows, so the kernel computes C^T = W A^T:
a `bw`-row weight tile (64, 128 or 256 rows of N; consumer warpgroups of 64 or 128 rows) is
the wgmma's A operand and the activation tile (`mp` rows of M, a multiple of 8 up to 256) its B
operand, both read from shared memory K-major (what fp8 wgmma needs too). With `cols` 2, two
warpgroups side by side each take half the activation tile as their wgmmas' N: a tile taller
than one warpgroup's registers hold still reads each weight tile once. With `cluster` 2, the
two CTAs of a cluster take adjacent weight tiles and share the activation tile, each loading
half of it by multicast: half the activation reads from L2. Rows of A past M
are zero-filled by the tensor map and never stored. A stage is one 128-byte swizzled row of K
per tile row: K = 64 of bf16 (4 wgmma k16 steps), or K = 128 of e4m3 (4 k32 steps; fp8 wgmma
has no transpose, so the swap keeps both operands K-major as they are in memory). The
tensor cores add fp8 products in limited precision, so each fp8 stage is summed apart and
added into f32 accumulators (two-level accumulation). The fp8 scales (per tensor, or per
token and per output channel) multiply the f32 sums as C is stored.

Split-K keeps every SM streaming weights when the N / bw tiles are fewer than SMs: the
schedule (`k.schedule(..., splits=S)`) cuts each tile's K steps into S ranges, one work item
each. A range that owns its whole tile stores C from its accumulators. Otherwise it stores its
f32 partial into its slot of a workspace (`ws`: tiles x warpgroups x S slots x its rows x its
columns f32, each thread's values four at a time, coalesced), counts it on its warpgroup's
semaphore (`sem`, zero between launches), and the range that completes the count sums every
slot in slot order into C (so the result does not depend on which range finishes last:
repeated runs are bit-identical) and leaves the semaphore zero.

The epilogue stores C directly from the accumulator fragments (a thread holds C^T rows n and
n + 8 of two adjacent columns m, m + 1 per 8-column group), masked at the M and N edges: C is
small next to W (M x N against N x K), and no staging tile takes shared memory from the ring.
The kernel waits for the grid before it (`griddep_wait`) after setting up its barriers and
prefetching its tensor-map descriptors, so it is launched with programmatic dependent launch:
after a kernel that lets its dependents start early, its launch and prologue overlap that
kernel's end. It does not let its own dependents start early: on the H200 the next grid's CTAs
then took the SMs a short grid leaves idle, and 96-CTA launches ran about 25% slower."""

import numpy as np

import ptxdsl
from ptxdsl import array, bf16, e4m3, f32, ptr, s32, tmap, u32
from ptxdsl.kernels.family import Family

from .wgmma import consumer_lanes, count_part, load_stage, main_loop, promoted_loop

SWIZZLE = 128  # bytes per shared-memory row: a stage's K extent
BK = SWIZZLE // 2  # K per stage of bf16
BK_FP8 = SWIZZLE  # K per stage of fp8
SMEM = 227 * 1024  # shared memory a CTA may take on the H100 / H200
MAX_STAGES = 12
SCALES = ("tensor", "row")  # fp8: per-tensor scales, or per row of A and per row of W
EPILOGUES = ("residual", "silu_mul")  # the decoder block's steps fused into the store
# silu_mul: gate and up rows interleaved in groups of this many: a wgmma accumulator
# fragment's row step (a thread holds C^T rows n and n + 8)
GATE_UP_GROUP = 8


def stages_for(bw: int, mp: int) -> int:
    """The deepest ring that fits shared memory: a stage holds bw + mp rows of SWIZZLE bytes
    (BK bf16 or BK_FP8 fp8)."""
    per = (bw + mp) * SWIZZLE
    return max(2, min(MAX_STAGES, (SMEM - 1024) // per))


def consumer_grid(bw: int, cols: int = 1) -> tuple[int, int]:
    """(consumer warpgroups, weight rows of each): one per 64 rows of the weight tile (two of
    128 at bw 256), times `cols` warpgroups side by side over the activation tile's rows."""
    rows = min(bw // 64, 2)
    return rows * cols, bw // rows


def consumer_regs_for(consumers: int) -> int:
    """The consumers' setmaxnreg budget: what the CTA's registers at launch (threads x the
    entry cap, a multiple of 8) leave beside a 40-register producer warpgroup, at most 232."""
    threads = 128 * (1 + consumers)
    pool = threads * min(255, 65536 // threads // 8 * 8)
    return min(232, (pool - 128 * 40) // (128 * consumers) // 8 * 8)


def max_mp(bw: int, dtype=bf16, cols: int = 1, cluster: int = 1) -> int:
    """The tallest activation tile whose accumulators fit the consumers' registers: an m64 x
    N accumulator takes N / 2 f32 a thread, and bw 256 gives a warpgroup two; e4m3 adds two
    per-stage temporaries beside each (promoted_loop), three times the registers. With `cols`
    warpgroups over the activation tile each holds N = mp / cols of it; four warpgroups have
    under half the registers each (consumer_regs_for), so half the width, and none for e4m3.
    A cluster pair's bf16 warpgroup holds at most 64 f32 of accumulators a thread (N 128 an
    m64 block): at 128, ptxas spilled a few registers (the pair's ranks and barriers)."""
    consumers, wm = consumer_grid(bw, cols)
    width = (256 if dtype == bf16 else 128) // (wm // 64)
    if consumers > 2:
        width = width // 2 if dtype == bf16 else 0
    if cluster > 1 and dtype == bf16:
        width = min(width, 128 // (wm // 64))
    return min(256, cols * width)


def make_smallm(mp: int = 64, bw: int = 128, stages: int | None = None,
                consumer_regs: int | None = None, dtype=bf16, scales: str | None = None,
                cols: int = 1, cluster: int = 1, epilogue: str | None = None
                ) -> ptxdsl.KernelDef:
    """The swap-AB kernel for activation tiles of `mp` rows (8 to 256, a multiple of 8) and
    weight tiles of `bw` rows (64 or 128: one consumer warpgroup per 64; 256: two of 128 rows,
    each two m64 accumulators, for mp up to 128), with a `stages`-deep TMA ring (default: as
    deep as shared memory allows, `stages_for`). Taller weight tiles read each activation
    tile for more weight rows: less shared-memory traffic from L2 as M grows.

    `dtype` is bf16 or e4m3 (A and W; C is bf16 either way). e4m3 takes `scales`: "tensor"
    (C = sa sb A W^T, sa and sb one-element f32 device tensors, as torch._scaled_mm takes them)
    or "row" (C[m, n] = sa[m] sb[n] (A W^T)[m, n], sa of M and sb of N f32: per token and per
    output channel); either is applied to the f32 sums as C is stored (with swap-AB a weight
    row is an accumulator row), after the split-K slot sum. e4m3 sums each stage's 128 of K
    in the tensor cores and adds it into f32 registers (`promoted_loop`), so its tiles are
    smaller (`max_mp`: mp up to 128, 64 with bw 256).

    `cols` 2 puts two warpgroups side by side over the activation tile, each the wgmma's N
    of its half (mp / 2 rows of A), reading the one weight tile in shared memory: activation
    tiles up to 256 rows (e4m3 too, with bw 64) read each weight tile once. bw 64 then has
    two consumer warpgroups, bw 128 and 256 four (bf16 only: a quarter of the registers
    each, `consumer_regs_for`).

    `cluster` 2: the CTAs of a 2-CTA cluster take two adjacent weight tiles with the same
    activation tile and K range, each loading half of the activation tile and multicasting
    it to both: the activation tiles are read from L2 half as often. The schedule's items
    are then pairs of weight tiles; a pair's second tile past N (an odd count) loads its
    half for its partner and stores nothing (mp at least 16: halves of whole 8-row swizzle
    atoms).

    `epilogue` (bf16 only) fuses the decoder block's next step into the store, applied once
    to the f32 sums (after the split-K slot sum): "residual" adds R (a bf16 M x N parameter
    `r`, after the semaphores) to C; "silu_mul" takes W's rows as gate and up rows
    interleaved in eights (`interleave_gate_up`) and stores silu(gate) * up, C of N / 2
    columns (N a multiple of 16)."""
    if dtype not in (bf16, e4m3):
        raise ValueError(f"make_smallm: dtype is bf16 or e4m3, got {dtype}")
    if (scales is None) != (dtype == bf16) or scales not in (None, *SCALES):
        raise ValueError(f"make_smallm: e4m3 takes scales 'tensor' or 'row', bf16 none; got "
                         f"dtype {dtype} with scales {scales!r}")
    if epilogue not in (None, *EPILOGUES) or (epilogue and dtype != bf16):
        raise ValueError(f"make_smallm: epilogue is None or one of {', '.join(EPILOGUES)}, "
                         f"with bf16; got {epilogue!r} with dtype {dtype}")
    if mp % 8 or not 8 <= mp <= 256:
        raise ValueError(f"make_smallm: mp is a multiple of 8 from 8 to 256, got {mp}")
    if bw not in (64, 128, 256):
        raise ValueError(f"make_smallm: bw is 64, 128 or 256, got {bw}")
    if cols not in (1, 2) or mp % (8 * cols):
        raise ValueError(f"make_smallm: cols is 1 or 2, each warpgroup's share of mp a "
                         f"multiple of 8; got cols {cols} with mp {mp}")
    if cols > 1 and dtype != bf16 and bw != 64:
        raise ValueError(f"make_smallm: e4m3 with cols 2 takes bw 64 (four warpgroups have no "
                         f"registers for its temporaries), got bw {bw}")
    if cluster not in (1, 2) or mp % (8 * cluster):
        raise ValueError(f"make_smallm: cluster is 1, or 2 with mp a multiple of 16 (each "
                         f"CTA's half whole 8-row swizzle atoms); got cluster {cluster} with "
                         f"mp {mp}")
    if mp > max_mp(bw, dtype, cols, cluster):
        raise ValueError(f"make_smallm: a {dtype} kernel with bw {bw}, cols {cols} and "
                         f"cluster {cluster} holds its accumulators in registers for mp up to "
                         f"{max_mp(bw, dtype, cols, cluster)}, got mp {mp}")
    stages = stages or stages_for(bw, mp)
    consumers, wm = consumer_grid(bw, cols)  # warpgroups, weight rows of each
    rows = consumers // cols  # warpgroups along the weight tile
    consumer_regs = consumer_regs or consumer_regs_for(consumers)
    mw = wm // 64  # a warpgroup's m64 accumulators
    mc = mp // cols  # its activation rows: its wgmmas' N
    nacc = mc // 2  # f32 per thread of an m64 x mc C^T accumulator
    # slots summed at a time: their loads take registers (four warpgroups have 104 a thread:
    # one slot at a time, or the pairs' builds spill)
    unroll = 1 if consumers > 2 else max(1, min(4, 128 // (mw * nacc)))
    bk, kw = (BK, 16) if dtype == bf16 else (BK_FP8, 32)  # K per stage, per wgmma
    name = (f"gemm_smallm_{epilogue}_m{mp}_w{bw}_s{stages}" if epilogue else
            f"gemm_smallm_m{mp}_w{bw}_s{stages}" if dtype == bf16 else
            f"gemm_smallm_{dtype}_{scales}_m{mp}_w{bw}_s{stages}") + \
        (f"_c{cols}" if cols > 1 else "") + ("_x2" if cluster > 1 else "")

    def body(k, w, x, c, ws, sem, m, n, kdim, splits, sa=None, sb=None, r=None):
        ring = k.pipeline("ring", stages, a=(dtype, [bw, bk], 1024, SWIZZLE),
                          b=(dtype, [2, mp // 2, bk] if cluster > 1 else [mp, bk], 1024,
                             SWIZZLE))
        last = k.shared("last", u32, [consumers])  # a warpgroup's 'my range completed it'
        with k.if_(k.tid.x == 0):  # the descriptors are parameters: fetched while we wait
            k.tma_prefetch_desc(w)
            k.tma_prefetch_desc(x)
        # everything above is this CTA's own; C, the workspace and the semaphores may still
        # be in use by the grid before (and A is often its output)
        k.griddep_wait()
        ktiles = k.let("ktiles", (kdim + (bk - 1)) / bk)
        wtiles = (n + (bw - 1)) / bw
        work = k.schedule("work", ((wtiles + 1) / 2 if cluster > 1 else wtiles,
                                   (m + (mp - 1)) / mp), ksteps=ktiles, splits=splits,
                          clusters=cluster > 1)
        with k.role("producer", 0, 4, regs=40):
            with k.if_((k.warp == 0) & k.elect()):
                with k.for_("it", work) as it:
                    wt = weight_tile(k, it)
                    with k.for_("kt", it.k0, it.k1) as kt:
                        load_stage(k, ring, w, x, (kt * bk).to(s32), [(wt * bw).to(s32)],
                                   [(it.n * mp).to(s32)],
                                   (it.n * mp, mp) if cluster > 1 else None)
                        k.commit(ring)
        with k.role("consumer", 4, 4 * (1 + consumers), regs=consumer_regs):
            wg, leader, row, col = consumer_lanes(k)
            # this warpgroup's place: its weight rows (wr) and activation rows (b0; in the
            # ring, bop: with a cluster pair, b0's half of the tile, mc = mp / 2 rows each)
            wr, b0, bop = wg, 0, 0
            if cols > 1:
                wr = k.let("wr", wg % rows) if rows > 1 else 0
                b0 = k.let("b0", wg / rows * mc)
                bop = wg / rows if cluster > 1 else b0
            with k.for_("it", work) as it:
                wt = weight_tile(k, it)
                names = ["acc" if mw == 1 else f"acc{r}" for r in range(mw)]
                if dtype == bf16:
                    accs = [k.let(nm, type=array(f32, nacc)) for nm in names]
                    main_loop(k, ring, accs, wr, it.k0, it.k1, steps=bk // kw, wm=wm, kw=kw,
                              cluster=cluster, b0=bop)
                else:  # each stage's fp8 sums added into f32 accumulators
                    accs = [k.let(nm, 0.0, array(f32, nacc)) for nm in names]
                    tmps = tuple([k.let(f"tmp{t}_{r}", type=array(f32, nacc))
                                  for r in range(mw)] for t in range(2))
                    promoted_loop(k, ring, accs, tmps, wr, it.k0, it.k1, nacc=nacc,
                                  steps=bk // kw, wm=wm, kw=kw, cluster=cluster, b0=bop)
                write = k.let("write", it.whole)
                with k.if_(~it.whole):
                    k.assign(write, sum_slots(k, it, accs, last, ws, sem, wg, leader))
                with k.if_(write):
                    if epilogue == "silu_mul":
                        store_silu_mul(k, it, wt, accs, c, m, n, wr, b0, row, col)
                    else:
                        store(k, it, wt, accs, c, m, n, wr, b0, row, col, sa, sb, r)

    def weight_tile(k, it):
        """Work item it's weight tile: its own, or with a cluster pair the rank's of the
        pair (the schedule's tile numbers count pairs)."""
        return k.let("wt", it.m * 2 + k.cluster_ctarank) if cluster > 1 else it.m

    def sum_slots(k, it, accs, last, ws, sem, wg, leader):
        """Store this range's partial in its slot, count it on the warpgroup's semaphore, and
        in the range that completes the count sum every slot, in slot order, into `accs`
        (leaving the semaphore zero). Returns the predicate 'this range completed it'. A tile
        has it.splits slots: min(splits, K steps), as `workspace` counts them."""
        t = k.tid.x % 128
        # this warpgroup's rows of the tile (with a pair, numbered as the pair's, then rank)
        tile = k.let("tile", (it.tile * 2 + k.cluster_ctarank) * consumers + wg if cluster > 1
                     else it.tile * consumers + wg)
        plane = 64 * mc  # f32 elements of one m64 block's slot
        mine = k.let("mine", (tile * it.splits + it.split) * (mw * plane) + t * 4)
        for r, acc in enumerate(accs):
            with k.for_(f"q{r}" if r else "q", 0, nacc // 4, unroll=True) as q:
                ws[mine + r * plane + q * 512] = k.f32x4(acc[4 * q], acc[4 * q + 1],
                                                         acc[4 * q + 2], acc[4 * q + 3])
        total = count_part(k, sem, tile, it.splits, last, wg, leader)
        with k.if_(total):  # every slot, `unroll` slots' loads in flight at a time
            for r, acc in enumerate(accs):
                with k.for_(f"e{r}" if r else "e", 0, nacc, unroll=True) as e:
                    acc[e] = 0.0
            with k.for_("s0", 0, it.splits, unroll) as s0:
                with k.for_("s", 0, unroll, unroll=True) as sl:
                    # past the last slot, read this range's own slot again and add nothing
                    here = k.let("here", s0 + sl < it.splits)
                    at = k.let("at", k.select(
                        here, (tile * it.splits + s0 + sl) * (mw * plane) + t * 4, mine))
                    for r, acc in enumerate(accs):
                        with k.for_(f"q2{r}" if r else "q2", 0, nacc // 4, unroll=True) as q:
                            v = k.let(f"v{r}" if r else "v",
                                      k.vload(ws[at + r * plane + q * 512], 4))
                            for e in range(4):
                                acc[4 * q + e] = acc[4 * q + e] + k.select(here, v[e], 0.0)
        return total

    def store(k, it, wt, accs, c, m, n, wr, b0, row, col, sa, sb, res) -> None:
        """C from the C^T fragments: acc[4 j + 2 i + e] of m64 block r is C^T row (64 r + row
        + 8 i) and column (b0 + 8 j + col + e) of the warpgroup's rows of the tile, i.e.
        C[m, n] with m in the tile's columns; times the fp8 scales, plus the residual `res`."""
        n0 = k.let("n0", wt * bw + wr * wm + row)
        m0 = k.let("m0", it.n * mp + col if cols == 1 else it.n * mp + b0 + col)
        if scales == "tensor":
            scale = k.let("scale", sa[0] * sb[0])
        elif scales == "row":  # this thread's weight rows' scales (an edge row reads n - 1's)
            rs = k.let("rs", type=array(f32, 2 * mw))
            for r in range(mw):
                for i in range(2):
                    rs[2 * r + i] = sb[k.min(n0 + (r * 64 + i * 8), n - 1)]

        def put(gm, gn, v, r, i) -> None:
            if scales == "tensor":
                v = v * scale
            elif scales == "row":
                v = v * (sa[gm] * rs[2 * r + i])
            if res is not None:
                v = v + res[gm * n + gn].to(f32)
            c[gm * n + gn] = v.to(bf16)

        store_fragments(k, accs, n0, m0, mc, m, n, put)

    def store_silu_mul(k, it, wt, accs, c, m, n, wr, b0, row, col) -> None:
        """silu(gate) * up from the C^T fragments (as `store` reads them): W's rows come as
        eight gate rows then the eight up rows of the same outputs, so a thread's row n + 8
        (i = 1) is the up row of its gate row n (i = 0; n % 16 < 8), and C's column is the
        gate row's output, n / 16 * 8 + n % 8, of N / 2."""
        n0 = k.let("n0", wt * bw + wr * wm + row)
        m0 = k.let("m0", it.n * mp + col if cols == 1 else it.n * mp + b0 + col)
        half = k.let("half", n / 2)
        for r, acc in enumerate(accs):
            gn = n0 + r * 64
            out = k.let(f"out{r}" if r else "out", gn / 16 * 8 + gn % 8)
            with k.for_(f"j{r}" if r else "j", 0, mc // 8, unroll=True) as j:
                with k.for_(f"e{r}" if r else "e", 0, 2, unroll=True) as e:
                    gm = m0 + j * 8 + e
                    with k.if_((gm < m) & (gn < n)):
                        gate = acc[4 * j + e]
                        c[gm * half + out] = (k.silu(gate) * acc[4 * j + 2 + e]).to(bf16)

    if epilogue == "residual":
        def gemm_smallm(k, w: tmap(bf16, 2), x: tmap(bf16, 2), c: ptr(bf16), ws: ptr(f32),
                        sem: ptr(u32), r: ptr(bf16), m: u32, n: u32, kdim: u32, splits: u32):
            body(k, w, x, c, ws, sem, m, n, kdim, splits, r=r)
    elif dtype == bf16:
        def gemm_smallm(k, w: tmap(bf16, 2), x: tmap(bf16, 2), c: ptr(bf16), ws: ptr(f32),
                        sem: ptr(u32), m: u32, n: u32, kdim: u32, splits: u32):
            body(k, w, x, c, ws, sem, m, n, kdim, splits)
    else:
        def gemm_smallm(k, w: tmap(e4m3, 2), x: tmap(e4m3, 2), c: ptr(bf16), ws: ptr(f32),
                        sem: ptr(u32), scale_a: ptr(f32), scale_b: ptr(f32), m: u32, n: u32,
                        kdim: u32, splits: u32):
            body(k, w, x, c, ws, sem, m, n, kdim, splits, scale_a, scale_b)

    if cluster > 1:
        return ptxdsl.kernel(threads=128 * (1 + consumers), name=name,
                             cluster=cluster)(gemm_smallm)
    return ptxdsl.kernel(threads=128 * (1 + consumers), name=name)(gemm_smallm)


def store_fragments(k, accs, n0, m0, mc: int, m, n, put) -> None:
    """Every element of a warpgroup's C^T accumulators (m64 blocks of mc columns) inside C's
    M x N: acc[4 j + 2 i + e] of block r is C^T row n0 + 64 r + 8 i, column m0 + 8 j + e,
    i.e. C[gm, gn] with gm the column; `put(gm, gn, value, r, i)` stores it."""
    for r, acc in enumerate(accs):
        with k.for_(f"j{r}" if r else "j", 0, mc // 8, unroll=True) as j:
            with k.for_(f"i{r}" if r else "i", 0, 2, unroll=True) as i:
                gn = n0 + (r * 64 + i * 8)
                with k.for_(f"e{r}" if r else "e", 0, 2, unroll=True) as e:
                    gm = m0 + j * 8 + e
                    with k.if_((gm < m) & (gn < n)):
                        put(gm, gn, acc[4 * j + 2 * i + e], r, i)


gemm_smallm = make_smallm()  # the family's default build: up to 64 rows, 128-row weight tiles

SMS = 132  # H100 / H200
MIN_KSTEPS = 4  # the fewest K steps a split range is worth


def pad_m(m: int, top: int = 256) -> int:
    """The activation tile for M rows: the power of two from 8 to `top` that holds them (one
    kernel per bucket; a decode GEMM's time barely depends on M); past `top` rows (the
    tallest tile of the dtype, `max_mp`), M takes several tiles."""
    return max(8, min(top, 1 << (m - 1).bit_length()))


def tiles_of(m: int, n: int, bw: int, mp: int, cluster: int = 1) -> int:
    """The tiles of a launch, weight tiles times activation tiles; with a cluster pair the
    weight tiles in whole pairs (a pair's second past N is a tile that stores nothing)."""
    return -(-n // (bw * cluster)) * cluster * -(-m // mp)


def pick_splits(m: int, n: int, k: int, bw: int, mp: int, sms: int = SMS, bk: int = BK,
                waves: int = 1, cluster: int = 1) -> int:
    """As many K ranges per tile as fill the SMs `waves` times (each range at least MIN_KSTEPS
    K steps of `bk`: BK for bf16, BK_FP8 for fp8, as in the helpers below). With two waves an
    SM walks two ranges in turn: the producer loads the second's stages while the consumers
    store the first's partial or sum its slots. `cluster` as make_smallm takes it."""
    return max(1, min(waves * sms // tiles_of(m, n, bw, mp, cluster), -(-k // bk) // MIN_KSTEPS))


def workspace(m: int, n: int, k: int, bw: int, mp: int, splits: int,
              bk: int = BK, cols: int = 1, cluster: int = 1) -> tuple[int, int]:
    """(f32 elements of the workspace, u32 semaphores: one per consumer warpgroup and tile)
    of a launch, at least one of each (a launch takes no empty array)."""
    tiles = tiles_of(m, n, bw, mp, cluster)
    ranges = min(splits, -(-k // bk))
    return (tiles * ranges * bw * mp if ranges > 1 else 1), tiles * consumer_grid(bw, cols)[0]


def launch_grid(m: int, n: int, k: int, bw: int, mp: int, splits: int, sms: int = SMS,
                bk: int = BK, cluster: int = 1) -> int:
    """One CTA per work item, at most one per SM (a CTA walks its items in turn); with a
    cluster pair, a pair of CTAs per item, whole pairs (`sms`: the CTAs resident at once)."""
    items = tiles_of(m, n, bw, mp, cluster) // cluster * min(splits, -(-k // bk))
    return min(items, sms // cluster) * cluster


def interleave_gate_up(w):
    """The gate-up weight (2 F x K, the F gate rows then the F up rows; numpy or torch, F a
    multiple of GATE_UP_GROUP) as the silu_mul epilogue takes it: each group of gate rows
    followed by the same outputs' up rows."""
    f2, kdim = w.shape
    if f2 % (2 * GATE_UP_GROUP):
        raise ValueError(f"interleave_gate_up: the gate-up weight's rows (2 F) must be a "
                         f"multiple of {2 * GATE_UP_GROUP}, got {f2}")
    g = GATE_UP_GROUP
    return w.reshape(2, f2 // (2 * g), g, kdim).swapaxes(0, 1).reshape(f2, kdim)


def example(rng: np.random.Generator, m: int = 5, n: int = 200, k: int = 1000,
            splits: int | None = None, mp: int | None = None, bw: int = 128,
            grid: int | None = None, dtype=bf16, scales: str | None = None,
            cols: int = 1, cluster: int = 1, epilogue: str | None = None) -> dict:
    """Random A (m x k) and W (n x k) of `dtype`; the reference is A @ W^T in f32 (rows of k
    elements a multiple of 16 bytes, as TMA wants: k a multiple of 8 for bf16, of 16 for
    e4m3). The semaphores start and end at zero. `cols` and `cluster` as make_smallm takes
    them.
    e4m3 (`scales` as make_smallm takes them): standard normal values quantised, the scales
    in [0.5, 2) times powers of two from 2^-3 to 2^3 (per row: a wrong row's scale shows),
    the reference the dequantised product in f64, the absolute tolerance that of the smallest
    scale (a number, so that it serves the semaphores' check too), 2^-10 sqrt(K): each
    stage's sums are added in f32, so only a GPU's limited-precision sums of one stage's 128
    products (the interpreter's are f32) add to the rounding of C.
    `epilogue` "residual": a random bf16 R (m x n) added; "silu_mul": W the gate-up weight of
    n / 2 outputs, interleaved, and C of n / 2 columns (the tolerance sqrt(K) times larger:
    the product of two sums of K terms)."""
    from ptxdsl.runtime.dtypes import bf16_to_f32, f32_to_bf16

    mp = mp or pad_m(m, max_mp(bw, dtype, cols, cluster))
    bk = BK if dtype == bf16 else BK_FP8
    splits = splits or pick_splits(m, n, k, bw, mp, bk=bk, cluster=cluster)
    size, nsem = workspace(m, n, k, bw, mp, splits, bk, cols, cluster)
    inputs: dict = {}
    if dtype == bf16:
        a = f32_to_bf16(rng.standard_normal((m, k), np.float32))
        w = f32_to_bf16(rng.standard_normal((n, k), np.float32))
        ref = bf16_to_f32(a) @ bf16_to_f32(w).T
        atol = 2 ** -7 * float(np.sqrt(k)) * 4
        if epilogue == "residual":
            inputs["r"] = f32_to_bf16(rng.standard_normal((m, n), np.float32))
            ref = ref + bf16_to_f32(inputs["r"])
        elif epilogue == "silu_mul":
            gate, up = ref[:, :n // 2].astype(np.float64), ref[:, n // 2:]
            ref = gate / (1 + np.exp(-gate)) * up
            w = interleave_gate_up(w)
            atol *= float(np.sqrt(k))
    else:
        from ptxdsl.fp8 import quantize

        a = quantize(rng.standard_normal((m, k)), dtype)
        w = quantize(rng.standard_normal((n, k)), dtype)
        sa, sb = ((rng.uniform(0.5, 2.0, size) * np.exp2(rng.integers(-3, 4, size)))
                  .astype(np.float32) for size in ((1, 1) if scales == "tensor" else (m, n)))
        inputs = {"scale_a": sa, "scale_b": sb}
        scale = np.outer(np.broadcast_to(sa, m), np.broadcast_to(sb, n)).astype(np.float64)
        ref = (a.astype(np.float64) @ w.astype(np.float64).T) * scale
        atol = 2 ** -10 * float(np.sqrt(k)) * float(scale.min())
    box = {"swizzle": "128B"}
    return {"grid": grid or launch_grid(m, n, k, bw, mp, splits, bk=bk, cluster=cluster),
            "inputs": {"w": w, "x": a, "ws": np.zeros(size, np.float32),
                       "sem": np.zeros(nsem, np.uint32), **inputs, "m": m, "n": n, "kdim": k,
                       "splits": splits},
            "tensor_maps": {"w": {"box": (bw, bk), **box},
                            "x": {"box": (mp // cluster, bk), **box}},
            "outputs": {"c": np.zeros(ref.shape, np.uint16)},
            "expected": {"c": ref, "sem": np.zeros(nsem, np.uint32)},
            "rtol": 2 ** -7, "atol": atol}


FAMILY = Family(
    name="gemm_smallm",
    summary="bf16 / e4m3 decode GEMM for M <= 256: swap-AB (C^T = W A^T), split-K with a "
            "deterministic slot sum, deep TMA ring; fp8 scales per tensor or per row",
    factory=make_smallm,
    defaults={"mp": 64, "bw": 128},
)
