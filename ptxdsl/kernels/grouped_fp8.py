"""Grouped fp8 GEMM for mixture-of-experts layers with DeepGEMM's block scales (Python API
only, no text twin).

For every expert g, C[rows of g] = A'[rows of g] @ B'[g]^T, where A' and B' are the
dequantised inputs: A is T x K e4m3 (every expert's tokens) with one f32 scale per row and
128 of K, B is E x N x K e4m3 (one weight per expert) with one f32 scale per 128 x 128 block;
C is T x N bf16.
- sfa holds A's scales K-block-major, [ceil(K / 128)][T'] (T' >= T, a multiple of 4 for
  TMA's 16-byte row pitch), so that TMA brings a tile's 128 row scales with each stage;
- sfb holds B's, [E][ceil(N / 128)][ceil(K / 128)], read by the consumers;
- the layouts are grouped_gemm.py's: contiguous (`offs`: E + 1 u32 row offsets, empty
  experts allowed) or masked (`make_grouped_fp8(masked=True)`: expert g owns rows g * cap ..
  g * cap + min(counts[g], cap), `offs` holding the E counts).

The tile walk, the producer and the epilogue (TMA stores for a tile inside its expert, the
expert's rows alone from registers otherwise) are grouped_gemm.py's; the K loop is gemm_fp8's
block-scaled one (wgmma.block_scaled_loop): 128 x 128 x 128 tiles, each K block multiplied
into a temporary and promoted into the f32 accumulator with its row and block scales, the
two consumer warpgroups taking turns on the tensor cores. K need not be a multiple of 128:
TMA zero-fills the last block past K."""

import numpy as np

import ptxdsl
from ptxdsl import array, bf16, e4m3, f32, ptr, s32, tmap, u32
from ptxdsl.kernels.family import Family

from .gemm_fp8 import BLOCK, quantize_blocks
from .grouped_gemm import (
    expert_rows,
    expert_schedule,
    launch_grid,
    produce,
    store_tile,
    tile_origin,
)
from .wgmma import block_scaled_loop, consumer_lanes, first_turn, last_turn

BM, BN, BK = 128, 128, 128  # BN and BK: one block of B's scales per tile and stage
# A tile's row scales come from the 128-byte-aligned column before its first row (TMA faulted
# with CUDA_ERROR_ILLEGAL_INSTRUCTION on the H200 loading them from an expert's first row where
# that is not a multiple of 4), so the box holds SA_ALIGN more and the consumers skip m0 % it
SA_ALIGN = 32
SA_BOX = BM + SA_ALIGN


def make_grouped_fp8(masked: bool = False, stages: int = 5, tma_epilogue: bool = True
                     ) -> ptxdsl.KernelDef:
    """The block-scaled grouped GEMM for the contiguous layout (or the masked one) with a
    `stages`-deep ring; `tma_epilogue=False` stores every tile from registers and gives the
    staging tile's 32 KiB to the ring (6 stages fit): for decoding, whose tiles are partial."""
    name = "grouped_gemm_fp8" + ("_masked" if masked else "") + \
        ("" if stages == 5 else f"_s{stages}") + ("" if tma_epilogue else "_regs")

    def grouped_gemm_fp8(k, a: tmap(e4m3, 2), b: tmap(e4m3, 3), c: tmap(bf16, 2),
                         cp: ptr(bf16), sfa: tmap(f32, 2), sfb: ptr(f32), offs: ptr(u32),
                         experts: u32, cap: u32, n: u32, kdim: u32, tokens: u32):
        ring = k.pipeline("ring", stages, a=(e4m3, [BM, BK], 1024, 128),
                          b=(e4m3, [BN, BK], 1024, 128), sa=(f32, [1, SA_BOX], 128))
        cs = k.shared("cs", bf16, [2, BN // 64, 64, 64], align=1024, swizzle=128) \
            if tma_epilogue else None
        ktiles = k.let("ktiles", (kdim + (BK - 1)) / BK)
        nblocks = k.let("nblocks", (n + (BLOCK - 1)) / BLOCK)  # B's scale blocks along N
        work = expert_schedule(k, offs, experts, cap, n, masked=masked, bm=BM, bn=BN)
        with k.role("producer", 0, 4, regs=40):
            def row_scales(m0, kt) -> None:  # the tile's row scales of this K block
                k.tma_load(ring.sa, sfa, [(m0 - m0 % SA_ALIGN).to(s32), kt.to(s32)])

            produce(k, ring, work, a, b, ktiles, bm=BM, bn=BN, bk=BK, more=row_scales)
        with k.role("consumer", 4, 12, regs=232):
            wg, leader, row, col = consumer_lanes(k)
            first_turn(k, wg, 2)
            with k.for_("w", work) as w:
                m0, n0 = tile_origin(k, w, bm=BM, bn=BN)
                acc = k.let("acc", 0.0, array(f32, BN // 2))
                tmp = k.let("tmp", type=array(f32, BN // 2))
                sb_row = k.let("sb_row", (w.group * nblocks + n0 / BLOCK) * ktiles)
                block_scaled_loop(k, ring, [acc], [tmp], wg, ktiles, sfb, sb_row, row,
                                  nacc=BN // 2, sa_first=m0 % SA_ALIGN)
                store_tile(k, acc, cs, c, cp, w, m0, n0, n, tokens, wg, leader, row, col,
                           bm=BM, bn=BN)
            with k.if_(leader):
                k.bulk_wait(0)
            last_turn(k, wg)

    return ptxdsl.kernel(threads=384, name=name)(grouped_gemm_fp8)


grouped_gemm_fp8 = make_grouped_fp8()

SMALL = {"rows": [130, 0, 7], "n": 136, "k": 208}


def quantize(rng: np.random.Generator, e: int, n: int, k: int, total: int) -> dict:
    """Random tokens (`total` rows) and `e` expert weights quantised in blocks, as an fp8 MoE
    layer holds them: A in 1 x 128 blocks, each expert's B in 128 x 128 blocks, every row's
    magnitude in each K block drawn from 2^-8 .. 2^8 (so the scales differ from block to
    block by up to 2^16, and a scale applied to the wrong block shows). Returns the kernel's
    a, b, sfa and sfb, and the dequantised a and b (float64)."""
    kb = -(-k // BLOCK)
    kp = kb * BLOCK  # K padded to whole blocks with zeros (the kernel reads zeros past K)

    def data(*shape: int) -> np.ndarray:
        mag = np.exp2(rng.integers(-8, 9, (*shape, kb))).repeat(BLOCK, axis=-1)
        x = rng.standard_normal((*shape, kp)) * mag
        x[..., k:] = 0.0
        return x.astype(np.float32)

    a, sa = quantize_blocks(data(total), 1)
    qb = [quantize_blocks(w, BLOCK) for w in data(e, n)]
    b = np.stack([q for q, _ in qb])
    sfb = np.stack([s for _, s in qb])  # [E][ceil(N / 128)][K / 128]
    sfa = np.ones((kb, -(-total // 4) * 4), np.float32)
    sfa[:, :total] = sa.T
    a_deq = a.astype(np.float64) * np.repeat(sa, BLOCK, axis=1)
    b_deq = b.astype(np.float64) * np.repeat(np.repeat(sfb, BLOCK, axis=1)[:, :n], BLOCK, axis=2)
    return {"a": np.ascontiguousarray(a[:, :k]), "b": np.ascontiguousarray(b[:, :, :k]),
            "sfa": sfa, "sfb": sfb, "a_deq": a_deq[:, :k], "b_deq": b_deq[:, :, :k]}


UNTOUCHED = -77.0  # C's rows no expert owns hold this (a bf16 value) before and after


def example(rng: np.random.Generator, rows: list[int] | None = None, n: int = 264,
            k: int = 400, masked: bool = False, cap: int = 0, grid: int | None = None) -> dict:
    """Random block-quantised inputs (see quantize) and a float64 reference of each expert's
    dequantised product; `rows[g]` tokens for expert g (ragged, empty allowed; masked: `cap`
    rows per expert, of which min(rows[g], cap) are used). K a multiple of 16 and N of 8
    (TMA's 16-byte row pitches). C starts at UNTOUCHED, which the rows no expert owns keep.
    Each element is checked against the norms of its own row and weight row."""
    from ptxdsl.runtime.dtypes import f32_to_bf16

    rows = [300, 0, 129, 1, 64] if rows is None else rows
    e = len(rows)
    starts, counts, total, offs, cap = expert_rows(rows, masked, cap)
    total = max(total, 1)
    q = quantize(rng, e, n, k, total)
    ref = np.full((total, n), UNTOUCHED)
    atol = np.zeros((total, n))
    for g in range(e):
        s0, cnt = starts[g], counts[g]
        ref[s0:s0 + cnt] = q["a_deq"][s0:s0 + cnt] @ q["b_deq"][g].T
        # the tensor cores' fp8 sums, against what a row and a weight row's dot products
        # can reach (bench/fp8.py's tolerance; C's bf16 rounding: rtol)
        atol[s0:s0 + cnt] = 2 ** -6 / np.sqrt(k) * np.outer(
            np.linalg.norm(q["a_deq"][s0:s0 + cnt], axis=1),
            np.linalg.norm(q["b_deq"][g], axis=1))
    c = f32_to_bf16(np.full((total, n), UNTOUCHED, np.float32))
    box = {"swizzle": "128B"}
    # C is one array behind the tensor map `c` (TMA stores) and the pointer `cp` (the rows
    # of a tile that runs past its expert); no row is written twice
    return {"grid": grid or launch_grid(counts, n, bn=BN),
            "inputs": {"a": q["a"], "b": q["b"], "c": c, "cp": c, "sfa": q["sfa"],
                       "sfb": q["sfb"], "offs": offs, "experts": e, "cap": cap, "n": n,
                       "kdim": k, "tokens": total},
            "tensor_maps": {"a": {"box": (BM, BK), **box}, "b": {"box": (1, BN, BK), **box},
                            "c": {"box": (64, 64), **box}, "sfa": {"box": (1, SA_BOX)}},
            "expected": {"cp": ref}, "rtol": 2 ** -7, "atol": atol}


# the benchmarked default configuration
FAMILY = Family(
    name="grouped_fp8",
    summary="grouped (mixture-of-experts) e4m3 GEMM with DeepGEMM's block scales, bf16 C, "
            "contiguous or masked layout",
    factory=make_grouped_fp8,
    defaults={"stages": 5},
)
