"""The single-warpgroup wgmma GEMM with the Python API (twin of gemm_simple.ptxdsl)."""

import numpy as np

import ptxdsl
from ptxdsl import array, bf16, f32, ptr, s32, tmap, u32


@ptxdsl.kernel(threads=128)
def gemm_simple(k, a: tmap(bf16, 2), b: tmap(bf16, 2), c: ptr(bf16), m: u32, n: u32,
                kdim: u32):
    sa = k.shared("sa", bf16, [64, 64], swizzle=128)
    sb = k.shared("sb", bf16, [128, 64], swizzle=128)
    bar = k.mbarrier("bar", count=1)
    tid = k.let("tid", k.tid.x)
    m0 = k.let("m0", k.ctaid.y * 64)
    n0 = k.let("n0", k.ctaid.x * 128)
    with k.if_(tid == 0):
        k.mbarrier_init(bar)
        k.fence_mbarrier_init()
    k.bar_sync(0)
    acc = k.let("acc", 0.0, array(f32, 64))
    phase = k.let("phase", 0)
    with k.for_("kt", 0, (kdim + 63) / 64) as kt:
        with k.if_(tid == 0):
            k.mbarrier_arrive_expect_tx(bar, 64 * 64 * 2 + 128 * 64 * 2)
            k.tma_load(sa, a, [(kt * 64).to(s32), m0.to(s32)], bar)
            k.tma_load(sb, b, [(kt * 64).to(s32), n0.to(s32)], bar)
        k.mbarrier_wait(bar, phase)
        k.assign(phase, phase ^ 1)
        k.wgmma_fence()
        with k.for_("kk", 0, 4, unroll=True) as kk:
            k.wgmma(acc, sa[0, kk * 16], sb[0, kk * 16])
        k.wgmma_commit()
        k.wgmma_wait(0)
        k.bar_sync(0)
    row0 = k.let("row0", m0 + tid / 32 * 16 + tid % 32 / 4)
    col0 = k.let("col0", n0 + tid % 4 * 2)
    with k.for_("j", 0, 16, unroll=True) as j:
        with k.for_("i", 0, 2, unroll=True) as i:
            with k.if_((row0 + i * 8 < m) & (col0 + j * 8 < n)):
                c[(row0 + i * 8) * n + col0 + j * 8] = k.bf16x2(
                    acc[4 * j + 2 * i].to(bf16), acc[4 * j + 2 * i + 1].to(bf16))


SMALL = {"m": 128, "n": 256, "k": 128}


def example(rng: np.random.Generator, m: int = 520, n: int = 1000, k: int = 776) -> dict:
    """Random bf16 A (m x k) and B (n x k); the reference is A @ B^T in f32; n is even and
    k a multiple of 8 (TMA row pitches are multiples of 16 bytes)."""
    from ptxdsl.runtime.dtypes import bf16_to_f32, f32_to_bf16

    a = f32_to_bf16(rng.standard_normal((m, k), np.float32))
    b = f32_to_bf16(rng.standard_normal((n, k), np.float32))
    ref = bf16_to_f32(a) @ bf16_to_f32(b).T
    box = {"swizzle": "128B"}
    return {"grid": (-(-n // 128), -(-m // 64)),
            "inputs": {"a": a, "b": b, "m": m, "n": n, "kdim": k},
            "tensor_maps": {"a": {"box": (64, 64), **box}, "b": {"box": (128, 64), **box}},
            "outputs": {"c": np.zeros(m * n, np.uint16)}, "expected": {"c": ref.reshape(-1)},
            "rtol": 2 ** -7, "atol": 2 ** -7 * float(np.sqrt(k)) * 4}
