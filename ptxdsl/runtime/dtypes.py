"""Element types at the host boundary: numpy/torch dtypes to ptxdsl scalars, and bf16 bits.

bf16 data lives on the host as ml_dtypes' `bfloat16` numpy dtype (`types.numpy_dtype`), and
so do the fp8 types e4m3 and e5m2 (`float8_e4m3fn`, `float8_e5m2`; torch's float8_e4m3fn and
float8_e5m2). uint16 arrays are still accepted as bf16 bit patterns where bf16 data is given
(`host_array`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import types as T
from ..errors import LaunchError

_FROM_NUMPY: dict[str, T.Scalar] = {
    "uint8": T.u8, "uint16": T.u16, "uint32": T.u32, "uint64": T.u64,
    "int8": T.s8, "int16": T.s16, "int32": T.s32, "int64": T.s64,
    "float16": T.f16, "float32": T.f32, "float64": T.f64, "bool": T.pred,
    "bfloat16": T.bf16, "float8_e4m3fn": T.e4m3, "float8_e5m2": T.e5m2,  # ml_dtypes' dtypes
}  # fmt: skip

_FROM_TORCH: dict[str, T.Scalar] = {
    "torch.uint8": T.u8, "torch.uint16": T.u16, "torch.uint32": T.u32, "torch.uint64": T.u64,
    "torch.int8": T.s8, "torch.int16": T.s16, "torch.int32": T.s32, "torch.int64": T.s64,
    "torch.float16": T.f16, "torch.bfloat16": T.bf16, "torch.float32": T.f32,
    "torch.float64": T.f64, "torch.bool": T.pred, "torch.float8_e4m3fn": T.e4m3,
    "torch.float8_e5m2": T.e5m2,
}  # fmt: skip


def scalar_of(dtype: Any) -> T.Scalar:
    """The ptxdsl scalar type named by `dtype`: a Scalar, its name ("f32", "bf16"), a numpy
    dtype or type, or a torch dtype."""
    if isinstance(dtype, T.Scalar):
        return dtype
    if isinstance(dtype, str) and dtype in T.SCALARS:
        return T.SCALARS[dtype]
    text = str(dtype)
    if text.startswith("torch."):
        if text in _FROM_TORCH:
            return _FROM_TORCH[text]
        raise LaunchError(f"torch dtype {text} has no ptxdsl element type")
    try:
        name = np.dtype(dtype).name
    except TypeError:
        raise LaunchError(
            f"unknown element type {dtype!r}; expected one of {', '.join(T.SCALARS)}"
        ) from None
    if name not in _FROM_NUMPY:
        raise LaunchError(f"numpy dtype {name} has no ptxdsl element type")
    return _FROM_NUMPY[name]


def ml_float(dtype: np.dtype) -> bool:
    """Whether `dtype` is one of ml_dtypes' floats (bfloat16, float8_*), which numpy arrays
    hold but cupy, torch and `__cuda_array_interface__` do not read (their numpy kind is not
    even uniform: 'V' for most, 'f' for float8_e5m2)."""
    return dtype.type.__module__ == "ml_dtypes"


def bits_dtype(elem: T.Scalar) -> np.dtype:
    """The unsigned integer dtype of `elem`'s size: how its bits cross an interface that knows
    no bf16 or fp8 (`__cuda_array_interface__`)."""
    return np.dtype(f"<u{elem.nbytes}")


def host_array(a: np.ndarray, elem: T.Scalar) -> np.ndarray | None:
    """`a` viewed as the host dtype of `elem` when its data already is `elem` data (bf16
    given as bfloat16, or as uint16 bit patterns); None when it is not."""
    want = T.numpy_dtype(elem)
    if a.dtype == want:
        return a
    if elem.kind == "f" and elem.nbytes == 2 and elem.name != "f16" and a.dtype == np.uint16:
        return a.view(want)
    return None


def compatible(expected: T.Scalar, given: T.Scalar) -> bool:
    """Whether data of type `given` may be passed where `expected` elements are declared.

    Bit types (b16/b32/b64) take any element of their size; every other type must match
    exactly, so s32 data is not silently read as u32 and u16 bits are not read as bf16."""
    if expected == given:
        return True
    return expected.nbytes == given.nbytes and (expected.kind == "b" or given.kind == "b")


def f32_to_bf16_bits(values: Any) -> np.ndarray:
    """bf16 bit patterns (uint16) of float values, rounded to nearest even; NaN stays NaN."""
    f = np.asarray(values, dtype=np.float32)
    u = f.view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    # Rounding could carry a NaN payload into the infinity pattern; keep it a quiet NaN.
    out = np.where(np.isnan(f), (u >> np.uint32(16)) | np.uint32(0x40), rounded)
    return out.astype(np.uint16)


def bf16_bits_to_f32(bits: Any) -> np.ndarray:
    """float32 values of bf16 bit patterns (uint16)."""
    b = np.asarray(bits, dtype=np.uint16)
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bf16 bit patterns (uint16)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
