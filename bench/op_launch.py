"""Host cost of a call through a torch custom op: `torch.ops.ptxdsl.softmax` (registered by
`ptxdsl.torch`) against the same row softmax written in Triton and registered with
`torch.library.triton_op` / `wrap_triton` (what a Triton user gets), and plain eager
`torch.softmax`.

    python -m bench op-launch [--calls 2000]

Each call is timed alone on the host (`ptxdsl.runtime.launch_overhead_us`: the queue drained
every 50 calls), on a 4 x 1024 f32 input, so the host is all there is to time; results are
checked against torch.softmax first. Also timed: each op inside a torch.compile(fullgraph)
function, where Dynamo's guards add their own cost to both."""

import argparse
from functools import cache
from typing import Any

from .common import BenchError, Row, Section, check_close

ABOUT = ("Median host microseconds per call of a row softmax (4 x 1024 f32) through a torch "
         "custom op, each call timed alone: ptxdsl's op (argument checks, output allocation, "
         "the tuned config's lookup, the launch) against the same softmax in Triton registered "
         "with `torch.library.triton_op` (with the same backward where ptxdsl's has one), eager "
         "and inside torch.compile(fullgraph=True).")
LIMITS = ("the Python on the op's path: the dispatcher's custom-op trampoline (a few us, the "
          "same for both), then the op's own checks and launch.")


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
    from ptxdsl.torch.norms import SOFTMAX
    from ptxdsl.torch.opspec import register

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


def run(a: argparse.Namespace) -> list[Section]:
    import torch

    import ptxdsl.torch  # noqa: F401  (registers torch.ops.ptxdsl)
    from ptxdsl.runtime import launch_overhead_us

    x = torch.randn(4, 1024, device="cuda")
    want = torch.softmax(x, -1)
    fns = dict(ops())
    fns.update({f"{n}, compiled": torch.compile(lambda t, op=op: op(t), fullgraph=True)
                for n, op in ops().items()})
    for name, op in fns.items():
        check_close(name, op(x), want, 1e-5)
    fns["ATen"] = lambda t: torch.softmax(t, -1)
    mm = torch.compile(lambda t: torch.mm(t, t), fullgraph=True)  # a native op, compiled
    fns["ATen mm, compiled"] = lambda t: mm(t[:, :4])
    times: dict[str, float] = {}
    for _ in range(3):  # taking turns; each one's best median
        for name, op in fns.items():
            t = launch_overhead_us(lambda op=op: op(x), n=a.calls)
            times[name] = min(t, times.get(name, t))
    cmd = "python -m bench op-launch"
    s = Section("op-launch", "Host cost of a call through a torch op", ABOUT, limits=LIMITS)
    s.rows += [
        Row("op with a backward (`register_autograd`), eager", "`torch.ops.ptxdsl.softmax`",
            times["ptxdsl"], "Triton `triton_op`, same backward", times["Triton"], "us", cmd,
            target=1.0),
        Row("forward-only op, eager", "the same OpSpec, no backward", times["ptxdsl fwd"],
            "Triton `triton_op`", times["Triton fwd"], "us", cmd, target=1.0),
        Row("op with a backward, in torch.compile(fullgraph=True)", "`torch.ops.ptxdsl.softmax`",
            times["ptxdsl, compiled"], "Triton `triton_op`, compiled",
            times["Triton, compiled"], "us", cmd),
    ]
    s.notes.append(
        f"Eager `torch.softmax` (ATen, no Python in the op) on the same input: "
        f"{times['ATen']:.2f} us a call. Forward-only ops inside torch.compile: ptxdsl "
        f"{times['ptxdsl fwd, compiled']:.2f} us, Triton {times['Triton fwd, compiled']:.2f} "
        "us. Inductor calls a `triton_op`'s kernel itself (it sees through `wrap_triton`), "
        "with no dispatcher on the way; a ptxdsl op stays an opaque custom op there, called "
        "through the dispatcher like any extern kernel, and pays what PyTorch's wrappers of a "
        f"compiled region cost: a native `torch.mm` (4 x 4) compiled alone takes "
        f"{times['ATen mm, compiled']:.2f} us a call on this host. Under CUDA graphs "
        "(`mode=\"reduce-overhead\"`) both costs vanish.")
    return [s]
