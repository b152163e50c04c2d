"""`torch.ops.ptxdsl.rms_norm(x, weight, eps)`: x / sqrt(mean(x^2) + eps) * weight over the
last dimension, bf16 or f32, with the samples' one-row-per-CTA kernel (its warp count tuned
per shape). The backward is torch math (registered with register_autograd)."""

from __future__ import annotations

from functools import cache
from math import prod
from typing import Any

import torch

from .. import types as T
from ..compiler import KernelDef
from . import autotune
from .kernels import norm_configs, norm_sizes_text, rms_norm_kernel
from .opspec import Args, OpSpec, ScalarParam, TensorParam, dtype_name, register

_ELEM = {torch.bfloat16: T.bf16, torch.float32: T.f32}
_MAX_GRID = 2**31 - 1  # the kernel strides over rows by the grid, so the grid may be smaller
DEFAULT_EPS = 1e-5


def _check(args: Args) -> str | None:
    x, w, eps = args["x"], args["weight"], args["eps"]
    n = x.shape[-1]
    if w.dtype != x.dtype:
        return f"weight must have x's dtype ({dtype_name(x.dtype)}), got {w.dtype}"
    if tuple(w.shape) != (n,):
        return f"weight must have shape ({n},) (x's last dimension), got {tuple(w.shape)}"
    if not norm_configs(n, _ELEM[x.dtype]):
        return (f"x's last dimension must be {norm_sizes_text(_ELEM[x.dtype])} for "
                f"{dtype_name(x.dtype)} (a row is held in registers), got {n}")
    if prod(x.shape[:-1]) >= 2**32:
        return f"x must have fewer than 2**32 rows, got {prod(x.shape[:-1])}"
    if not eps >= 0:  # NaN too
        return f"eps must be >= 0, got {eps}"
    return None


def _output(args: Args) -> tuple[tuple[int, ...], torch.dtype]:
    return tuple(args["x"].shape), args["x"].dtype


@cache
def _tuner(n: int, elem: T.Scalar, eps: float) -> Any:
    def kernel(config: Any) -> KernelDef:
        return rms_norm_kernel(n, elem, eps, config["warps"])

    return autotune.tuner("ptxdsl::rms_norm", norm_configs(n, elem), kernel)


def _launch(args: Args, out: torch.Tensor, stream: int) -> None:
    x, w, eps = args["x"], args["weight"], float(args["eps"])
    n = x.shape[-1]
    rows = x.numel() // n
    elem = _ELEM[x.dtype]
    device = x.device.index

    def run(config: Any, y: torch.Tensor) -> None:
        kernel = rms_norm_kernel(n, elem, eps, config["warps"]).program().kernel(device=device)
        kernel[min(rows, _MAX_GRID), None, stream](x, w, y, rows)

    def trial(config: Any) -> torch.Tensor:
        y = torch.empty_like(out)
        run(config, y)
        return y

    # rows rounded up to a power of two: batch sizes vary, the best warp count barely does
    shape = (1 << (rows - 1).bit_length(), n, dtype_name(x.dtype))
    config = _tuner(n, elem, eps).choose(shape, trial, autotune.close(2**-6), device=device,
                                         tune=autotune.tuning_allowed())
    run(config, out)


def rms_norm_backward(x: torch.Tensor, weight: torch.Tensor, eps: float,
                      grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dL/dx, dL/dweight) of y = x * r * weight, r = 1 / sqrt(mean(x^2) + eps), in f32."""
    xf, wf, gf = x.float(), weight.float(), grad.float()
    r = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    gw = gf * wf
    dx = r * gw - xf * r.pow(3) * (gw * xf).mean(-1, keepdim=True)
    dw = (gf * xf * r).reshape(-1, x.shape[-1]).sum(0)
    return dx.to(x.dtype), dw.to(weight.dtype)


def _setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
    x, weight, *rest = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = rest[0] if rest else DEFAULT_EPS


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    x, weight = ctx.saved_tensors
    dx, dw = rms_norm_backward(x, weight, ctx.eps, grad)
    return dx, dw, None


SPEC = OpSpec(
    name="rms_norm",
    params=(
        TensorParam(name="x", dtypes=(torch.bfloat16, torch.float32)),
        TensorParam(name="weight", dtypes=(torch.bfloat16, torch.float32), rank=1),
        ScalarParam(name="eps", type="float", default=DEFAULT_EPS),
    ),
    check=_check,
    output=_output,
    launch=_launch,
)

rms_norm = register(SPEC)
rms_norm.register_autograd(_backward, setup_context=_setup_context)
