"""The row operations over the last dimension, bf16 or f32, rows of any length, with the
norms family's one-row-per-CTA kernels (ptxdsl.kernels.norms; form and warp count tuned per
shape):

- `torch.ops.ptxdsl.rms_norm(x, weight, eps)`: x / sqrt(mean(x^2) + eps) * weight;
- `torch.ops.ptxdsl.layer_norm(x, weight, bias, eps)`: (x - mean) / sqrt(var + eps) * weight
  + bias (biased variance, as torch's layer_norm; weight and bias are required);
- `torch.ops.ptxdsl.softmax(x)`: exp(x - max) / sum(exp(x - max)).

A row held in registers takes `make_norm_row` where it is whole 16-byte vectors for every
thread (the benchmarked kernels) and `make_norm_masked` otherwise; a longer row takes
`make_norm_loop` (two sweeps). A load is 16 bytes where the row length and the tensors'
addresses allow, else the widest that divides both (one element for odd n).

eps is a compile-time constant of the kernels: each value builds (and tunes) its own. The
backwards are torch math (registered with register_autograd)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from math import prod
from typing import Any

import torch

from .. import types as T
from . import autotune
from .dispatch import register
from .kernels import norm_configs, norm_kernel, norm_recipe, norm_width
from .opspec import Args, OpSpec, Run, ScalarParam, TensorParam, dtype_name

_ELEM = {torch.bfloat16: T.bf16, torch.float32: T.f32}
_DTYPES = tuple(_ELEM)
_MAX_GRID = 2**31 - 1  # the kernel strides over rows by the grid, so the grid may be smaller
DEFAULT_EPS = 1e-5


def norm_grid(config: Any, rows: int, row_bytes: int, device: int) -> int:
    """One CTA per row; for the two-sweep form, few enough that the rows they hold stay in L2
    between the sweeps (at least one CTA per SM)."""
    if not config.get("loop"):
        return min(rows, _MAX_GRID)
    props = torch.cuda.get_device_properties(device)
    per_sm = min(8, max(1, props.L2_cache_size // (2 * row_bytes * props.multi_processor_count)))
    return min(rows, per_sm * props.multi_processor_count)


def _checker(params: tuple[str, ...]) -> Callable[[Args], str | None]:
    """The checks of an op over x's rows with per-column `params` (weight, bias)."""

    def check(args: Args) -> str | None:
        x = args["x"]
        n = x.shape[-1]
        for name in params:
            p = args[name]
            if p.dtype != x.dtype:
                return f"{name} must have x's dtype ({dtype_name(x.dtype)}), got {p.dtype}"
            if tuple(p.shape) != (n,):
                return (f"{name} must have shape ({n},) (x's last dimension), got "
                        f"{tuple(p.shape)}")
        if prod(x.shape) >= 2**32:
            return f"x must have fewer than 2**32 elements, got {prod(x.shape)}"
        if "eps" in args and not args["eps"] >= 0:  # NaN too
            return f"eps must be >= 0, got {args['eps']}"
        return None

    return check


def _output(args: Args) -> tuple[tuple[int, ...], torch.dtype]:
    return tuple(args["x"].shape), args["x"].dtype


@cache
def _tuner(op: str, kind: str, n: int, elem: T.Scalar, eps: float, vec: int) -> Any:
    def recipe(config: Any) -> Any:
        return norm_recipe(kind, n, elem, eps, vec, config)

    return autotune.tuner(f"ptxdsl::{op}", norm_configs(n, elem, vec), recipe)


def _planner(op: str, kind: str,
             params: tuple[str, ...]) -> Callable[[Args, torch.Tensor, int], Run]:
    """The launch plans of `kind`'s kernel, whose arguments are (x, *params, y, rows)."""

    def plan(args: Args, out: torch.Tensor, stream: int) -> Run:
        x, eps = args["x"], float(args.get("eps", DEFAULT_EPS))
        ws = [args[p] for p in params]
        n = x.shape[-1]
        rows = x.numel() // n
        elem = _ELEM[x.dtype]
        # the addresses' alignment is part of the plan's signature, so is the load width
        vec = norm_width(n, elem, tuple(t.data_ptr() for t in (x, *ws, out)))
        device = x.device.index

        def runner(config: Any) -> Run:
            kdef = norm_kernel(kind, n, elem, eps, vec, tuple(sorted(config.items())))
            kernel = kdef.program().kernel(device=device)
            grid = norm_grid(config, rows, n * x.element_size(), device)

            def run(tensors: tuple, out: torch.Tensor, stream: int) -> None:
                kernel[grid, None, stream](*tensors, out, rows)

            return run

        def trial(config: Any) -> torch.Tensor:
            y = torch.empty_like(out)
            runner(config)((x, *ws), y, stream)
            return y

        # rows rounded up to a power of two: batch sizes vary, the best warp count barely does
        shape: tuple[Any, ...] = (1 << (rows - 1).bit_length(), n, dtype_name(x.dtype))
        if vec != norm_width(n, elem):  # a misaligned tensor: narrower loads, tuned apart
            shape += (f"v{vec}",)
        config = _tuner(op, kind, n, elem, eps, vec).choose(
            shape, trial, autotune.close(2**-6), device=device, tune=autotune.tuning_allowed())
        return runner(config)

    return plan


def _spec(op: str, kind: str, params: tuple[str, ...], eps: bool) -> OpSpec:
    # any address: norm_width narrows the loads to what the tensors' addresses allow
    tensors = [TensorParam(name="x", dtypes=_DTYPES, aligned=False)]
    tensors += [TensorParam(name=p, dtypes=_DTYPES, rank=1, aligned=False) for p in params]
    scalars = [ScalarParam(name="eps", type="float", default=DEFAULT_EPS)] if eps else []
    return OpSpec(name=op, params=(*tensors, *scalars), check=_checker(params), output=_output,
                  plan=_planner(op, kind, params))


def _eps(ctx: Any, rest: list) -> None:
    ctx.eps = rest[0] if rest else DEFAULT_EPS  # the dispatcher drops a defaulted eps


# ----------------------------------------------------------------------------- rms_norm


def rms_norm_backward(x: torch.Tensor, weight: torch.Tensor, eps: float,
                      grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dL/dx, dL/dweight) of y = x * r * weight, r = 1 / sqrt(mean(x^2) + eps), in f32."""
    xf, wf, gf = x.float(), weight.float(), grad.float()
    r = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    gw = gf * wf
    dx = r * gw - xf * r.pow(3) * (gw * xf).mean(-1, keepdim=True)
    dw = (gf * xf * r).reshape(-1, x.shape[-1]).sum(0)
    return dx.to(x.dtype), dw.to(weight.dtype)


def _rms_setup(ctx: Any, inputs: tuple, output: Any) -> None:
    x, weight, *rest = inputs
    ctx.save_for_backward(x, weight)
    _eps(ctx, rest)


def _rms_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    x, weight = ctx.saved_tensors
    dx, dw = rms_norm_backward(x, weight, ctx.eps, grad)
    return dx, dw, None


rms_norm = register(_spec("rms_norm", "rmsnorm", ("weight",), eps=True),
                    backward=_rms_backward, setup_context=_rms_setup)




# ----------------------------------------------------------------------------- layer_norm


def layer_norm_backward(x: torch.Tensor, weight: torch.Tensor, eps: float,
                        grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dL/dx, dL/dweight, dL/dbias) of y = (x - mean) * r * weight + bias,
    r = 1 / sqrt(var + eps) (biased variance), in f32."""
    xf, gf = x.float(), grad.float()
    mean = xf.mean(-1, keepdim=True)
    r = torch.rsqrt((xf - mean).square().mean(-1, keepdim=True) + eps)
    xhat = (xf - mean) * r
    gw = gf * weight.float()
    dx = r * (gw - gw.mean(-1, keepdim=True) - xhat * (gw * xhat).mean(-1, keepdim=True))
    n = x.shape[-1]
    dw = (gf * xhat).reshape(-1, n).sum(0)
    db = gf.reshape(-1, n).sum(0)
    return dx.to(x.dtype), dw.to(weight.dtype), db.to(weight.dtype)


def _layer_setup(ctx: Any, inputs: tuple, output: Any) -> None:
    x, weight, _bias, *rest = inputs
    ctx.save_for_backward(x, weight)
    _eps(ctx, rest)


def _layer_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    x, weight = ctx.saved_tensors
    dx, dw, db = layer_norm_backward(x, weight, ctx.eps, grad)
    return dx, dw, db, None


layer_norm = register(_spec("layer_norm", "layernorm", ("weight", "bias"), eps=True),
                      backward=_layer_backward, setup_context=_layer_setup)




# ----------------------------------------------------------------------------- softmax


def softmax_backward(y: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """dL/dx of y = softmax(x) over the last dimension, from y: y * (g - sum(g * y)), in f32."""
    yf, gf = y.float(), grad.float()
    return (yf * (gf - (gf * yf).sum(-1, keepdim=True))).to(y.dtype)


def _softmax_setup(ctx: Any, inputs: tuple, output: Any) -> None:
    ctx.save_for_backward(output)


def _softmax_backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    (y,) = ctx.saved_tensors
    return softmax_backward(y, grad)


SOFTMAX = _spec("softmax", "softmax", (), eps=False)
softmax = register(SOFTMAX, backward=_softmax_backward, setup_context=_softmax_setup)
