"""Device memory owned by ptxdsl: `DeviceArray`, `empty`, `zeros`, `to_device`.

Allocations come from `cuMemAlloc`, which aligns every block to at least 256 bytes, so a
fresh array satisfies the 16-byte rule of bulk copies and tensor maps. Copies use the legacy
default stream and are synchronous: a copy back to the host waits for kernels launched on
the default stream (or on blocking streams) before it."""

from __future__ import annotations

from math import prod
from typing import Any

import numpy as np

from .. import types as T
from ..errors import LaunchError
from .driver import check, device_context, driver, ensure_current, make_current
from .dtypes import bits_dtype, f32_to_bf16_bits, host_array, ml_float, scalar_of
from .interop import ArrayDesc, contiguous_strides
from .resource import Resource


def _shape_of(shape: Any) -> tuple[int, ...]:
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0:
            raise LaunchError(f"shape must be non-negative ints, got {shape!r}")
    return tuple(int(d) for d in shape)


class DeviceArray(Resource):
    """A C-contiguous array in GPU memory.

    `elem` is the ptxdsl element type; `dtype` is the numpy dtype that holds it on the host
    (bf16: ml_dtypes' bfloat16; uint16 bit patterns are accepted too). Exposes
    `__cuda_array_interface__`, so `torch.as_tensor(a, device="cuda")` and `cupy.asarray(a)`
    view it without copying.
    Freed by `free()` (or `close()`), at the end of a `with` block, or when
    garbage-collected (see resource.py).

    `device` is the ordinal of the GPU whose context allocated it or through which it is
    reached (None: this thread's device); copies and `free` run in that context. A view of
    memory owned by something else (`owner`, e.g. a VMM allocation) keeps it alive."""

    __slots__ = ("ptr", "shape", "elem", "dtype", "nbytes", "device", "_owned", "_owner",
                 "_desc", "__weakref__")  # fmt: skip
    noun, released = "device array", "freed"

    def __init__(
        self,
        ptr: int,
        shape: tuple[int, ...],
        elem: T.Scalar,
        *,
        owned: bool,
        device: int | None = None,
        owner: Any = None,
    ):
        self.ptr = ptr
        self.shape = shape
        self.elem = elem
        self.dtype = T.numpy_dtype(elem)
        self.nbytes = prod(shape) * elem.nbytes
        self.device = device
        self._owned = owned
        self._owner = owner
        self._desc = ArrayDesc(ptr, shape, contiguous_strides(shape, elem.nbytes), elem)
        Resource.__init__(self)

    def _current(self) -> None:
        if self.device is None:
            ensure_current()
        else:
            make_current(device_context(self.device))

    @property
    def __ptxdsl_array__(self) -> ArrayDesc:
        self._check_open()
        return self._desc

    @property
    def size(self) -> int:
        """Number of elements."""
        return prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def strides(self) -> tuple[int, ...]:
        """Row-major strides in bytes."""
        return self._desc.strides

    @property
    def __cuda_array_interface__(self) -> dict:
        return {
            "shape": self.shape,
            # bf16 and fp8 cross as their bits: cupy and torch read no ml_dtypes typestr
            "typestr": (bits_dtype(self.elem) if ml_float(self.dtype) else self.dtype).str,
            "data": (self.ptr, False),
            "strides": None,
            "version": 3,
            "stream": None,
        }

    def copy_to_host(self, out: np.ndarray | None = None) -> np.ndarray:
        """A numpy copy of the data (bf16 as bfloat16); writes into `out` when given (bf16
        also into uint16 bit patterns)."""
        self._check_open()
        if out is None:
            out = np.empty(self.shape, self.dtype)
        elif host_array(out, self.elem) is None or out.nbytes != self.nbytes or \
                not out.flags.c_contiguous:
            raise LaunchError(
                f"out must be a C-contiguous {self.dtype} array of {self.nbytes} bytes, "
                f"got {out.dtype} with {out.nbytes} bytes"
            )
        if self.nbytes:
            self._current()
            check(driver().cuMemcpyDtoH(out, self.ptr, self.nbytes), "cuMemcpyDtoH")
        return out

    def numpy(self) -> np.ndarray:
        """Same as `copy_to_host()`."""
        return self.copy_to_host()

    def copy_from_host(self, array: Any) -> None:
        """Overwrite the data with a host array of the same size and dtype."""
        src = np.ascontiguousarray(array)
        if host_array(src, self.elem) is None or src.nbytes != self.nbytes:
            raise LaunchError(
                f"cannot copy a {src.dtype} array of {src.nbytes} bytes into a device array "
                f"of {self.elem} with {self.nbytes} bytes"
            )
        self._check_open()
        if self.nbytes:
            self._current()
            check(driver().cuMemcpyHtoD(self.ptr, src, self.nbytes), "cuMemcpyHtoD")

    def free(self) -> None:
        """Release the memory now (same as `close()`); later use of the array raises."""
        self.close()

    def _release(self) -> None:
        ptr, self.ptr = self.ptr, 0  # 0 also sends a freed array off the launch fast path
        self._owner = None
        if ptr and self._owned:
            self._current()
            check(driver().cuMemFree(ptr), "cuMemFree")

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d device array")
        return self.shape[0]

    def __repr__(self) -> str:
        where = "" if self.device is None else f", device={self.device}"
        return f"DeviceArray(shape={self.shape}, dtype={self.elem}, ptr=0x{self.ptr:x}{where})"


def empty(shape: Any, dtype: Any = "f32", device: int | None = None) -> DeviceArray:
    """An uninitialised device array; `dtype` is a ptxdsl type name, Scalar or numpy dtype;
    `device` the GPU ordinal it lives on (default: this thread's device)."""
    shape = _shape_of(shape)
    elem = scalar_of(dtype)
    nbytes = prod(shape) * elem.nbytes
    if device is not None:
        ctx = device_context(device)  # checks the ordinal before anything is allocated
        device = ctx.ordinal
    ptr = 0
    if nbytes:
        if device is None:
            ensure_current()
        else:
            make_current(ctx)
        ptr = int(check(driver().cuMemAlloc(nbytes), "cuMemAlloc"))
    return DeviceArray(ptr, shape, elem, owned=True, device=device)


def zeros(shape: Any, dtype: Any = "f32", device: int | None = None) -> DeviceArray:
    """A device array filled with zero bytes."""
    arr = empty(shape, dtype, device)
    if arr.nbytes:
        arr._current()
        check(driver().cuMemsetD8(arr.ptr, 0, arr.nbytes), "cuMemsetD8")
    return arr


def to_device(array: Any, dtype: Any = None, device: int | None = None) -> DeviceArray:
    """Copy a host array to a new device array (on GPU `device`, default this thread's).

    `dtype` converts the data first; with `dtype="bf16"` a float array is rounded to bf16
    and a uint16 array is taken as bf16 bit patterns (a bfloat16 array is bf16 already)."""
    host = np.asarray(array)
    elem = scalar_of(host.dtype) if dtype is None else scalar_of(dtype)
    if elem == T.bf16 and host_array(host, elem) is None:
        if host.dtype.kind != "f":
            raise LaunchError(f"bf16 data must be given as bfloat16, floats or uint16 bits, "
                              f"got {host.dtype}")
        host = f32_to_bf16_bits(host)
    if elem == T.bf16:
        host = host.view(T.numpy_dtype(elem)) if host.dtype == np.uint16 else host
    host = np.asarray(host, dtype=T.numpy_dtype(elem))
    if not host.flags.c_contiguous:
        host = host.copy(order="C")
    out = empty(host.shape, elem, device)
    out.copy_from_host(host)
    return out
