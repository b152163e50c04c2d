"""Single-warpgroup wgmma kernels over the forms the language offers (tile width N, swizzle,
input type, A from shared memory or registers, negation), with their numpy references; run
by the interpreter tests (test_wgmma.py) and on the GPU (test_gemm_gpu.py)."""

from __future__ import annotations

import numpy as np

import ptxdsl
from ptxdsl import array, bf16, e4m3, e5m2, f16, f32, ptr, tmap, u32

TYPES = {"bf16": bf16, "f16": f16, "tf32": f32, "e4m3": e4m3, "e5m2": e5m2}


def types_of(dtype: str) -> tuple:
    """The input types of A and B: "e4m3.e5m2" mixes two fp8 types, any other name is both."""
    ta, _, tb = dtype.partition(".")
    return TYPES[ta], TYPES[tb or ta]


def tile_k(swizzle: int, dtype: str, both_mn: bool) -> int:
    """K per tile: one swizzle row of a K-major operand; 64 rows when both are MN-major or
    the layout is unswizzled (swizzle 16: 64 k in blocks of 16 bytes)."""
    return 64 if both_mn or swizzle == 16 else swizzle // types_of(dtype)[0].nbytes


def make_mma(n: int = 64, swizzle: int = 128, dtype: str = "bf16", a_regs: bool = False,
             neg_a: int = 0, neg_b: int = 0, a_mn: bool = False,
             b_mn: bool = False) -> ptxdsl.KernelDef:
    """C (64 x n, f32) = A (64 x K) @ B (n x K)^T, K a multiple of the tile width, by one
    warpgroup: TMA loads K-tiles, wgmma accumulates them. K-major operands are tiles of
    `swizzle`-byte rows of K; MN-major ones (A stored K x 64, B stored K x n in global memory)
    are blocks of `swizzle`-byte rows along M / N, one row per k."""
    t, tb = types_of(dtype)
    bk = tile_k(swizzle, dtype, a_mn and b_mn)
    width = swizzle // t.nbytes  # elements per row
    kstep = 32 // t.nbytes  # k per wgmma
    name = (f"mma_{dtype.replace('.', '_')}_n{n}_sw{swizzle}{'_areg' if a_regs else ''}"
            f"_neg{neg_a}{neg_b}{'_amn' if a_mn else ''}{'_bmn' if b_mn else ''}")

    @ptxdsl.kernel(threads=128, name=name)
    def mma(k, a: tmap(t, 2), b: tmap(tb, 2), c: ptr(f32), kdim: u32):
        plain = swizzle == 16  # unswizzled: [k blocks][rows][16 bytes]
        sa = k.shared("sa", t, [64 // width, bk, width], swizzle=swizzle, major="mn") if a_mn \
            else k.shared("sa", t, [bk // width, 64, width], swizzle=16) if plain \
            else k.shared("sa", t, [64, bk], swizzle=swizzle)
        sb = k.shared("sb", tb, [n // width, bk, width], swizzle=swizzle, major="mn") if b_mn \
            else k.shared("sb", tb, [bk // width, n, width], swizzle=16) if plain \
            else k.shared("sb", tb, [n, bk], swizzle=swizzle)
        bar = k.mbarrier("bar", count=1)
        tid = k.let("tid", k.tid.x)
        with k.if_(tid == 0):
            k.mbarrier_init(bar)
            k.fence_mbarrier_init()
        k.bar_sync(0)
        acc = k.let("acc", 0.0, array(f32, n // 2))
        phase = k.let("phase", 0)
        q = k.let("q", tid / 32)
        lane = k.let("lane", k.laneid)
        afrag = k.let("afrag", type=array(t, 8)) if a_regs else None
        with k.for_("kt", 0, kdim / bk) as kt:
            with k.if_(tid == 0):
                k.mbarrier_arrive_expect_tx(bar, 64 * bk * t.nbytes + n * bk * t.nbytes)
                kc = (kt * bk).to(ptxdsl.s32)
                if a_mn:
                    for blk in range(64 // width):
                        k.tma_load(sa[blk], a, [blk * width, kc], bar)
                elif plain:
                    for blk in range(bk // width):
                        k.tma_load(sa[blk], a, [kc + blk * width, 0], bar)
                else:
                    k.tma_load(sa, a, [kc, 0], bar)
                if b_mn:
                    for blk in range(n // width):
                        k.tma_load(sb[blk], b, [blk * width, kc], bar)
                elif plain:
                    for blk in range(bk // width):
                        k.tma_load(sb[blk], b, [kc + blk * width, 0], bar)
                else:
                    k.tma_load(sb, b, [kc, 0], bar)
            k.mbarrier_wait(bar, phase)
            k.assign(phase, phase ^ 1)
            with k.for_("kk", 0, bk // kstep, unroll=True) as kk:
                if a_regs:
                    with k.for_("e", 0, 8, unroll=True) as e:
                        afrag[e] = sa[16 * q + lane / 4 + e / 2 % 2 * 8,
                                     kk * kstep + e / 4 * 8 + lane % 4 * 2 + e % 2]
                    k.wgmma_fence()
                    pb = sb[0, kk * kstep, 0] if b_mn else sb[0, kk * kstep]
                    k.wgmma(acc, afrag, pb, True, neg_a, neg_b)
                    k.wgmma_commit()
                    k.wgmma_wait(0)
                else:
                    pa = sa[0, kk * kstep, 0] if a_mn else sa[kk * 2, 0, 0] if plain \
                        else sa[0, kk * kstep]
                    pb = sb[0, kk * kstep, 0] if b_mn else sb[kk * 2, 0, 0] if plain \
                        else sb[0, kk * kstep]
                    k.wgmma_fence()
                    k.wgmma(acc, pa, pb, True, neg_a, neg_b)
            if not a_regs:
                k.wgmma_commit()
                k.wgmma_wait(0)
            k.bar_sync(0)
        row = k.let("row", 16 * q + lane / 4)
        with k.for_("j", 0, n // 8, unroll=True) as j:
            with k.for_("i", 0, 2, unroll=True) as i:
                with k.for_("h", 0, 2, unroll=True) as h:
                    c[(row + i * 8) * n + j * 8 + lane % 4 * 2 + h] = acc[4 * j + 2 * i + h]

    return mma


def inputs(rng: np.random.Generator, n: int, kdim: int, dtype: str):
    """(A, B) as the arrays TMA reads (bf16 as uint16 bits, fp8 as ml_dtypes arrays) and
    (A, B) as float64 values."""
    from ptxdsl.fp8 import quantize
    from ptxdsl.runtime.dtypes import bf16_to_f32, f32_to_bf16

    a = rng.standard_normal((64, kdim), np.float32)
    b = rng.standard_normal((n, kdim), np.float32)
    ta, tb = types_of(dtype)
    if ta.is_fp8:  # spread over the fp8 range: large and subnormal values
        a8, b8 = quantize(a * 64, ta), quantize(b / 64, tb)
        return a8, b8, a8.astype(np.float64), b8.astype(np.float64)
    if dtype == "bf16":
        ab, bb = f32_to_bf16(a), f32_to_bf16(b)
        return ab, bb, bf16_to_f32(ab).astype(np.float64), bf16_to_f32(bb).astype(np.float64)
    if dtype == "f16":
        ah, bh = a.astype(np.float16), b.astype(np.float16)
        return ah, bh, ah.astype(np.float64), bh.astype(np.float64)
    trunc = np.uint32(0xFFFFE000)  # tf32: the tensor cores read 10 mantissa bits
    at, bt = (a.view(np.uint32) & trunc).view(np.float32), (b.view(np.uint32) & trunc).view(
        np.float32)
    return at, bt, at.astype(np.float64), bt.astype(np.float64)


def reference(a: np.ndarray, b: np.ndarray, neg_a: int, neg_b: int) -> np.ndarray:
    sign = (-1.0) ** (neg_a + neg_b)
    return sign * (a @ b.T)


def operands(a: np.ndarray, b: np.ndarray, form: tuple) -> tuple[np.ndarray, np.ndarray]:
    """A and B as global memory holds them: MN-major operands transposed (K x 64, K x n)."""
    a_mn, b_mn = (form[6], form[7]) if len(form) > 6 else (False, False)
    return (np.ascontiguousarray(a.T) if a_mn else a), (np.ascontiguousarray(b.T) if b_mn
                                                        else b)


def boxes(form: tuple) -> tuple[tuple[int, int], tuple[int, int], int]:
    """The TMA boxes of A and B (outermost first) and K per tile, for a form."""
    n, swizzle, dtype = form[:3]
    a_mn, b_mn = (form[6], form[7]) if len(form) > 6 else (False, False)
    width = swizzle // types_of(dtype)[0].nbytes
    bk = tile_k(swizzle, dtype, a_mn and b_mn)
    if swizzle == 16:  # one 16-byte k block per copy
        return (64, width), (n, width), bk
    return ((bk, width) if a_mn else (64, bk)), ((bk, width) if b_mn else (n, bk)), bk


# the forms exercised: (n, swizzle, dtype, a_regs, neg_a, neg_b[, a_mn, b_mn])
FORMS = [
    (64, 128, "bf16", False, 0, 0), (256, 128, "bf16", False, 0, 0),
    (8, 128, "bf16", False, 0, 0), (136, 64, "bf16", False, 0, 0),
    (32, 32, "bf16", False, 0, 0), (128, 128, "f16", False, 0, 0),
    (64, 128, "tf32", False, 0, 0), (64, 128, "bf16", True, 0, 0),
    (64, 128, "bf16", False, 1, 0), (48, 64, "f16", True, 0, 1),
    (256, 128, "bf16", False, 0, 0, False, True), (64, 128, "bf16", False, 0, 0, True, False),
    (128, 64, "f16", False, 0, 0, True, True), (64, 32, "bf16", True, 0, 0, False, True),
    (64, 16, "bf16", False, 0, 0), (256, 16, "f16", False, 0, 1), (32, 16, "tf32", False, 0, 0),
    (64, 128, "e4m3", False, 0, 0), (256, 128, "e4m3", False, 0, 0),
    (128, 64, "e5m2", False, 0, 1), (64, 128, "e4m3.e5m2", False, 1, 0),
    (32, 32, "e5m2.e4m3", False, 0, 0), (64, 16, "e4m3", False, 0, 0),
]
