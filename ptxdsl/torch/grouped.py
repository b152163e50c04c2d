"""`torch.ops.ptxdsl.grouped_mm(a, b, offs)`: the mixture-of-experts grouped GEMM in
`torch._grouped_mm`'s contiguous layout. a is T x K (the tokens of every expert, expert
after expert), b is E x N x K (one weight per expert, C_g = A_g @ B_g^T), offs the E int32
cumulative row ends (expert g owns rows offs[g - 1] .. offs[g], the first from row 0); the
result is T x N bf16, f32 accumulation (ptxdsl/kernels/grouped_gemm.py's kernel).

The offsets stay on the device (no synchronisation, so the op runs inside CUDA graphs), so
the op cannot reject bad ones; it makes them safe instead, on the device: each is clamped to
0 .. T and raised to the running maximum, so an offset past T ends at T and an expert whose
end falls below the previous one owns no rows. Rows past offs[E - 1] are not written (as
with `torch._grouped_mm`)."""

from __future__ import annotations

from functools import cache

import torch

from ..runtime.launch import Kernel
from ..runtime.tensormap import TensorMap
from .dispatch import register
from .kernels import bounds_kernel, grouped_kernel
from .opspec import Args, OpSpec, Run, TensorParam

_U32 = 2**32


def check_layout(args: Args) -> str | None:
    """What is wrong with the contiguous layout: a (T x K), b (E x N x K), offs (E)."""
    a, b, offs = args["a"], args["b"], args["offs"]
    if a.shape[1] != b.shape[2]:
        return (f"a (T x K) and b (E x N x K) must have the same K, got a {tuple(a.shape)} "
                f"and b {tuple(b.shape)}")
    if offs.shape != (b.shape[0],):
        return (f"offs must hold one row end per expert ({b.shape[0]}), got shape "
                f"{tuple(offs.shape)}")
    return None


def check_operands(args: Args) -> str | None:
    (t, k), (e, n, _) = args["a"].shape, args["b"].shape
    problem = check_layout(args)
    if problem is not None:
        return problem
    if min(t, n, k, e) < 1:
        return f"T, N, K and E must be at least 1, got T={t}, N={n}, K={k}, E={e}"
    if max(t, n, k, e) >= _U32:
        return f"T, N, K and E must be below 2**32, got T={t}, N={n}, K={k}, E={e}"
    if k % 8:
        return f"K must be a multiple of 8 (16-byte rows for TMA), got K={k}"
    if n % 8:
        return f"N must be a multiple of 8 (16-byte rows of the output for TMA), got N={n}"
    return None


def output_c(args: Args) -> tuple[tuple[int, ...], torch.dtype]:
    return (args["a"].shape[0], args["b"].shape[1]), torch.bfloat16


@cache
def _loaded(device: int) -> tuple[Kernel, Kernel, int]:
    """The grouped GEMM and its offsets kernel loaded on `device`, and the SMs the GEMM's
    persistent grid covers (one CTA each; CTAs past the tile count find no work)."""
    kernel = grouped_kernel().program().kernel(device=device)
    bounds = bounds_kernel().program().kernel(device=device)
    return kernel, bounds, torch.cuda.get_device_properties(device).multi_processor_count


def _plan(args: Args, out: torch.Tensor, stream: int) -> Run:
    a, b = args["a"], args["b"]
    t, k = a.shape
    e, n, _ = b.shape
    kernel, bounds_of, sms = _loaded(a.device.index)
    ma = TensorMap(a, box=(128, 64), swizzle="128B")
    mb = TensorMap(b, box=(1, 256, 64), swizzle="128B")
    mc = TensorMap(out, box=(64, 64), swizzle="128B")

    def run(tensors: tuple, out: torch.Tensor, stream: int) -> None:
        ta, tb, offs = tensors
        # the kernel reads E + 1 non-decreasing row offsets from 0 to at most T, made from
        # offs on the launch's stream: a bad offset cannot make a row count wrap around
        bounds = offs.new_empty(e + 1, dtype=torch.uint32)
        bounds_of[1, None, stream](offs, bounds, e, t)
        kernel[sms, None, stream](ma.at(ta.data_ptr()), mb.at(tb.data_ptr()),
                                  mc.at(out.data_ptr()), out, bounds, e, 0, n, k, t)

    return run


SPEC = OpSpec(
    name="grouped_mm",
    params=(
        TensorParam(name="a", dtypes=(torch.bfloat16,), rank=2, layout="tma"),
        TensorParam(name="b", dtypes=(torch.bfloat16,), rank=3, layout="tma"),
        TensorParam(name="offs", dtypes=(torch.int32,), rank=1, layout="contiguous"),
    ),
    check=check_operands,
    output=output_c,
    plan=_plan,
)

grouped_mm = register(SPEC)
