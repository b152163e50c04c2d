"""Lazy access to the CUDA driver: error checking, the primary context, device attributes.

Nothing here imports `cuda.bindings.driver` at module import time, so `import ptxdsl` stays
cheap and works on machines without a GPU; the binding is imported on the first call that
needs it.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ..errors import DeviceError

_lock = threading.Lock()
_tls = threading.local()
_drv: ModuleType | None = None
_ctx: Context | None = None
_ctx_error: str | None = None
_info: DeviceInfo | None = None

# Errors after which the context is unusable; the process has to restart to use the GPU again.
_STICKY = {700, 714, 715, 716, 717, 718, 719, 720}


def driver() -> ModuleType:
    """The `cuda.bindings.driver` module, imported on first use."""
    global _drv
    if _drv is None:
        try:
            from cuda.bindings import driver as drv
        except ImportError as e:
            raise DeviceError(f"no CUDA device: cuda-bindings is not installed ({e})") from None
        _drv = drv
    return _drv


def error_text(err: Any) -> str:
    """`NAME (code): description` of a CUresult, even when the driver library is missing."""
    drv = driver()
    code = int(err)
    try:
        name = drv.cuGetErrorName(err)[1].decode()
        desc = drv.cuGetErrorString(err)[1].decode()
    except Exception:
        name = getattr(err, "name", f"CUresult {code}")
        desc = "no description (driver unavailable)"
    return f"{name} ({code}): {desc}"


def check(result: tuple, what: str) -> Any:
    """The outputs of a driver call's `(CUresult, *out)` tuple; a `DeviceError` naming the
    call, the error name and its description when the call failed.

    Returns None for calls without outputs, the single output, or a tuple of outputs."""
    err = result[0]
    if err != 0:
        raise DeviceError(failure_message(err, what))
    n = len(result)
    if n == 1:
        return None
    return result[1] if n == 2 else result[1:]


def failure_message(err: Any, what: str) -> str:
    msg = f"{what} failed: {error_text(err)}"
    if int(err) in _STICKY:
        msg += (
            "\nthis error is sticky: the CUDA context is unusable from now on; "
            "restart the process (run faulting kernels in a subprocess to survive them)"
        )
    return msg


@dataclass(frozen=True, slots=True)
class Context:
    """The primary context of the device ptxdsl uses (shared with torch and cupy)."""

    ordinal: int
    device: Any
    handle: Any


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """Attributes of the current device that launches and tensor maps are checked against."""

    name: str
    ordinal: int
    compute_capability: tuple[int, int]
    sm_count: int
    max_smem_optin: int
    max_threads_per_block: int
    cluster_launch: bool

    @property
    def arch(self) -> str:
        """The `sm_XY` name of the device (without the `a` suffix)."""
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"


def _device_ordinal() -> int:
    raw = os.environ.get("PTXDSL_DEVICE", "0")
    try:
        return int(raw)
    except ValueError:
        raise DeviceError(f"PTXDSL_DEVICE must be a device ordinal, got {raw!r}") from None


def context() -> Context:
    """Initialise the driver, retain the primary context of device `PTXDSL_DEVICE` (default 0)
    and make it current in the calling thread. Cached; cheap after the first call.

    Raises DeviceError("no CUDA device: ...") when there is no usable GPU or driver."""
    ctx = _ctx
    if ctx is not None and getattr(_tls, "current", False):
        return ctx
    with _lock:
        ctx = _ctx or _open_context()
    check(driver().cuCtxSetCurrent(ctx.handle), "cuCtxSetCurrent")
    _tls.current = True
    return ctx


def _open_context() -> Context:
    global _ctx, _ctx_error
    if _ctx_error is not None:
        raise DeviceError(_ctx_error)
    try:
        drv = driver()
        ordinal = _device_ordinal()
        # The binding raises (not returns) when libcuda itself cannot be loaded.
        check(drv.cuInit(0), "cuInit")
        count = check(drv.cuDeviceGetCount(), "cuDeviceGetCount")
        if ordinal >= count:
            raise DeviceError(f"PTXDSL_DEVICE={ordinal}, but only {count} device(s) are visible")
        dev = check(drv.cuDeviceGet(ordinal), "cuDeviceGet")
        handle = check(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    except DeviceError as e:
        _ctx_error = "no CUDA device: " + "; ".join(d.message for d in e.diagnostics)
        raise DeviceError(_ctx_error) from None
    except Exception as e:
        _ctx_error = f"no CUDA device: {type(e).__name__}: {e}"
        raise DeviceError(_ctx_error) from None
    _ctx = Context(ordinal, dev, handle)
    return _ctx


def ensure_current() -> None:
    """Make the primary context current in this thread (a no-op after the first time)."""
    if _ctx is None or not getattr(_tls, "current", False):
        context()


def gpu_available() -> bool:
    """True when the driver loads and the selected device can be used; never raises."""
    try:
        context()
    except DeviceError:
        return False
    return True


def device_attribute(name: str) -> int:
    """A `CU_DEVICE_ATTRIBUTE_*` value of the current device, e.g.
    `device_attribute("MULTIPROCESSOR_COUNT")`."""
    drv = driver()
    ctx = context()
    key = name if name.startswith("CU_DEVICE_ATTRIBUTE_") else f"CU_DEVICE_ATTRIBUTE_{name}"
    attr = getattr(drv.CUdevice_attribute, key, None)
    if attr is None:
        raise DeviceError(f"unknown device attribute {name!r}")
    return int(check(drv.cuDeviceGetAttribute(attr, ctx.device), f"cuDeviceGetAttribute({key})"))


def device_info() -> DeviceInfo:
    """Name, compute capability, SM count and limits of the current device (cached)."""
    global _info
    if _info is None:
        drv = driver()
        ctx = context()
        raw = check(drv.cuDeviceGetName(256, ctx.device), "cuDeviceGetName")
        _info = DeviceInfo(
            name=bytes(raw).split(b"\0", 1)[0].decode(errors="replace"),
            ordinal=ctx.ordinal,
            compute_capability=(
                device_attribute("COMPUTE_CAPABILITY_MAJOR"),
                device_attribute("COMPUTE_CAPABILITY_MINOR"),
            ),
            sm_count=device_attribute("MULTIPROCESSOR_COUNT"),
            max_smem_optin=device_attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
            max_threads_per_block=device_attribute("MAX_THREADS_PER_BLOCK"),
            cluster_launch=bool(device_attribute("CLUSTER_LAUNCH")),
        )
    return _info


def stream_handle(stream: Any) -> int:
    """The raw CUstream value of `stream`: None (the legacy default stream), an int, a
    ptxdsl `Stream`, a `CUstream`, or a torch/cupy stream object."""
    if stream is None:
        return 0
    if type(stream) is int:
        return stream
    for attr in ("handle", "cuda_stream", "ptr"):  # ptxdsl / torch / cupy spellings
        h = getattr(stream, attr, None)
        if h is not None:
            return h if type(h) is int else int(h)
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        return int(proto()[1])
    try:
        return int(stream)
    except (TypeError, ValueError):
        raise TypeError(
            "stream must be None, an int handle or a CUDA stream object, "
            f"got {type(stream).__name__}"
        ) from None


def synchronize(stream: Any = None) -> None:
    """Wait for all work on the device (or on `stream`) and raise DeviceError if a kernel
    faulted; a sticky fault is reported as such."""
    drv = driver()
    ensure_current()
    if stream is None:
        check(drv.cuCtxSynchronize(), "cuCtxSynchronize")
    else:
        check(drv.cuStreamSynchronize(stream_handle(stream)), "cuStreamSynchronize")
