"""CUDA streams and events of the primary context."""

from __future__ import annotations

from typing import Any

from .driver import check, device_context, driver, ensure_current, make_current, stream_handle
from .resource import Resource


def _current(device: int | None) -> None:
    if device is None:
        ensure_current()
    else:
        make_current(device_context(device))


class Stream(Resource):
    """A CUDA stream. `non_blocking=False` (the default) keeps it ordered with the legacy
    default stream, so ptxdsl's synchronous copies wait for kernels launched on it.
    `device`: the GPU ordinal it belongs to (default: this thread's device). Destroyed by
    `close()`, at the end of a `with` block, or by garbage collection (see resource.py)."""

    noun = "stream"

    def __init__(self, non_blocking: bool = False, device: int | None = None):
        drv = driver()
        _current(device)
        flags = drv.CUstream_flags
        flag = flags.CU_STREAM_NON_BLOCKING if non_blocking else flags.CU_STREAM_DEFAULT
        self._handle: int = int(check(drv.cuStreamCreate(flag), "cuStreamCreate"))
        Resource.__init__(self)

    @property
    def handle(self) -> int:
        """The CUstream; raises once closed (a stale 0 would be the legacy default stream,
        and launches given this stream would run there)."""
        self._check_open()
        return self._handle

    def synchronize(self) -> None:
        """Wait for the stream's work; raises DeviceError if a kernel on it faulted."""
        check(driver().cuStreamSynchronize(self.handle), "cuStreamSynchronize")

    def _release(self) -> None:  # work already queued still runs
        check(driver().cuStreamDestroy(self._handle), "cuStreamDestroy")


class Event(Resource):
    """A CUDA event; `end - start` (or `start.elapsed_ms(end)`) is the time between two
    recorded events in milliseconds. `device`: the GPU ordinal it belongs to. Destroyed by
    `close()`, at the end of a `with` block, or by garbage collection (see resource.py)."""

    noun = "event"

    def __init__(self, timing: bool = True, device: int | None = None):
        drv = driver()
        _current(device)
        flags = drv.CUevent_flags
        flag = flags.CU_EVENT_DEFAULT if timing else flags.CU_EVENT_DISABLE_TIMING
        self._handle = check(drv.cuEventCreate(flag), "cuEventCreate")
        Resource.__init__(self)

    @property
    def handle(self) -> Any:
        """The CUevent; raises once closed."""
        self._check_open()
        return self._handle

    def record(self, stream: Any = None) -> Event:
        """Record the event on `stream` (None: the legacy default stream)."""
        check(driver().cuEventRecord(self.handle, stream_handle(stream)), "cuEventRecord")
        return self

    def synchronize(self) -> None:
        """Wait until the work before the record has finished."""
        check(driver().cuEventSynchronize(self.handle), "cuEventSynchronize")

    def elapsed_ms(self, end: Event) -> float:
        """Milliseconds from this event to `end` (both recorded; waits for `end`)."""
        end.synchronize()
        return float(
            check(driver().cuEventElapsedTime(self.handle, end.handle), "cuEventElapsedTime")
        )

    def __sub__(self, start: Event) -> float:
        return start.elapsed_ms(self)

    def _release(self) -> None:
        check(driver().cuEventDestroy(self._handle), "cuEventDestroy")
