"""Zero-copy views of device memory owned by others: torch tensors, cupy arrays, anything with
`__cuda_array_interface__` or a CUDA `__dlpack__`, and raw addresses (`DevicePointer`).

None of this imports torch or cupy; objects are recognised by their protocols."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import types as T
from ..errors import LaunchError
from .dtypes import scalar_of


@dataclass(frozen=True, slots=True)
class DevicePointer:
    """A raw device address, passed to a `ptr` parameter as is.

    `dtype` (optional) is the element type it points to; when given it is checked against
    the parameter like an array's element type."""

    address: int
    dtype: T.Scalar | None = None

    def __post_init__(self) -> None:
        if isinstance(self.address, bool) or not isinstance(self.address, int):
            raise TypeError(f"DevicePointer address must be an int, got {self.address!r}")
        if not 0 <= self.address < 1 << 64:
            raise ValueError(f"DevicePointer address must be in [0, 2**64), got {self.address}")
        if self.dtype is not None and not isinstance(self.dtype, T.Scalar):
            object.__setattr__(self, "dtype", scalar_of(self.dtype))

    def __int__(self) -> int:
        return self.address


@dataclass(frozen=True, slots=True)
class ArrayDesc:
    """Where an array lives and how it is laid out: row-major shape, strides in bytes."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    elem: T.Scalar


def contiguous_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """Row-major (C order) byte strides of `shape`."""
    strides = []
    step = itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))


def host_array_error(what: str) -> LaunchError:
    return LaunchError(
        f"{what} is a numpy array in host memory; copy it to the device first, "
        "e.g. ptxdsl.runtime.to_device(array)"
    )


def describe(obj: Any, what: str = "argument") -> ArrayDesc:
    """The device address, shape, strides and element type of an array-like in GPU memory.

    Raises LaunchError naming `what` for host arrays, CPU tensors and unknown objects."""
    own = getattr(obj, "__ptxdsl_array__", None)
    if own is not None:
        return own
    if isinstance(obj, np.ndarray):
        raise host_array_error(what)
    if type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr"):
        return _describe_torch(obj, what)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return _describe_cai(cai, what)
    if hasattr(obj, "__array_interface__"):
        raise host_array_error(what)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _describe_dlpack(obj, what)
    raise LaunchError(
        f"{what} must be a device array (ptxdsl DeviceArray, torch or cupy CUDA array) "
        f"or a DevicePointer, got {type(obj).__name__}"
    )


def _torch_key(t: Any) -> tuple:
    return t.data_ptr(), t.shape, t.stride(), t.dtype, t.is_cuda


def _cupy_key(a: Any) -> tuple:
    return a.data.ptr, a.shape, a.strides, a.dtype


# Array types recognised so far (by module name, so torch and cupy are never imported here).
# Their device address costs a few attribute reads: torch `t.data_ptr()` (with `t.dtype` and
# `t.is_cuda` to check), cupy `a.data.ptr` (with `a.dtype`); no DLPack, no ArrayDesc.
TORCH_TYPES: set[type] = set()
CUPY_TYPES: set[type] = set()
_OTHER_TYPES: set[type] = set()


def array_family(tp: type) -> str | None:
    """"torch" for torch tensor types, "cupy" for cupy arrays, None for anything else;
    the answer is remembered in TORCH_TYPES / CUPY_TYPES."""
    if tp in TORCH_TYPES:
        return "torch"
    if tp in CUPY_TYPES:
        return "cupy"
    if tp in _OTHER_TYPES:
        return None
    top = (tp.__module__ or "").split(".")[0]
    if top == "torch" and hasattr(tp, "data_ptr") and hasattr(tp, "is_cuda"):
        TORCH_TYPES.add(tp)
        return "torch"
    if top == "cupy" and tp.__name__ == "ndarray":
        CUPY_TYPES.add(tp)
        return "cupy"
    _OTHER_TYPES.add(tp)
    return None


def layout_key(obj: Any) -> tuple | None:
    """A hashable (address, shape, strides, dtype) of a torch tensor, cupy array or ptxdsl
    DeviceArray, read without building an ArrayDesc; None for other objects."""
    family = array_family(type(obj))  # first: a missed attribute on a tensor is slow
    if family == "torch":
        return _torch_key(obj)
    if family == "cupy":
        return _cupy_key(obj)
    own = getattr(obj, "__ptxdsl_array__", None)
    if own is not None:
        return (own.ptr, own.shape, own.strides, own.elem)
    return None


def as_device_pointer(obj: Any) -> DevicePointer:
    """A DevicePointer to the data of a DeviceArray, torch tensor, cupy array or int address,
    without copying; its dtype is the array's element type."""
    if isinstance(obj, DevicePointer):
        return obj
    if isinstance(obj, int) and not isinstance(obj, bool):
        return DevicePointer(obj)
    desc = describe(obj)
    return DevicePointer(desc.ptr, desc.elem)


def _describe_torch(t: Any, what: str) -> ArrayDesc:
    # data_ptr() and stride() work where torch's __cuda_array_interface__ refuses
    # (bfloat16, tensors that require grad).
    if not t.is_cuda:
        raise LaunchError(
            f"{what} is a torch tensor on {t.device}; move it to the GPU first (tensor.cuda())"
        )
    elem = scalar_of(t.dtype)
    itemsize = t.element_size()
    return ArrayDesc(t.data_ptr(), tuple(t.shape), tuple(s * itemsize for s in t.stride()), elem)


def _describe_cai(cai: dict, what: str) -> ArrayDesc:
    if cai.get("mask") is not None:
        raise LaunchError(f"{what}: masked arrays are not supported")
    dtype = np.dtype(cai["typestr"])
    shape = tuple(int(d) for d in cai["shape"])
    strides = cai.get("strides")
    strides = contiguous_strides(shape, dtype.itemsize) if strides is None else tuple(strides)
    return ArrayDesc(int(cai["data"][0]), shape, strides, scalar_of(dtype))


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13
_DL_CODES = {0: "s", 1: "u", 2: "f", 4: "bf", 6: "pred"}
_DL_FP8 = {10: "e4m3", 12: "e5m2"}  # kDLFloat8_e4m3fn, kDLFloat8_e5m2 (DLPack 1.1)


def _describe_dlpack(obj: Any, what: str) -> ArrayDesc:
    dev_type, _ = obj.__dlpack_device__()
    if int(dev_type) not in (_DL_CUDA, _DL_CUDA_MANAGED):
        raise LaunchError(
            f"{what} is a DLPack array on device type {int(dev_type)}, not in GPU memory; "
            "copy it to the device first, e.g. ptxdsl.runtime.to_device(array)"
        )
    capsule = obj.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    # The managed tensor begins with its DLTensor. The capsule is not consumed, so its
    # destructor releases the producer's reference when it goes out of scope; `obj` keeps
    # the memory alive meanwhile.
    t = ctypes.cast(get(capsule, b"dltensor"), ctypes.POINTER(_DLTensor)).contents
    kind = _DL_CODES.get(t.dtype.code)
    if (kind is None and t.dtype.code not in _DL_FP8) or t.dtype.lanes != 1:
        raise LaunchError(f"{what}: unsupported DLPack dtype code {t.dtype.code}")
    name = _DL_FP8.get(t.dtype.code) or ("bf16" if kind == "bf" else "pred" if kind == "pred"
                                         else f"{kind}{t.dtype.bits}")
    if name not in T.SCALARS:
        raise LaunchError(f"{what}: DLPack dtype {name} has no ptxdsl element type")
    elem = T.SCALARS[name]
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if t.strides:
        strides = tuple(t.strides[i] * elem.nbytes for i in range(t.ndim))
    else:
        strides = contiguous_strides(shape, elem.nbytes)
    return ArrayDesc((t.data or 0) + t.byte_offset, shape, strides, elem)
