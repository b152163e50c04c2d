"""`torch.ops.ptxdsl.scaled_mm_fp8(a, b, scale_a, scale_b)`: C (bf16, M x N) = scale_a *
scale_b * A @ B^T with A (M x K) and B (N x K) e4m3 (unit inner stride), scale_a and scale_b
f32 tensors of one element on the GPU; f32 accumulation in the tensor cores. What
`torch._scaled_mm(a, b.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16,
use_fast_accum=True)` computes, with the library's per-tensor-scaled fp8 GEMM, its tile width,
stage count and cluster pairing tuned per shape; up to SMALLM_MAX_M rows of A (decoding), the
e4m3 swap-AB split-K kernel (gemm_smallm, each 128 of K summed apart and added in f32), its
config tuned per shape, as the gemm op does for bf16 (129 to 256 rows: two activation tiles
of 128, or one of 256 over two warpgroups side by side). Forward only: no backward is
registered (autograd through it raises).

`torch.ops.ptxdsl.scaled_mm_fp8_block(a, b, scale_a, scale_b)`: the same product with
DeepGEMM's block scales, what `F.scaled_mm(a, b.t(), scale_a, ScalingType.BlockWise1x128,
scale_b, ScalingType.BlockWise128x128)` computes: scale_a f32 (M, K / 128), one scale a row
and 128 of K, column-major (strides (1, M), as torch and DeepGEMM store it); scale_b f32
(ceil(N / 128), K / 128) row-major, one a 128 x 128 block of B; K a multiple of 128, M of 4.
Each K block's products are summed in the tensor cores, then scaled and added in f32."""

from __future__ import annotations

from functools import cache
from typing import Any

import torch

from .. import types as T
from ..compiler import KernelDef
from ..kernels import gemm_smallm
from ..runtime.tensormap import TensorMap
from ..tools.autotune import Autotuner
from . import autotune
from .dispatch import register
from .gemm import check_operands, launchable, output_c, persistent_grid, smallm_plan
from .kernels import (
    FP8_BLOCK_CONFIGS,
    FP8_CONFIGS,
    GEMM_BM,
    SMALLM_MAX_M,
    fp8_block_kernel,
    fp8_block_recipe,
    fp8_kernel,
    fp8_recipe,
    smallm_configs,
    smallm_fp8_recipe,
    smallm_tile,
)
from .opspec import Args, OpSpec, Run, TensorParam

BK = 128  # K per stage: a 128-byte swizzle row of fp8


def _kernel(config: Any) -> KernelDef:
    return fp8_kernel(config["bn"], config["stages"], config["cluster"])


def _recipe(config: Any) -> Any:
    return fp8_recipe(config["bn"], config["stages"], config["cluster"])


TUNER = autotune.tuner("ptxdsl::scaled_mm_fp8", FP8_CONFIGS, _recipe)


def _block_kernel(config: Any) -> KernelDef:
    return fp8_block_kernel(config["bn"], config["stages"], config["cluster"])


BLOCK_TUNER = autotune.tuner("ptxdsl::scaled_mm_fp8_block", FP8_BLOCK_CONFIGS,
                             lambda c: fp8_block_recipe(c["bn"], c["stages"], c["cluster"]))


def _runner(config: Any, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
            scale_a: torch.Tensor | None = None) -> Run:
    """The run of `config` over a, b and C's layouts (maps re-pointed at each call); with
    `scale_a` (column-major, M x K / 128), the block-scaled kernel, whose row scales come in
    by a map over scale_a's row-major transpose."""
    block = scale_a is not None
    kernel, resident = launchable(_block_kernel if block else _kernel, tuple(config.items()),
                                  a.device.index)
    bn, cluster = config["bn"], config["cluster"]
    m, k = a.shape
    n = b.shape[0]
    ta = TensorMap(a, box=(GEMM_BM, BK), swizzle="128B")
    tb = TensorMap(b, box=(bn // cluster, BK), swizzle="128B")
    tc = TensorMap(c, box=(64, 64), swizzle="128B")
    grid = persistent_grid(resident, m, n, bn, cluster)
    if scale_a is not None:
        ts = TensorMap(scale_a.t(), box=(1, GEMM_BM))

        def run_block(tensors: tuple, out: torch.Tensor, stream: int) -> None:
            x, w, sx, sw = tensors
            kernel[grid, None, stream](ta.at(x.data_ptr()), tb.at(w.data_ptr()),
                                       tc.at(out.data_ptr()), ts.at(sx.data_ptr()), sw, m, n, k)

        return run_block

    def run(tensors: tuple, out: torch.Tensor, stream: int) -> None:
        x, w, sx, sw = tensors
        kernel[grid, None, stream](ta.at(x.data_ptr()), tb.at(w.data_ptr()),
                                   tc.at(out.data_ptr()), sx, sw, m, n, k)

    return run


@cache
def smallm_tuner(mp: int) -> Autotuner:
    """The tuner for up to mp rows of A, timing each candidate from a CUDA graph. Only the
    decode kernel's configs: unlike the gemm op at 128 rows and more, the dense kernel is no
    candidate, as it sums the whole of K in the tensor cores' fp8 precision (every M <=
    SMALLM_MAX_M gets the per-stage f32 sums)."""
    return autotune.tuner(f"ptxdsl::scaled_mm_fp8_smallm_m{mp}", smallm_configs(mp, T.e4m3),
                          lambda c: smallm_fp8_recipe(smallm_tile(mp, c, T.e4m3), c["bw"],
                                                      "tensor", c.get("cols", 1),
                                                      c.get("cluster", 1)),
                          timer=autotune.graph_timer)


def _plan(args: Args, out: torch.Tensor, stream: int) -> Run:
    a, b = args["a"], args["b"]
    m, k = a.shape
    n = b.shape[0]
    tensors = (a, b, args["scale_a"], args["scale_b"])
    if m <= SMALLM_MAX_M:
        mp = gemm_smallm.pad_m(m)
        return smallm_plan(tensors, out, mp, smallm_tuner(mp), scales="tensor")

    def trial(config: Any) -> torch.Tensor:
        c = torch.empty_like(out)
        _runner(config, a, b, c)(tensors, c, stream)
        return c

    # M is rounded up to a power of two: batch sizes vary, the best tiling barely does
    shape = (1 << (m - 1).bit_length(), n, k)
    config = TUNER.choose(shape, trial, autotune.close(2**-6), device=a.device.index,
                          tune=autotune.tuning_allowed())
    return _runner(config, a, b, out)


SPEC = OpSpec(
    name="scaled_mm_fp8",
    params=(
        TensorParam(name="a", dtypes=(torch.float8_e4m3fn,), rank=2, layout="tma"),
        TensorParam(name="b", dtypes=(torch.float8_e4m3fn,), rank=2, layout="tma"),
        TensorParam(name="scale_a", dtypes=(torch.float32,), numel=1),
        TensorParam(name="scale_b", dtypes=(torch.float32,), numel=1),
    ),
    check=check_operands,
    output=output_c,
    plan=_plan,
)

scaled_mm_fp8 = register(SPEC)


def check_block(args: Args) -> str | None:
    """check_operands, and the block scales' shapes: (M, K / 128) and (ceil(N / 128), K /
    128), K a multiple of 128 and M of 4 (the row scales' map reads rows of M f32)."""
    problem = check_operands(args)
    if problem is not None:
        return problem
    (m, k), n = args["a"].shape, args["b"].shape[0]
    if k % BK or m % 4:
        return f"K must be a multiple of {BK} and M of 4, got M = {m}, K = {k}"
    want = {"scale_a": (m, k // BK), "scale_b": (-(-n // BK), k // BK)}
    for name, shape in want.items():
        if tuple(args[name].shape) != shape:
            return f"{name} must have shape {shape}, got {tuple(args[name].shape)}"
    return None


def _block_plan(args: Args, out: torch.Tensor, stream: int) -> Run:
    a, b = args["a"], args["b"]
    tensors = (a, b, args["scale_a"], args["scale_b"])

    def trial(config: Any) -> torch.Tensor:
        c = torch.empty_like(out)
        _runner(config, a, b, c, args["scale_a"])(tensors, c, stream)
        return c

    m, k = a.shape
    shape = (1 << (m - 1).bit_length(), b.shape[0], k)
    config = BLOCK_TUNER.choose(shape, trial, autotune.close(2**-6), device=a.device.index,
                                tune=autotune.tuning_allowed())
    return _runner(config, a, b, out, args["scale_a"])


BLOCK_SPEC = OpSpec(
    name="scaled_mm_fp8_block",
    params=(
        TensorParam(name="a", dtypes=(torch.float8_e4m3fn,), rank=2, layout="tma"),
        TensorParam(name="b", dtypes=(torch.float8_e4m3fn,), rank=2, layout="tma"),
        TensorParam(name="scale_a", dtypes=(torch.float32,), rank=2, layout="tma_t"),
        TensorParam(name="scale_b", dtypes=(torch.float32,), rank=2),
    ),
    check=check_block,
    output=output_c,
    plan=_block_plan,
)

scaled_mm_fp8_block = register(BLOCK_SPEC)
