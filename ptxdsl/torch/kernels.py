"""The kernel families behind the torch ops, and the configs each may be tuned over.

The kernels are the library's (ptxdsl.kernels.gemm `make_gemm`, ptxdsl.kernels.gemm_fp8
`make_gemm_fp8`, ptxdsl.kernels.attention `make_attention`, ptxdsl.kernels.grouped_gemm
`make_grouped`; the norms' configs are in ptxdsl/torch/norms.py), built as
`ptxdsl.tools.precompile.Recipe`s, so that tuning builds them in parallel processes, and the
ops run the kernels that the library's tests and benchmarks check. This module does not
import torch."""

from __future__ import annotations

from functools import cache

from ..compiler import KernelDef
from ..tools.precompile import Recipe

# gemm: (bn, stages) pairs whose shared memory fits a CTA (bm = 128: bn 256 and 224 hold 3
# stages, bn 128 up to 6), each with and without a 2 x 1 cluster; the default (first) is the
# benchmarked 128 x 256 x 64, 3-stage kernel; last, that kernel on a stream-K walk (the
# tiles of a partial last wave shared K step by K step over every SM). 224-wide tiles store C
# in 32-column chunks and fill 128 SMs where 256-wide leave 20 idle (decoding: 256 x 14336).
GEMM_CONFIGS: tuple[dict[str, int], ...] = tuple(
    {"bn": bn, "stages": stages, "cluster": cluster}
    for bn, stages in ((256, 3), (224, 3), (128, 3), (128, 4), (128, 6))
    for cluster in (1, 2)
) + ({"bn": 256, "stages": 3, "cluster": 1, "streamk": 1},)
GEMM_BM = 128

# scaled_mm_fp8 (per-tensor scales, K = 128 per stage): the benchmarked 128 x 256, 3-stage
# kernel first, then 128 x 128 with 6 stages (both fill the shared memory), each with and
# without a 2 x 1 cluster.
FP8_CONFIGS: tuple[dict[str, int], ...] = tuple(
    {"bn": bn, "stages": stages, "cluster": cluster}
    for bn, stages in ((256, 3), (128, 6))
    for cluster in (1, 2)
)


def gemm_recipe(bn: int, stages: int, cluster: int, streamk: int = 0) -> Recipe:
    """The bf16 GEMM C = A @ B^T with 128 x bn x 64 tiles (`streamk`: on a stream-K walk)."""
    more = {"streamk": True} if streamk else {}
    return Recipe.of("ptxdsl.kernels.gemm", "make_gemm", bm=GEMM_BM, bn=bn, stages=stages,
                     cluster=(cluster, 1, 1), **more)


# The *_kernel functions are memoised although Recipe.build keeps one KernelDef per recipe:
# they are on every op call's path, and a cache hit skips building the recipe.


@cache
def gemm_kernel(bn: int, stages: int, cluster: int, streamk: int = 0) -> KernelDef:
    return gemm_recipe(bn, stages, cluster, streamk).build()


# attention: head dims the sample builds; per (head dim, causal) the warpgroups take turns or
# not, the wait for P V is held after the softmax (fence_cta) or not, and at head dim 64 three
# consumer warpgroups (192-row tiles) or two; first (what runs untuned, e.g. while a CUDA
# graph is captured) the benchmark's fastest: the hold, no turns, and at head dim 64 three
# warpgroups (BENCHMARKS.md)
ATTENTION_HEAD_DIMS = (64, 128)


def attention_configs(d: int) -> tuple[dict[str, int], ...]:
    two = ({"pingpong": 0, "hold": 1, "nwg": 2}, {"pingpong": 0, "hold": 0, "nwg": 2},
           {"pingpong": 1, "hold": 0, "nwg": 2})
    return ({"pingpong": 0, "hold": 1, "nwg": 3}, *two) if d == 64 else two


def attention_recipe(d: int, causal: bool, pingpong: int, hold: int, nwg: int = 2) -> Recipe:
    """The forward attention of head dim d (ptxdsl.kernels.attention `make_attention`)."""
    return Recipe.of("ptxdsl.kernels.attention", "make_attention", d=d, causal=bool(causal),
                     pingpong=bool(pingpong), hold=bool(hold), nwg=nwg)


@cache
def attention_kernel(d: int, causal: bool, pingpong: int, hold: int, nwg: int = 2) -> KernelDef:
    return attention_recipe(d, causal, pingpong, hold, nwg).build()


def fp8_recipe(bn: int, stages: int, cluster: int) -> Recipe:
    """The e4m3 GEMM C (bf16) = sa * sb * A @ B^T with 128 x bn x 128 tiles, sa and sb read
    from 1-element f32 device tensors."""
    return Recipe.of("ptxdsl.kernels.gemm_fp8", "make_gemm_fp8", bm=GEMM_BM, bn=bn, stages=stages,
                     cluster=(cluster, 1, 1))


@cache
def fp8_kernel(bn: int, stages: int, cluster: int) -> KernelDef:
    return fp8_recipe(bn, stages, cluster).build()


@cache
def grouped_kernel() -> KernelDef:
    """The grouped (mixture-of-experts) GEMM, contiguous layout (ptxdsl.kernels.grouped_gemm)."""
    return Recipe.of("ptxdsl.kernels.grouped_gemm", "make_grouped").build()
