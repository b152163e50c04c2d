"""Host cost of a call through the torch ops: each `torch.ops.ptxdsl.<op>` against the ATen
call doing the same work, eagerly, and the softmax op inside torch.compile against the same
row softmax written in Triton and registered with `torch.library.triton_op` / `wrap_triton`
(what a Triton user gets).

    python -m bench op-launch [--calls 2000]

Each call is timed alone on the host (`ptxdsl.runtime.launch_overhead_us`: the queue drained
every 50 calls), on inputs small enough that the host is all there is to time; every result
is checked against the reference first; contenders take turns over three rounds, each one's
best median kept."""

import argparse
from functools import cache
from typing import Any

from .common import BenchError, Row, Section, check_close

ABOUT = ("Median host microseconds per call, each call timed alone, on small inputs (gemm "
         "128 x 128 x 128, scaled_mm_fp8 the same in e4m3, attention 1 x 2 x 128 x 64, rms_norm "
         "4 x 1024 bf16, softmax 4 x 1024 f32, grouped_mm 2 experts of 128 x 128 x 128): "
         "`torch.ops.ptxdsl.<op>` (its launch plan made on the first call) against the ATen "
         "call doing the same work; and the softmax op inside torch.compile(fullgraph=True) "
         "against the same softmax in Triton as a `torch.library.triton_op`. Ratio = reference "
         "us / ptxdsl us.")
LIMITS = ("what any op written in Python pays: measured alone on an H200 host (2026-11-28, "
          "before the floors note existed): the dispatcher's call into a Python kernel 3-4 us, "
          "the output's allocation 2-4 us, the driver's launch call 3.5-5.8 us, argument "
          "packing 1.5 us, about 13 us before any check, plan lookup or tensor-map "
          "re-pointing, where ATen's whole softmax call takes 7-10 us (its CUDA kernels are "
          "C++ functions the dispatcher calls directly); `bench op-launch` now times these "
          "floors in the same run (the notes). The decode GEMM rows (gemm and scaled_mm_fp8 "
          "at 128 x 128 x 128 take the swap-AB plan) also allocate a split-K workspace a "
          "call. Inside torch.compile the op is an extern call through the dispatcher, where "
          "inductor launches a `triton_op`'s kernel itself.")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calls", type=int, default=2000, help="timed calls per op")


def softmax_backward(ctx: Any, grad: Any) -> Any:
    """The backward both autograd-registered ops get (torch math)."""
    from ptxdsl.torch.norms import softmax_backward as math

    (y,) = ctx.saved_tensors
    return math(y, grad)


def save_output(ctx: Any, inputs: tuple, output: Any) -> None:
    ctx.save_for_backward(output)


@cache
def ops() -> dict[str, Any]:
    """The four ops timed: ptxdsl's softmax with its backward and without one (the same
    OpSpec registered again as `ptxdsl::softmax_forward`), and Triton's softmax as a
    triton_op, with the same backward and without. Raises BenchError without Triton."""
    import dataclasses

    import torch

    try:
        import triton
        import triton.language as tl
    except ImportError:
        raise BenchError("Triton is not installed: no triton_op to compare with") from None
    from ptxdsl.torch.dispatch import register
    from ptxdsl.torch.norms import SOFTMAX

    @triton.jit
    def softmax_row(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * n + cols, mask=cols < n, other=-float("inf"))
        e = tl.exp(x - tl.max(x, 0))
        tl.store(y_ptr + row * n + cols, e / tl.sum(e, 0), mask=cols < n)

    def make(name: str) -> Any:
        # (no `from __future__ import annotations` in this file: torch reads these
        # annotations as types)
        @torch.library.triton_op(f"ptxdsl_bench::{name}", mutates_args=())
        def softmax(x: torch.Tensor) -> torch.Tensor:
            y = torch.empty_like(x)
            n = x.shape[-1]
            torch.library.wrap_triton(softmax_row)[(x.numel() // n,)](
                x, y, n, BLOCK=triton.next_power_of_2(n))
            return y

        return softmax

    make("softmax").register_autograd(softmax_backward, setup_context=save_output)
    make("softmax_forward")
    register(dataclasses.replace(SOFTMAX, name="softmax_forward"))
    return {"ptxdsl": torch.ops.ptxdsl.softmax, "ptxdsl fwd": torch.ops.ptxdsl.softmax_forward,
            "Triton": torch.ops.ptxdsl_bench.softmax,
            "Triton fwd": torch.ops.ptxdsl_bench.softmax_forward}


@cache
def cases() -> dict[str, tuple[Any, Any, str, float]]:
    """op -> (ptxdsl call, reference call, the reference's name, the comparison's tolerance),
    each a no-argument function over inputs made here."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    a, b = (torch.randn(128, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    q = torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    xf = torch.randn(4, 1024, device="cuda")
    ga = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)
    gb = torch.randn(2, 128, 128, device="cuda", dtype=torch.bfloat16)
    offs = torch.tensor([128, 256], device="cuda", dtype=torch.int32)
    P = torch.ops.ptxdsl
    found = {
        "gemm": (lambda: P.gemm(a, b), lambda: a @ b.T, "`a @ b.T` (cuBLAS)", 2**-6),
        "scaled_mm_fp8": (lambda: P.scaled_mm_fp8(a8, b8, one, one),
                          lambda: torch._scaled_mm(a8, b8.T, one, one, out_dtype=torch.bfloat16),
                          "`torch._scaled_mm` (cuBLASLt)", 2**-6),
        "attention": (lambda: P.attention(q, q, q), lambda: F.scaled_dot_product_attention(q, q, q),
                      "`F.scaled_dot_product_attention`", 2**-6),
        "rms_norm": (lambda: P.rms_norm(x, w, 1e-5),
                     lambda: F.rms_norm(x, (1024,), w, 1e-5), "`F.rms_norm`", 2**-6),
        "softmax": (lambda: P.softmax(xf), lambda: torch.softmax(xf, -1), "`torch.softmax`",
                    1e-5),
    }
    if hasattr(torch, "_grouped_mm"):
        found["grouped_mm"] = (lambda: P.grouped_mm(ga, gb, offs),
                               lambda: torch._grouped_mm(ga, gb.transpose(1, 2), offs=offs),
                               "`torch._grouped_mm`", 2**-6)
    return found


@cache
def floors() -> tuple[dict[str, Any], Any]:
    """The pieces every Python op pays, each timed alone: the dispatcher's call into a Python
    kernel that does nothing, the output's allocation, ptxdsl's bound launcher and the
    driver's launch call under it (bench launch's probe kernel), and the context switch each
    launch makes; and the library holding the do-nothing op (kept alive with them)."""
    import threading

    import torch

    from ptxdsl.runtime import TensorMap
    from ptxdsl.runtime.driver import driver

    from .launch import launch_probe

    lib = torch.library.Library("ptxdsl_bench", "FRAGMENT")
    lib.define("nothing(Tensor x) -> ()")
    lib.impl("nothing", lambda x: None, "CUDA")
    x = torch.empty(4, 1024, device="cuda", dtype=torch.bfloat16)
    k = launch_probe.program().kernel()
    tm = TensorMap(x, box=(4, 256))
    launch = k[1]
    launch(tm, x, 7)
    packer = k._packers[threading.get_ident()]
    cfg, handle, drv_launch, addr = launch._cfg, k._handle, k._launch_ex, packer.params_address
    ctx = k.context.handle
    set_current = driver().cuCtxSetCurrent
    return {"a Python kernel through the dispatcher": lambda: torch.ops.ptxdsl_bench.nothing(x),
            "torch.empty_like": lambda: torch.empty_like(x),
            "ptxdsl's bound launcher": lambda: launch(tm, x, 7),
            "cuLaunchKernelEx alone": lambda: drv_launch(cfg, handle, addr, 0),
            "cuCtxSetCurrent": lambda: set_current(ctx),
            "torch's current device": torch._C._cuda_getDevice}, lib


def run(a: argparse.Namespace) -> list[Section]:
    import torch

    import ptxdsl.torch  # noqa: F401  (registers torch.ops.ptxdsl)
    from ptxdsl.runtime import launch_overhead_us

    fns: dict[str, Any] = {}
    for name, (ours, ref, _, tol) in cases().items():
        check_close(name, ours(), ref(), tol)
        fns[name], fns[f"{name} ref"] = ours, ref
    x = torch.randn(4, 1024, device="cuda")
    want = torch.softmax(x, -1)
    for name, op in ops().items():
        compiled = torch.compile(lambda t, op=op: op(t), fullgraph=True)
        check_close(name, compiled(x), want, 1e-5)
        fns[f"{name}, compiled"] = lambda c=compiled: c(x)
    pieces, _ = floors()
    fns.update({f"floor: {name}": fn for name, fn in pieces.items()})
    times: dict[str, float] = {}
    for _ in range(3):  # taking turns; each one's best median
        for name, fn in fns.items():
            t = launch_overhead_us(fn, n=a.calls)
            times[name] = min(t, times.get(name, t))
    cmd = "python -m bench op-launch"
    s = Section("op-launch", "Host cost of a call through a torch op", ABOUT, limits=LIMITS)
    for name, (_, _, ref, _) in cases().items():
        s.rows.append(Row(f"`{name}`, eager, vs ATen", f"`torch.ops.ptxdsl.{name}`",
                          times[name], ref, times[f"{name} ref"], "us", cmd, target=1.0))
    s.rows.append(Row("`softmax`, torch.compile, vs triton_op", "`torch.ops.ptxdsl.softmax`",
                      times["ptxdsl, compiled"], "Triton `triton_op`, same backward",
                      times["Triton, compiled"], "us", cmd, target=1.0))
    s.notes.append("What a Python op pays on this host, each piece timed alone in this run: " +
                   ", ".join(f"{name} {times[f'floor: {name}']:.2f} us" for name in pieces) +
                   ".")
    s.notes.append(
        f"Ops without a backward formula inside torch.compile: ptxdsl "
        f"{times['ptxdsl fwd, compiled']:.2f} us, Triton {times['Triton fwd, compiled']:.2f} us.")
    return [s]
