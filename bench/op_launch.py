"""Host cost of a call through a torch custom op: `torch.ops.ptxdsl.softmax` (registered by
`ptxdsl.torch`) against the same row softmax written in Triton and registered with
`torch.library.triton_op` / `wrap_triton` (what a Triton user gets), and plain eager
`torch.softmax`.

    python -m bench op-launch [--calls 2000]

Each call is timed alone on the host (`ptxdsl.runtime.launch_overhead_us`: the queue drained
every 50 calls), on a 4 x 1024 f32 input, so the host is all there is to time; results are
checked against torch.softmax first. Also timed: each op inside a torch.compile(fullgraph)
function, where Dynamo's guards add their own cost to both."""

from __future__ import annotations

import argparse
from functools import cache
from typing import Any

from .common import BenchError, Row, Section, check_close

ABOUT = ("Median host microseconds per call of a row softmax (4 x 1024 f32) through a torch "
         "custom op, each call timed alone: ptxdsl's op (argument checks, output allocation, "
         "the tuned config's lookup, the launch) against Triton's kernel registered with "
         "`torch.library.triton_op`, the same through torch.compile(fullgraph=True), and eager "
         "torch.softmax (a native ATen op, no Python on the way).")
LIMITS = ("the Python on the op's path: the dispatcher's custom-op trampoline (a few us, the "
          "same for both), then the op's own checks and launch.")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calls", type=int, default=2000, help="timed calls per op")


@cache
def triton_softmax() -> Any:
    """torch.ops.ptxdsl_bench.softmax: a one-row-per-program Triton softmax as a triton_op,
    or None without Triton."""
    import torch

    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def softmax_row(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * n + cols, mask=cols < n, other=-float("inf"))
        e = tl.exp(x - tl.max(x, 0))
        tl.store(y_ptr + row * n + cols, e / tl.sum(e, 0), mask=cols < n)

    @torch.library.triton_op("ptxdsl_bench::softmax", mutates_args=())
    def softmax(x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        n = x.shape[-1]
        torch.library.wrap_triton(softmax_row)[(x.numel() // n,)](
            x, y, n, BLOCK=triton.next_power_of_2(n))
        return y

    return torch.ops.ptxdsl_bench.softmax


def run(a: argparse.Namespace) -> list[Section]:
    import torch

    import ptxdsl.torch  # noqa: F401  (registers torch.ops.ptxdsl)
    from ptxdsl.runtime import launch_overhead_us

    def us(fn) -> float:
        return launch_overhead_us(fn, n=a.calls)

    x = torch.randn(4, 1024, device="cuda")
    want = torch.softmax(x, -1)
    ours = torch.ops.ptxdsl.softmax
    check_close("ptxdsl softmax op", ours(x), want, 1e-5)
    tri = triton_softmax()
    if tri is None:
        raise BenchError("Triton is not installed: no triton_op to compare with")
    check_close("Triton softmax triton_op", tri(x), want, 1e-5)
    compiled_ours = torch.compile(lambda t: ours(t), fullgraph=True)
    compiled_tri = torch.compile(lambda t: tri(t), fullgraph=True)
    check_close("compiled ptxdsl op", compiled_ours(x), want, 1e-5)
    check_close("compiled triton_op", compiled_tri(x), want, 1e-5)
    times = {}
    for _ in range(3):  # alternate, keep each one's best median
        for name, fn in (("ours", lambda: ours(x)), ("tri", lambda: tri(x)),
                         ("c_ours", lambda: compiled_ours(x)), ("c_tri", lambda: compiled_tri(x)),
                         ("aten", lambda: torch.softmax(x, -1))):
            t = us(fn)
            times[name] = min(t, times.get(name, t))
    cmd = "python -m bench op-launch"
    s = Section("op-launch", "Host cost of a call through a torch op", ABOUT, limits=LIMITS)
    s.rows += [
        Row("`torch.ops.ptxdsl.softmax(x)`, eager", "custom_op", times["ours"],
            "Triton kernel as `triton_op`", times["tri"], "us", cmd, target=1.0),
        Row("the same inside torch.compile(fullgraph=True)", "custom_op", times["c_ours"],
            "Triton `triton_op`, compiled", times["c_tri"], "us", cmd, target=1.0),
    ]
    s.notes.append(f"Eager `torch.softmax` (ATen, no Python in the op) on the same input: "
                   f"{times['aten']:.2f} us a call.")
    return [s]
