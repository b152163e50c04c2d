"""The runtime half of the hang watchdog.

A module compiled with `watchdog_ms` has a global `__ptxdsl_watchdog` (.u64). `arm` points it
at 32 bytes of host-mapped pinned memory; a wait that times out writes (site + 1, parity,
block, thread, barrier index) there and traps. The trap kills the CUDA context, but host
memory survives it, so `Report.check` can still say which wait hung.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ..errors import DeviceError
from ..kernelinfo import KernelInfo
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
        site = int(self.words[0])
        if site:
            parity, block, thread, index = (int(x) for x in self.words[1:5])
            what = info.watch_sites[site - 1] if site <= len(info.watch_sites) else "?"
            raise DeviceError(
                f"watchdog: kernel '{info.name}' block {block} thread {thread} waited more than "
                f"{info.watchdog_ms} ms for parity {parity} of {what} (barrier index {index}); "
                "the kernel was stopped with a trap, so the CUDA context is unusable from now on")
        if int(err) != 0:
            raise DeviceError(failure_message(err, f"kernel '{info.name}'"))
