"""The small-M (decode) bf16 GEMM: swap-AB with split-K, with the Python API.

C = A @ W^T (A: M x K activations, W: N x K weights, row-major bf16; C: M x N bf16, f32
accumulation) for the few token rows of decoding (M = 1 to 256), where the work is streaming
W from memory. The tensor cores' smallest tile is 64 rows, so the kernel computes C^T = W A^T:
a `bw`-row weight tile (64, 128 or 256 rows of N; consumer warpgroups of 64 or 128 rows) is
the wgmma's A operand and the activation tile (`mp` rows of M, a multiple of 8 up to 256) its B
operand, both read from shared memory K-major (what fp8 wgmma needs too). Rows of A past M
are zero-filled by the tensor map and never stored.

Split-K keeps every SM streaming weights when the N / bw tiles are fewer than SMs: the
schedule (`k.schedule(..., splits=S)`) cuts each tile's K steps into S ranges, one work item
each. A range that owns its whole tile stores C from its accumulators. Otherwise it stores its
f32 partial into its slot of a workspace (`ws`: tiles x warpgroups x S slots x its rows x mp
f32, each thread's values four at a time, coalesced), counts it on its warpgroup's semaphore
(`sem`, zero between launches), and the range that completes the count sums every slot in
slot order into C (so the result does not depend on which range finishes last: repeated runs
are bit-identical) and leaves the semaphore zero.

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
from ptxdsl import array, bf16, f32, ptr, s32, tmap, u32
from ptxdsl.kernels.family import Family

from .wgmma import consumer_lanes, count_part, load_stage, main_loop

BK = 64  # K per stage: one 128-byte swizzled row of bf16
SMEM = 227 * 1024  # shared memory a CTA may take on the H100 / H200
MAX_STAGES = 12


def stages_for(bw: int, mp: int) -> int:
    """The deepest ring that fits shared memory: a stage holds bw + mp rows of BK bf16."""
    per = (bw + mp) * BK * 2
    return max(2, min(MAX_STAGES, (SMEM - 1024) // per))


def make_smallm(mp: int = 64, bw: int = 128, stages: int | None = None,
                consumer_regs: int = 232) -> ptxdsl.KernelDef:
    """The swap-AB kernel for activation tiles of `mp` rows (8 to 256, a multiple of 8) and
    weight tiles of `bw` rows (64 or 128: one consumer warpgroup per 64; 256: two of 128 rows,
    each two m64 accumulators, for mp up to 128), with a `stages`-deep TMA ring (default: as
    deep as shared memory allows, `stages_for`). Taller weight tiles read each activation
    tile for more weight rows: less shared-memory traffic from L2 as M grows."""
    if mp % 8 or not 8 <= mp <= 256:
        raise ValueError(f"make_smallm: mp is a multiple of 8 from 8 to 256, got {mp}")
    if bw not in (64, 128, 256):
        raise ValueError(f"make_smallm: bw is 64, 128 or 256, got {bw}")
    if bw == 256 and mp > 128:
        raise ValueError(f"make_smallm: bw 256 holds two accumulators a thread, for mp up to "
                         f"128 (registers), got mp {mp}")
    stages = stages or stages_for(bw, mp)
    consumers = min(bw // 64, 2)
    wm = bw // consumers  # weight rows per consumer warpgroup
    mw = wm // 64  # its m64 accumulators
    nacc = mp // 2  # f32 per thread of an m64 x mp C^T accumulator
    # slots summed at a time: their loads take registers
    unroll = max(1, min(4, 128 // (mw * nacc)))
    name = f"gemm_smallm_m{mp}_w{bw}_s{stages}"

    def gemm_smallm(k, w: tmap(bf16, 2), x: tmap(bf16, 2), c: ptr(bf16), ws: ptr(f32),
                    sem: ptr(u32), m: u32, n: u32, kdim: u32, splits: u32):
        ring = k.pipeline("ring", stages, a=(bf16, [bw, BK], 1024, 128),
                          b=(bf16, [mp, BK], 1024, 128))
        last = k.shared("last", u32, [consumers])  # a warpgroup's 'my range completed it'
        with k.if_(k.tid.x == 0):  # the descriptors are parameters: fetched while we wait
            k.tma_prefetch_desc(w)
            k.tma_prefetch_desc(x)
        # everything above is this CTA's own; C, the workspace and the semaphores may still
        # be in use by the grid before (and A is often its output)
        k.griddep_wait()
        ktiles = k.let("ktiles", (kdim + (BK - 1)) / BK)
        work = k.schedule("work", ((n + (bw - 1)) / bw, (m + (mp - 1)) / mp), ksteps=ktiles,
                          splits=splits)
        with k.role("producer", 0, 4, regs=40):
            with k.if_((k.warp == 0) & k.elect()):
                with k.for_("it", work) as it:
                    with k.for_("kt", it.k0, it.k1) as kt:
                        load_stage(k, ring, w, x, (kt * BK).to(s32), [(it.m * bw).to(s32)],
                                   [(it.n * mp).to(s32)])
                        k.commit(ring)
        with k.role("consumer", 4, 4 * (1 + consumers), regs=consumer_regs):
            wg, leader, row, col = consumer_lanes(k)
            with k.for_("it", work) as it:
                accs = [k.let("acc" if mw == 1 else f"acc{r}", type=array(f32, nacc))
                        for r in range(mw)]
                main_loop(k, ring, accs, wg, it.k0, it.k1, steps=BK // 16, wm=wm)
                write = k.let("write", it.whole)
                with k.if_(~it.whole):
                    k.assign(write, sum_slots(k, it, accs, last, ws, sem, wg, leader))
                with k.if_(write):
                    store(k, it, accs, c, m, n, wg, row, col)

    def sum_slots(k, it, accs, last, ws, sem, wg, leader):
        """Store this range's partial in its slot, count it on the warpgroup's semaphore, and
        in the range that completes the count sum every slot, in slot order, into `accs`
        (leaving the semaphore zero). Returns the predicate 'this range completed it'. A tile
        has it.splits slots: min(splits, K steps), as `workspace` counts them."""
        t = k.tid.x % 128
        tile = k.let("tile", it.tile * consumers + wg)  # this warpgroup's rows of the tile
        plane = 64 * mp  # f32 elements of one m64 block's slot
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

    def store(k, it, accs, c, m, n, wg, row, col) -> None:
        """C from the C^T fragments: acc[4 j + 2 i + e] of m64 block r is C^T row (64 r + row
        + 8 i) and column (8 j + col + e) of the warpgroup's rows of the tile, i.e. C[m, n]
        with m in the tile's columns."""
        n0 = k.let("n0", it.m * bw + wg * wm + row)
        m0 = k.let("m0", it.n * mp + col)
        for r, acc in enumerate(accs):
            with k.for_(f"j{r}" if r else "j", 0, mp // 8, unroll=True) as j:
                with k.for_(f"i{r}" if r else "i", 0, 2, unroll=True) as i:
                    gn = n0 + (r * 64 + i * 8)
                    with k.for_(f"e{r}" if r else "e", 0, 2, unroll=True) as e:
                        gm = m0 + j * 8 + e
                        with k.if_((gm < m) & (gn < n)):
                            c[gm * n + gn] = acc[4 * j + 2 * i + e].to(bf16)

    return ptxdsl.kernel(threads=128 * (1 + consumers), name=name)(gemm_smallm)


gemm_smallm = make_smallm()  # the family's default build: up to 64 rows, 128-row weight tiles

SMS = 132  # H100 / H200
MIN_KSTEPS = 4  # the fewest K steps a split range is worth


def pad_m(m: int) -> int:
    """The activation tile for M rows: the power of two from 8 to 256 that holds them (one
    kernel per bucket; a decode GEMM's time barely depends on M)."""
    return max(8, min(256, 1 << (m - 1).bit_length()))


def pick_splits(m: int, n: int, k: int, bw: int, mp: int, sms: int = SMS) -> int:
    """As many K ranges per tile as fill the SMs once (each range at least MIN_KSTEPS K
    steps)."""
    tiles = -(-n // bw) * -(-m // mp)
    return max(1, min(sms // tiles, -(-k // BK) // MIN_KSTEPS))


def workspace(m: int, n: int, k: int, bw: int, mp: int, splits: int) -> tuple[int, int]:
    """(f32 elements of the workspace, u32 semaphores) of a launch, at least one of each (a
    launch takes no empty array)."""
    tiles = -(-n // bw) * -(-m // mp)
    ranges = min(splits, -(-k // BK))
    return (tiles * ranges * bw * mp if ranges > 1 else 1), tiles * min(bw // 64, 2)


def launch_grid(m: int, n: int, k: int, bw: int, mp: int, splits: int, sms: int = SMS) -> int:
    """One CTA per work item, at most one per SM (a CTA walks its items in turn)."""
    items = -(-n // bw) * -(-m // mp) * min(splits, -(-k // BK))
    return min(items, sms)


def example(rng: np.random.Generator, m: int = 5, n: int = 200, k: int = 1000,
            splits: int | None = None, mp: int | None = None, bw: int = 128,
            grid: int | None = None) -> dict:
    """Random bf16 A (m x k) and W (n x k); the reference is A @ W^T in f32 (k and n multiples
    of 8, as TMA wants 16-byte row pitches). The semaphores start and end at zero."""
    from ptxdsl.runtime.dtypes import bf16_to_f32, f32_to_bf16

    mp = mp or pad_m(m)
    splits = splits or pick_splits(m, n, k, bw, mp)
    a = f32_to_bf16(rng.standard_normal((m, k), np.float32))
    w = f32_to_bf16(rng.standard_normal((n, k), np.float32))
    ref = bf16_to_f32(a) @ bf16_to_f32(w).T
    size, nsem = workspace(m, n, k, bw, mp, splits)
    box = {"swizzle": "128B"}
    return {"grid": grid or launch_grid(m, n, k, bw, mp, splits),
            "inputs": {"w": w, "x": a, "ws": np.zeros(size, np.float32),
                       "sem": np.zeros(nsem, np.uint32), "m": m, "n": n, "kdim": k,
                       "splits": splits},
            "tensor_maps": {"w": {"box": (bw, BK), **box}, "x": {"box": (mp, BK), **box}},
            "outputs": {"c": np.zeros((m, n), np.uint16)},
            "expected": {"c": ref, "sem": np.zeros(nsem, np.uint32)},
            "rtol": 2 ** -7, "atol": 2 ** -7 * float(np.sqrt(k)) * 4}


FAMILY = Family(
    name="gemm_smallm",
    summary="bf16 decode GEMM for M <= 256: swap-AB (C^T = W A^T), split-K with a "
            "deterministic slot sum, deep TMA ring",
    factory=make_smallm,
    defaults={"mp": 64, "bw": 128},
)
