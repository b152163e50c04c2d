"""Grouped bf16 GEMM for mixture-of-experts layers, with the Python API (twin of
grouped_gemm.ptxdsl).

For every expert g, C[rows of g] = A[rows of g] @ B[g]^T: A is T x K (every expert's tokens),
B is E x N x K (one weight per expert), C is T x N, bf16 row-major, f32 accumulation.
- contiguous layout (the default): expert g owns rows offs[g] .. offs[g + 1] (`offs`: E + 1
  u32 prefix offsets; empty experts allowed);
- masked layout (`make_grouped(masked=True)`, decoding): expert g owns rows g * cap ..
  g * cap + min(counts[g], cap) (`offs` holds the E counts).
A tile schedule over the groups (`k.schedule(..., groups=...)`) gives each CTA of a
persistent grid its tiles; the main loop and the TMA-store epilogue are wgmma.py's, and a tile
that runs past its expert's last row is stored from registers instead, so that the next
expert's rows are never written (nor any row past C's `tokens`)."""

import numpy as np

import ptxdsl
from ptxdsl import bf16, f32, ptr, s32, tmap, u32
from ptxdsl.kernels.family import Family

from .wgmma import consumer_lanes, load_stage, main_loop, store_c

BM, BN, BK = 128, 256, 64


def expert_schedule(k, offs, experts, cap, n, *, masked: bool, bm: int, bn: int):
    """The tile schedule over the experts: each expert's rows in bm-row tile-rows (from the
    E + 1 row offsets `offs`, or with `masked` the E counts of rows at g * cap), bn-wide
    tile-columns of N, walked in bands of 8 tile-rows."""
    return k.schedule("work", ((n + (bn - 1)) / bn,), group=8,
                      groups=(offs, experts, bm, cap) if masked else (offs, experts, bm))


def tile_origin(k, w, *, bm: int, bn: int):
    """The first row of C (of A) and the first column of item w's tile."""
    return k.let("m0", w.row0 + w.m * bm), k.let("n0", w.n * bn)


def produce(k, ring, work, a, b, ktiles, *, bm: int, bn: int, bk: int,
            more=None) -> None:
    """The producer's walk (one elected thread): each item's K steps, a stage each of A's
    tile rows and the item's expert's B tile (b: E x N x K); `more(m0, kt)` adds the
    stage's further loads."""
    with k.if_((k.warp == 0) & k.elect()):
        with k.for_("w", work) as w:
            m0, n0 = tile_origin(k, w, bm=bm, bn=bn)
            with k.for_("kt", 0, ktiles) as kt:
                load_stage(k, ring, a, b, (kt * bk).to(s32), [m0.to(s32)],
                           [n0.to(s32), w.group.to(s32)])
                if more is not None:
                    more(m0, kt)
                k.commit(ring)


def store_tile(k, acc, cs, c, cp, w, m0, n0, n, tokens, wg, leader, row, col, *,
               bm: int, bn: int) -> None:
    """The epilogue of item w's tile (a consumer warpgroup's 64 rows, `acc`): through the
    staging tile `cs` and TMA stores (store_c) when the tile lies inside its expert, else
    from registers, only the rows inside the expert and C, so that the next expert's rows
    are never written (nor any row past C's `tokens`). `cs` None: always from registers."""
    valid = k.let("valid", w.rows - w.m * bm)  # rows of this tile in the expert

    def registers() -> None:
        """Store the tile's rows inside the expert from registers."""
        with k.for_("j2", 0, bn // 8, unroll=True) as j:
            with k.for_("i2", 0, 2, unroll=True) as i:
                r = k.let("r", wg * 64 + row + i * 8)
                with k.if_((r < valid) & (m0 + r < tokens) & (n0 + j * 8 + col < n)):
                    cp[(m0 + r) * n + n0 + j * 8 + col] = k.bf16x2(
                        acc[4 * j + 2 * i].to(bf16), acc[4 * j + 2 * i + 1].to(bf16))

    if cs is None:
        registers()
    else:
        with k.if_(valid >= bm):
            store_c(k, [acc], cs, c, m0, n0, wg, leader, row, col, bn=bn, chunks=bn // 64)
        with k.else_():
            registers()


def make_grouped(masked: bool = False, stages: int = 3, tma_epilogue: bool = True
                 ) -> ptxdsl.KernelDef:
    """The grouped GEMM for the contiguous layout (or the masked one) with a `stages`-deep
    ring. `tma_epilogue=False` stores every tile from registers and gives the 64 KiB of
    the TMA-store tile to the ring (4 stages fit): for decoding, whose tiles are all partial."""
    name = "grouped_gemm" + ("_masked" if masked else "") + ("" if stages == 3 else f"_s{stages}")
    name += "" if tma_epilogue else "_regs"

    def grouped_gemm(k, a: tmap(bf16, 2), b: tmap(bf16, 3), c: tmap(bf16, 2), cp: ptr(bf16),
                     offs: ptr(u32), experts: u32, cap: u32, n: u32, kdim: u32, tokens: u32):
        ring = k.pipeline("ring", stages, a=(bf16, [BM, BK], 1024, 128),
                          b=(bf16, [BN, BK], 1024, 128))
        cs = k.shared("cs", bf16, [2, 4, 64, 64], align=1024, swizzle=128) \
            if tma_epilogue else None
        ktiles = k.let("ktiles", (kdim + (BK - 1)) / BK)
        work = expert_schedule(k, offs, experts, cap, n, masked=masked, bm=BM, bn=BN)
        with k.role("producer", 0, 4, regs=40):
            produce(k, ring, work, a, b, ktiles, bm=BM, bn=BN, bk=BK)
        with k.role("consumer", 4, 12, regs=232):
            wg, leader, row, col = consumer_lanes(k)
            with k.for_("w", work) as w:
                m0, n0 = tile_origin(k, w, bm=BM, bn=BN)
                acc = k.let("acc", type=ptxdsl.array(f32, BN // 2))
                main_loop(k, ring, [acc], wg, 0, ktiles, steps=BK // 16)
                store_tile(k, acc, cs, c, cp, w, m0, n0, n, tokens, wg, leader, row, col,
                           bm=BM, bn=BN)
            with k.if_(leader):
                k.bulk_wait(0)

    return ptxdsl.kernel(threads=384, name=name)(grouped_gemm)


grouped_gemm = make_grouped()


def make_bounds() -> ptxdsl.KernelDef:
    """`grouped_bounds(ends, offs, experts, tokens)`: the E + 1 row offsets the grouped GEMM
    reads, made safe from E int32 row ends as torch's grouped GEMMs take them: 0 first, then
    each end clamped to 0 .. tokens and raised to the running maximum (a decreasing end owns
    no rows), so that no row count can wrap around. One warp, a max-scan over 32 ends at a
    time with shuffles."""

    def grouped_bounds(k, ends: ptr(s32), offs: ptr(u32), experts: u32, tokens: u32):
        lane = k.let("lane", k.laneid)
        carry = k.let("carry", 0, type=s32)  # the running maximum of the chunks before
        with k.if_(lane == 0):
            offs[0] = 0
        with k.for_("c", 0, (experts + 31) / 32) as c:
            g = k.let("g", c * 32 + lane)
            v = k.let("v", 0, type=s32)
            with k.if_(g < experts):
                k.assign(v, k.min(k.max(ends[g], 0), tokens.to(s32)))
            with k.for_("s", 0, 5, unroll=True) as s:
                up = k.let("up", k.shfl_up(v, 1 << s))
                with k.if_(lane >= (1 << s)):
                    k.assign(v, k.max(v, up))
            k.assign(v, k.max(v, carry))
            with k.if_(g < experts):
                offs[g + 1] = v.to(u32)
            k.assign(carry, k.shfl_idx(v, 31))

    return ptxdsl.kernel(threads=32, name="grouped_bounds")(grouped_bounds)

SMS = 132  # H100 / H200
SMALL = {"rows": [130, 0, 7], "n": 136, "k": 64}


def tiles(rows: list[int], n: int, bn: int = BN) -> int:
    return sum(-(-r // BM) for r in rows) * -(-n // bn)


def launch_grid(rows: list[int], n: int, sms: int = SMS, bn: int = BN) -> int:
    """CTAs for a launch: one per tile of bn columns, at most one per SM (a CTA walks its
    tiles in turn); `rows` the rows each expert uses."""
    return max(1, min(sms, tiles(rows, n, bn)))


def expert_rows(rows: list[int], masked: bool, cap: int
                ) -> tuple[list[int], list[int], int, np.ndarray, int]:
    """An example's layout of `rows[g]` tokens for expert g: each expert's first row of C and
    the rows it uses, C's rows, the kernel's `offs` (the E + 1 row offsets, or masked the E
    counts) and `cap` (masked: `cap` rows per expert, the most tokens if 0)."""
    e = len(rows)
    if masked:
        cap = cap or max(rows)
        return ([g * cap for g in range(e)], [min(r, cap) for r in rows], e * cap,
                np.array(rows, np.uint32), cap)
    return ([int(x) for x in np.cumsum([0, *rows])[:-1]], list(rows), int(sum(rows)),
            np.array([0, *np.cumsum(rows)], np.uint32), cap)


def example(rng: np.random.Generator, rows: list[int] | None = None, n: int = 1032,
            k: int = 520, masked: bool = False, cap: int = 0, grid: int | None = None) -> dict:
    """Random bf16 tokens and expert weights; `rows[g]` tokens for expert g (ragged, empty
    allowed; masked: `cap` rows per expert, of which min(rows[g], cap) are used). The
    reference is each expert's A @ B^T in f32; the rows no expert owns stay zero. The
    kernel's `offs` is the E + 1 row offsets, or the E counts when masked."""
    from ptxdsl.runtime.dtypes import bf16_to_f32, f32_to_bf16

    rows = [300, 0, 129, 1, 64] if rows is None else rows
    e = len(rows)
    starts, counts, total, offs, cap = expert_rows(rows, masked, cap)
    a = f32_to_bf16(rng.standard_normal((max(total, 1), k), np.float32))
    b = f32_to_bf16(rng.standard_normal((e, n, k), np.float32))
    ref = np.zeros((max(total, 1), n), np.float32)
    af, bf = bf16_to_f32(a), bf16_to_f32(b)
    for g in range(e):
        s0, cnt = starts[g], counts[g]
        ref[s0:s0 + cnt] = af[s0:s0 + cnt] @ bf[g].T
    c = np.zeros((max(total, 1), n), np.uint16)
    box = {"swizzle": "128B"}
    # C is one array behind the tensor map `c` (TMA stores) and the pointer `cp` (the rows
    # of a tile that runs past its expert); it starts at zero, and no row is written twice
    return {"grid": grid or launch_grid(counts, n),
            "inputs": {"a": a, "b": b, "c": c, "cp": c, "offs": offs, "experts": e, "cap": cap,
                       "n": n, "kdim": k, "tokens": max(total, 1)},
            "tensor_maps": {"a": {"box": (BM, BK), **box}, "b": {"box": (1, BN, BK), **box},
                            "c": {"box": (64, 64), **box}},
            "expected": {"cp": ref},
            "rtol": 2 ** -7, "atol": 2 ** -7 * float(np.sqrt(k)) * 4}


# the benchmarked default configuration (BENCHMARKS.md)
FAMILY = Family(
    name="grouped_gemm",
    summary="grouped (mixture-of-experts) bf16 GEMM, contiguous or masked layout",
    factory=make_grouped,
    defaults={"stages": 3},
    source="grouped_gemm.ptxdsl",
)
