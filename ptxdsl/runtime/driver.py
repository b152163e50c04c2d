"""Lazy access to the CUDA driver: error checking, the primary context, device attributes.

Nothing here imports `cuda.bindings.driver` at module import time, so `import ptxdsl` stays
cheap and works on machines without a GPU; the binding is imported on the first call that
needs it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ..errors import DeviceError, LaunchError

_lock = threading.Lock()
_tls = threading.local()
_drv: ModuleType | None = None
_ctx: Context | None = None
_ctx_error: str | None = None  # why the default device cannot be used (remembered)
_contexts: dict[int, Context] = {}  # every retained primary context, by ordinal
_infos: dict[int, DeviceInfo] = {}

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
    """The default device: PTXDSL_DEVICE; unset, the device of the context already current
    in this thread (torch's, after `torch.cuda.set_device(local_rank)` under torchrun), so
    that ptxdsl does not move another library's current device; else 0."""
    raw = os.environ.get("PTXDSL_DEVICE")
    if raw is None:
        return _current_device()
    try:
        return int(raw)
    except ValueError:
        raise DeviceError(f"PTXDSL_DEVICE must be a device ordinal, got {raw!r}") from None


def _current_device() -> int:
    drv = driver()  # cuInit has run (_open_context)
    err, ctx = drv.cuCtxGetCurrent()
    if err != 0 or not int(ctx):
        return 0
    err, dev = drv.cuCtxGetDevice()
    return int(dev) if err == 0 else 0


def device_ordinal(device: Any, what: str = "device") -> int:
    """`device` checked as a device ordinal (an int >= 0; numpy ints accepted, bools not)."""
    if isinstance(device, bool) or not hasattr(device, "__index__"):
        raise LaunchError(f"{what} must be a device ordinal (an int), got {device!r}")
    d = int(device.__index__())
    if d < 0:
        raise LaunchError(f"{what} must be a device ordinal >= 0, got {d}")
    return d


def context(device: Any = None) -> Context:
    """The primary context of `device` (an ordinal), retained on first use and made current
    in the calling thread. `device` None means this thread's device: the innermost
    `use_device(...)` block's, else `PTXDSL_DEVICE` (unset: the device of a context already
    current in the thread, e.g. torch's, else 0). Cheap after the first call.

    Raises DeviceError("no CUDA device: ...") when there is no usable GPU or driver, and
    DeviceError naming the visible count for an ordinal that does not exist."""
    if device is None:
        ctx = getattr(_tls, "want", None) or _ctx
        if ctx is None:
            with _lock:
                ctx = _ctx or _open_context()
    else:
        ctx = device_context(device)
    make_current(ctx)
    return ctx


def device_context(device: Any) -> Context:
    """The retained primary context of device `device`, without making it current."""
    ordinal = device_ordinal(device)
    ctx = _contexts.get(ordinal)
    if ctx is None:
        with _lock:
            if _ctx is None and _ctx_error is None:
                try:
                    _open_context()
                except DeviceError:
                    pass
            if _ctx_error is not None:
                raise DeviceError(_ctx_error)
            ctx = _contexts.get(ordinal) or _retain(ordinal, "device")
    return ctx


def make_current(ctx: Context) -> None:
    """Make `ctx` current in this thread: one driver call, every time. A cache of what ptxdsl
    made current last would go stale whenever other code in the thread switches contexts
    (torch's `torch.cuda.device(i)` does), and a launch in the wrong context fails with
    CUDA_ERROR_INVALID_HANDLE (seen on 2 x H200), so the driver's own state is the only truth."""
    err = driver().cuCtxSetCurrent(ctx.handle)[0]
    if err != 0:
        raise DeviceError(failure_message(err, "cuCtxSetCurrent"))


@contextlib.contextmanager
def use_device(device: Any) -> Iterator[Context]:
    """`with use_device(1): ...` makes device 1 this thread's device inside the block:
    allocations, loads, streams and tensor maps without a `device=` go there. The context
    current before the block (ptxdsl's or another library's) is current again afterwards."""
    ctx = device_context(device)
    prev = getattr(_tls, "want", None)
    err, before = driver().cuCtxGetCurrent()  # torch's, say: it is current again afterwards
    _tls.want = ctx
    try:
        make_current(ctx)
        yield ctx
    finally:
        _tls.want = prev
        if prev is not None:
            make_current(prev)
        elif err == 0 and int(before):
            check(driver().cuCtxSetCurrent(before), "cuCtxSetCurrent")
        elif _ctx is not None:
            make_current(_ctx)


@contextlib.contextmanager
def keeping_current() -> Iterator[None]:
    """Whatever context is current when the block starts (torch's, say) is current again
    when it ends: for host-side queries that must run in a given device's context."""
    err, before = driver().cuCtxGetCurrent()
    try:
        yield
    finally:
        if err == 0 and int(before):
            check(driver().cuCtxSetCurrent(before), "cuCtxSetCurrent")


def current_device() -> int:
    """The ordinal of this thread's device (see `context`)."""
    return context().ordinal


def device_count() -> int:
    """How many CUDA devices this process sees (0 when there is no usable driver)."""
    try:
        context()
    except DeviceError:
        return 0
    return int(check(driver().cuDeviceGetCount(), "cuDeviceGetCount"))


def _retain(ordinal: int, what: str) -> Context:
    drv = driver()
    count = check(drv.cuDeviceGetCount(), "cuDeviceGetCount")
    if ordinal >= count:
        raise DeviceError(f"{what}={ordinal}, but only {count} device(s) are visible")
    dev = check(drv.cuDeviceGet(ordinal), "cuDeviceGet")
    handle = check(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    ctx = _contexts[ordinal] = Context(ordinal, dev, handle)
    return ctx


def _open_context() -> Context:
    global _ctx, _ctx_error
    if _ctx_error is not None:
        raise DeviceError(_ctx_error)
    try:
        drv = driver()
        # The binding raises (not returns) when libcuda itself cannot be loaded.
        check(drv.cuInit(0), "cuInit")
        ordinal = _device_ordinal()
        ctx = _contexts.get(ordinal) or _retain(ordinal, "PTXDSL_DEVICE")
    except DeviceError as e:
        _ctx_error = "no CUDA device: " + "; ".join(d.message for d in e.diagnostics)
        raise DeviceError(_ctx_error) from None
    except Exception as e:
        _ctx_error = f"no CUDA device: {type(e).__name__}: {e}"
        raise DeviceError(_ctx_error) from None
    _ctx = ctx
    return _ctx


def ensure_current() -> None:
    """Make this thread's device's primary context current (`context()`'s device: the
    innermost `use_device` block's, else ptxdsl's default one)."""
    want = getattr(_tls, "want", None) or _ctx
    if want is None:
        context()
    else:
        make_current(want)


def any_current() -> None:
    """Have some context current, for a driver call that needs one but no device in
    particular (a tensor map's encoding): the one current already (torch's, a launch's:
    switching it would move torch's current device under it, even in the middle of a CUDA
    graph capture), else this thread's device's."""
    if getattr(_tls, "want", None) is not None:
        ensure_current()
        return
    err, ctx = driver().cuCtxGetCurrent()
    if err != 0 or not int(ctx):
        ensure_current()


def gpu_available() -> bool:
    """True when the driver loads and the selected device can be used; never raises."""
    try:
        context()
    except DeviceError:
        return False
    return True


def device_attribute(name: str, device: Any = None) -> int:
    """A `CU_DEVICE_ATTRIBUTE_*` value of `device` (default: this thread's device), e.g.
    `device_attribute("MULTIPROCESSOR_COUNT")`."""
    drv = driver()
    ctx = context() if device is None else device_context(device)
    key = name if name.startswith("CU_DEVICE_ATTRIBUTE_") else f"CU_DEVICE_ATTRIBUTE_{name}"
    attr = getattr(drv.CUdevice_attribute, key, None)
    if attr is None:
        raise DeviceError(f"unknown device attribute {name!r}")
    return int(check(drv.cuDeviceGetAttribute(attr, ctx.device), f"cuDeviceGetAttribute({key})"))


def device_info(device: Any = None) -> DeviceInfo:
    """Name, compute capability, SM count and limits of `device` (default: this thread's
    device); cached."""
    ctx = context() if device is None else device_context(device)
    info = _infos.get(ctx.ordinal)
    if info is None:
        drv = driver()
        raw = check(drv.cuDeviceGetName(256, ctx.device), "cuDeviceGetName")
        dev = ctx.ordinal
        info = _infos[ctx.ordinal] = DeviceInfo(
            name=bytes(raw).split(b"\0", 1)[0].decode(errors="replace"),
            ordinal=ctx.ordinal,
            compute_capability=(
                device_attribute("COMPUTE_CAPABILITY_MAJOR", dev),
                device_attribute("COMPUTE_CAPABILITY_MINOR", dev),
            ),
            sm_count=device_attribute("MULTIPROCESSOR_COUNT", dev),
            max_smem_optin=device_attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", dev),
            max_threads_per_block=device_attribute("MAX_THREADS_PER_BLOCK", dev),
            cluster_launch=bool(device_attribute("CLUSTER_LAUNCH", dev)),
        )
    return info


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


def synchronize(stream: Any = None, device: Any = None) -> None:
    """Wait for all work on the device (this thread's, or `device`), or on `stream`, and
    raise DeviceError if a kernel faulted; a sticky fault is reported as such."""
    drv = driver()
    if device is None:
        ensure_current()
    else:
        make_current(device_context(device))
    if stream is None:
        check(drv.cuCtxSynchronize(), "cuCtxSynchronize")
    else:
        check(drv.cuStreamSynchronize(stream_handle(stream)), "cuStreamSynchronize")
