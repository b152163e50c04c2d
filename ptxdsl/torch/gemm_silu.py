"""`torch.ops.ptxdsl.gemm_silu_mul(a, w)`: a decoder block's gate-up projection and its
SiLU-and-multiply in one op, silu(A Wg^T) * (A Wu^T) in bf16 (f32 math), of `w` the gate and
up weights interleaved (`interleave_gate_up(w_gate_up)`, once at setup: groups of
GATE_UP_GROUP gate rows, each followed by the same outputs' up rows, so that one thread of the
decode kernel holds matching gate and up sums). A is M x K, w is 2 F x K (2 F a multiple of
16), the output M x F. Up to SMALLM_MAX_M rows of A (decoding), the decode GEMM stores
silu(gate) * up from its f32 sums (gemm_smallm's "silu_mul" epilogue), which saves the GEMM's
2 F-wide C and a kernel; past that the dense GEMM and PyTorch's SiLU-and-multiply."""

from __future__ import annotations

import torch

from ..kernels.gemm_smallm import GATE_UP_GROUP, interleave_gate_up
from .dispatch import register
from .gemm import check_operands, fused_plan
from .opspec import Args, OpSpec, Run, TensorParam

__all__ = ["gemm_silu_mul", "interleave_gate_up"]


def _check(args: Args) -> str | None:
    rows = args["w"].shape[0]
    if rows % (2 * GATE_UP_GROUP):
        return (f"w (the interleaved gate-up weight, 2 F x K) must have a multiple of "
                f"{2 * GATE_UP_GROUP} rows, got {tuple(args['w'].shape)}")
    return check_operands({"a": args["a"], "b": args["w"]})


def _output(args: Args) -> tuple[tuple[int, ...], torch.dtype]:
    return (args["a"].shape[0], args["w"].shape[0] // 2), torch.bfloat16


def _plan(args: Args, out: torch.Tensor, stream: int) -> Run:
    return fused_plan({"a": args["a"], "b": args["w"]}, out, stream, "silu_mul")


SPEC = OpSpec(
    name="gemm_silu_mul",
    params=(
        TensorParam(name="a", dtypes=(torch.bfloat16,), rank=2, layout="tma"),
        TensorParam(name="w", dtypes=(torch.bfloat16,), rank=2, layout="tma"),
    ),
    check=_check,
    output=_output,
    plan=_plan,
)

gemm_silu_mul = register(SPEC)
