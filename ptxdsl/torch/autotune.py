"""The torch side of autotuning (ptxdsl.tools.autotune holds the selection and the cache): CUDA
event timing on torch's current stream, output comparison, the machine's identity, and a
tuner factory that wires them in."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable, Sequence
from functools import cache
from typing import Any

import torch

from ..runtime.driver import check, device_info, driver
from ..tools import autotune
from ..tools.autotune import enabled
from ..tools.precompile import Recipe, precompile

WARMUP = 2
REPS = 10

__all__ = ["close", "enabled", "event_timer", "graph_timer", "machine", "tuner",
           "tuning_allowed"]


def event_timer(fn: Callable[[], Any]) -> float:
    """Median milliseconds of `fn()` over REPS runs on the current stream (CUDA events)."""
    for _ in range(WARMUP):
        fn()
    pairs = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(REPS)
    ]
    for start, end in pairs:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in pairs)


def graph_timer(fn: Callable[[], Any], calls: int = 10) -> float:
    """Milliseconds of one `fn()` replayed from a CUDA graph of `calls` captured calls
    (event_timer of the replays): a kernel of a few microseconds timed without the host's
    launch cost, which would otherwise swamp the differences between candidates. `fn`
    launches on torch's current stream and has run once outside capture."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capture_stream(torch.cuda.current_device())):
        for _ in range(calls):
            fn()
    return event_timer(graph.replay) / calls


_CAPTURE: dict[int, torch.cuda.Stream] = {}


def capture_stream(device: int) -> torch.cuda.Stream:
    """A side stream of `device` to capture tuning trials on. torch.cuda.graph's default is
    one stream for the process, made on whichever device was current at the first capture:
    entering it would move torch's current device there, and a trial launched for tensors
    of another device would not be captured at all ("Capture must end on the same stream
    it began on")."""
    stream = _CAPTURE.get(device)
    if stream is None:
        stream = _CAPTURE[device] = torch.cuda.Stream(device)
    return stream


def close(rtol: float) -> Callable[[torch.Tensor, torch.Tensor], bool]:
    """A comparison of a candidate's output with the reference's: every element within
    `rtol` times the reference's largest magnitude (NaN anywhere fails)."""

    def same(out: torch.Tensor, ref: torch.Tensor) -> bool:
        o, r = out.float(), ref.float()
        scale = r.abs().max().clamp_min(1e-30)
        return bool(((o - r).abs().max() <= rtol * scale).item())

    return same


@cache
def machine(device: Hashable) -> dict[str, str]:
    """The GPU name and driver version of device ordinal `device`."""
    version = check(driver().cuDriverGetVersion(), "cuDriverGetVersion")
    return {"gpu": device_info(device).name, "driver": str(version)}


def tuner(op: str, configs: Sequence[autotune.Config],
          recipe: Callable[[autotune.Config], Recipe],
          timer: Callable[[Callable[[], Any]], float] = event_timer) -> autotune.Autotuner:
    """An Autotuner over `configs` whose kernels are `recipe(config)`, built in parallel
    processes before the first tuning, timed with `timer` (CUDA events; graph_timer for
    kernels shorter than their launch) and cached on disk."""
    return autotune.Autotuner(
        op, configs, ptx=lambda c: recipe(c).build().ptx(), machine=machine, timer=timer,
        prepare=lambda cs: precompile([recipe(c) for c in cs]),
    )


def tuning_allowed() -> bool:
    """No timing while a CUDA graph is captured (events and synchronisation are not allowed
    then): a shape not tuned yet runs the default config."""
    return not torch.cuda.is_current_stream_capturing()
