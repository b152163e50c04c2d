"""The runtime half of the hang watchdog.

A module compiled with `watchdog_ms` has a global `__ptxdsl_watchdog` (.u64). `Report` points
it at 32 bytes of host-mapped pinned memory; a bounded mbarrier wait or spin loop that times out
writes (site + 1, parity, block, thread, barrier offset, kind) there and traps. The trap kills
the CUDA context, but host memory survives it, so `Report.after_launch` can still say which
wait hung.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import DeviceError
from ..kernelinfo import WATCH_SPIN, KernelInfo
from .driver import check, driver, failure_message

SYMBOL = b"__ptxdsl_watchdog"
_DEVICEMAP = 0x02  # CU_MEMHOSTALLOC_DEVICEMAP


class Report:
    """The host-mapped record a timed-out wait fills in."""

    def __init__(self, module_handle: Any):
        drv = driver()
        self.host = check(drv.cuMemHostAlloc(32, _DEVICEMAP), "cuMemHostAlloc(watchdog)")
        self.words = np.ctypeslib.as_array((ctypes.c_uint32 * 8).from_address(int(self.host)))
        self.words[:] = 0
        dev = check(drv.cuMemHostGetDevicePointer(self.host, 0), "cuMemHostGetDevicePointer")
        gptr, size = check(drv.cuModuleGetGlobal(module_handle, SYMBOL), "cuModuleGetGlobal")
        value = np.array([int(dev)], np.uint64)
        check(drv.cuMemcpyHtoD(gptr, value, 8), "cuMemcpyHtoD(watchdog)")

    def after_launch(self, info: KernelInfo, stream: int) -> None:
        """Wait for the launch; if a wait timed out, raise DeviceError naming it."""
        drv = driver()
        err = (drv.cuStreamSynchronize(stream) if stream else drv.cuCtxSynchronize())[0]
        hung = timeout_message(info, [int(x) for x in self.words])
        if hung is not None:
            raise DeviceError(hung)
        if int(err) != 0:
            raise DeviceError(failure_message(err, f"kernel '{info.name}'"))


def timeout_message(info: KernelInfo, words: Sequence[int]) -> str | None:
    """What the report's words say timed out, or None if nothing did."""
    site, parity, block, thread, index, kind = words[:6]
    if not site:
        return None
    what = info.watch_sites[site - 1] if site <= len(info.watch_sites) else "?"
    who = f"watchdog: kernel '{info.name}' block {block} thread {thread}"
    if kind == WATCH_SPIN:
        hung = f"{who} spun more than {info.watchdog_ms} ms in {what}"
    else:
        hung = (f"{who} waited more than {info.watchdog_ms} ms for parity {parity} of {what} "
                f"(barrier index {index})")
    return (f"{hung}; the kernel was stopped with a trap, so the CUDA context is unusable "
            "from now on")
