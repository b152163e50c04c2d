"""Timing: device time of a launch (CUDA events) and host time spent launching."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from .driver import synchronize
from .streams import Event


def benchmark(
    fn: Callable[[], Any], *, warmup: int = 10, reps: int = 100, stream: Any = None
) -> float:
    """Median device time of `fn()` in milliseconds over `reps` runs, each bracketed by CUDA
    events recorded on `stream` (so `fn` should launch on that stream)."""
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    for _ in range(warmup):
        fn()
    synchronize(stream)
    events = [(Event(), Event()) for _ in range(reps)]
    for start, end in events:
        start.record(stream)
        fn()
        end.record(stream)
    synchronize(stream)
    return statistics.median(start.elapsed_ms(end) for start, end in events)


def launch_overhead_us(fn: Callable[[], Any], *, n: int = 1000, warmup: int = 20,
                       batch: int = 50) -> float:
    """Median host microseconds of one call of `fn` (one kernel launch).

    Each call is timed on its own, in batches of `batch` launches after a synchronize, so the
    launch queue never fills: a full queue makes a launch wait for the GPU, and the number
    would then measure the kernels instead of the host."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    for _ in range(warmup):
        fn()
    times: list[int] = []
    clock = time.perf_counter_ns
    while len(times) < n:
        synchronize()
        for _ in range(min(batch, n - len(times))):
            t0 = clock()
            fn()
            times.append(clock() - t0)
    synchronize()
    return statistics.median(times) / 1e3
