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
        work = k.schedule("work", ((n + (BN - 1)) / BN,), group=8,
                          groups=(offs, experts, BM, cap) if masked else (offs, experts, BM))
        with k.role("producer", 0, 4, regs=40):
            with k.if_((k.warp == 0) & k.elect()):
                with k.for_("w", work) as w:
                    m0 = k.let("m0", w.row0 + w.m * BM)
                    n0 = k.let("n0", w.n * BN)
                    with k.for_("kt", 0, ktiles) as kt:
                        load_stage(k, ring, a, b, (kt * BK).to(s32), [m0.to(s32)],
                                   [n0.to(s32), w.group.to(s32)])
                        k.commit(ring)
        with k.role("consumer", 4, 12, regs=232):
            wg, leader, row, col = consumer_lanes(k)
            with k.for_("w", work) as w:
                m0 = k.let("m0", w.row0 + w.m * BM)
                n0 = k.let("n0", w.n * BN)
                acc = k.let("acc", type=ptxdsl.array(f32, BN // 2))
                main_loop(k, ring, [acc], wg, 0, ktiles, steps=BK // 16)
                valid = k.let("valid", w.rows - w.m * BM)  # rows of this tile in the expert

                def registers() -> None:
                    """Store the tile's rows inside the expert from registers."""
                    with k.for_("j2", 0, BN // 8, unroll=True) as j:
                        with k.for_("i2", 0, 2, unroll=True) as i:
                            r = k.let("r", wg * 64 + row + i * 8)
                            with k.if_((r < valid) & (m0 + r < tokens) &
                                       (n0 + j * 8 + col < n)):
                                cp[(m0 + r) * n + n0 + j * 8 + col] = k.bf16x2(
                                    acc[4 * j + 2 * i].to(bf16), acc[4 * j + 2 * i + 1].to(bf16))

                if cs is None:
                    registers()
                else:
                    with k.if_(valid >= BM):
                        store_c(k, [acc], cs, c, m0, n0, wg, leader, row, col, bn=BN,
                                chunks=BN // 64)
                    with k.else_():
                        registers()
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


def tiles(rows: list[int], n: int) -> int:
    return sum(-(-r // BM) for r in rows) * -(-n // BN)


def launch_grid(rows: list[int], n: int, sms: int = SMS) -> int:
    """CTAs for a launch: one per tile, at most one per SM (a CTA walks its tiles in turn);
    `rows` the rows each expert uses."""
    return max(1, min(sms, tiles(rows, n)))


def example(rng: np.random.Generator, rows: list[int] | None = None, n: int = 1032,
            k: int = 520, masked: bool = False, cap: int = 0, grid: int | None = None) -> dict:
    """Random bf16 tokens and expert weights; `rows[g]` tokens for expert g (ragged, empty
    allowed; masked: `cap` rows per expert, of which min(rows[g], cap) are used). The
    reference is each expert's A @ B^T in f32; the rows no expert owns stay zero. The
    kernel's `offs` is the E + 1 row offsets, or the E counts when masked."""
    from ptxdsl.runtime.dtypes import bf16_to_f32, f32_to_bf16

    rows = [300, 0, 129, 1, 64] if rows is None else rows
    e = len(rows)
    if masked:
        cap = cap or max(rows)
        starts = [g * cap for g in range(e)]
        counts = [min(r, cap) for r in rows]
        total, offs = e * cap, np.array(rows, np.uint32)
    else:
        starts = [int(x) for x in np.cumsum([0, *rows])[:-1]]
        counts = list(rows)
        total = int(sum(rows))
        offs = np.array([0, *np.cumsum(rows)], np.uint32)
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
