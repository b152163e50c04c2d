"""Binding and packing of kernel arguments, checked against a KernelInfo before any driver call.

All parameters of a kernel live in one 64-byte-aligned host buffer laid out once per kernel;
a launch refills it with a single `struct.pack_into` and hands the driver the address of a
fixed array of pointers into it (the `void**` form of kernelParams). The driver copies the
values at launch, so the buffer can be reused by the next launch at once.
"""

from __future__ import annotations

import math
import operator
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import types as T
from ..errors import Diagnostic, LaunchError
from ..kernelinfo import KernelInfo, ParamInfo
from ..swizzle import tma_name
from .dtypes import compatible
from .interop import DevicePointer, describe
from .memory import DeviceArray
from .tensormap import TensorMap

# struct codes of the bit pattern each scalar type is passed as; f16 and bf16 are converted to
# their 16-bit patterns first so that range errors can be reported per argument.
_CODE = {
    "u8": "B", "s8": "b", "u16": "H", "s16": "h", "b16": "H", "f16": "H", "bf16": "H",
    "u32": "I", "s32": "i", "b32": "I", "f32": "f", "u64": "Q", "s64": "q", "b64": "Q",
    "f64": "d", "pred": "B",
}  # fmt: skip
_F32_MAX = 3.4028234663852886e38

Converter = Callable[[Any], Any]


def _describe_value(v: Any) -> str:
    text = repr(v)
    if len(text) > 40:
        text = text[:37] + "..."
    if isinstance(v, (int, float)) or text.startswith(type(v).__name__):
        return text
    return f"{type(v).__name__} {text}"


def _int_range(t: T.Scalar) -> tuple[int, int]:
    if t.is_pred:
        return 0, 1
    if t.is_signed:
        return -(1 << (t.nbits - 1)), (1 << (t.nbits - 1)) - 1
    if t.kind == "b":  # bit types take either signed or unsigned spellings of a pattern
        return -(1 << (t.nbits - 1)), (1 << t.nbits) - 1
    return 0, (1 << t.nbits) - 1


def _int_converter(p: ParamInfo) -> Converter:
    t = p.dtype
    lo, hi = _int_range(t)
    mask = (1 << t.nbits) - 1

    def slow(v: Any) -> int:
        if isinstance(v, (bool, np.bool_)):
            v = int(v)
        elif isinstance(v, np.integer):
            v = int(v)
        elif not isinstance(v, int):
            raise LaunchError(
                f"argument '{p.name}' ({t}) must be an integer, got {_describe_value(v)}"
            )
        if not lo <= v <= hi:
            raise LaunchError(f"argument '{p.name}' ({t}) must be in [{lo}, {hi}], got {v}")
        return v & mask if t.kind == "b" else v

    def conv(v: Any) -> int:
        if type(v) is int and 0 <= v <= hi:
            return v
        return slow(v)

    return conv


def _float_converter(p: ParamInfo) -> Converter:
    t = p.dtype

    def number(v: Any) -> float:
        if isinstance(v, (bool, np.bool_)) or not isinstance(
            v, (int, float, np.integer, np.floating)
        ):
            raise LaunchError(
                f"argument '{p.name}' ({t}) must be a number, got {_describe_value(v)}"
            )
        try:
            return float(v)
        except OverflowError:
            raise LaunchError(f"argument '{p.name}' ({t}) is out of range, got {v}") from None

    def packed(code: str, x: float, limit: str) -> bytes:
        try:
            return struct.pack(code, x)
        except OverflowError:
            raise LaunchError(
                f"argument '{p.name}' ({t}) must be within [-{limit}, {limit}] "
                f"(or inf/nan), got {x!r}"
            ) from None

    if t.name == "f64":

        def conv(v: Any) -> Any:
            return v if type(v) is float else number(v)

    elif t.name == "f32":

        def conv(v: Any) -> Any:
            if type(v) is float and -_F32_MAX <= v <= _F32_MAX:
                return v
            x = number(v)
            packed("<f", x, "3.4028235e+38")
            return x

    elif t.name == "f16":

        def conv(v: Any) -> Any:
            return struct.unpack("<H", packed("<e", number(v), "65504"))[0]

    else:

        def conv(v: Any) -> Any:
            return _bf16_bits(number(v), p)

    return conv


def _bf16_bits(x: float, p: ParamInfo) -> int:
    if math.isnan(x):
        return 0x7FC0
    try:
        u = struct.unpack("<I", struct.pack("<f", x))[0]
    except OverflowError:
        raise LaunchError(
            f"argument '{p.name}' (bf16) must be within the bf16 range (or inf/nan), got {x!r}"
        ) from None
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded & 0xFFFF


def _ptr_converter(p: ParamInfo) -> Converter:
    t = p.dtype
    ok = frozenset(name for name, s in T.SCALARS.items() if compatible(t, s))

    def mismatch(given: T.Scalar) -> LaunchError:
        return LaunchError(
            f"argument '{p.name}' points to {given} elements; the kernel expects ptr<{t}>"
        )

    def slow(v: Any) -> int:
        if isinstance(v, DevicePointer):
            if v.dtype is not None and v.dtype.name not in ok:
                raise mismatch(v.dtype)
            return v.address
        if isinstance(v, int) and not isinstance(v, bool):
            raise LaunchError(
                f"argument '{p.name}' (ptr<{t}>) got the int {v}; pass a device address as "
                "DevicePointer(address) or pass the array itself"
            )
        desc = describe(v, f"argument '{p.name}' (ptr<{t}>)")
        if desc.elem.name not in ok:
            raise mismatch(desc.elem)
        return desc.ptr

    def conv(v: Any) -> int:
        if type(v) is DeviceArray and v.ptr and v.elem.name in ok:
            return v.ptr
        return slow(v)

    return conv


def _tmap_converter(p: ParamInfo) -> Converter:
    want = f"tmap<{p.dtype}, {p.rank}>"
    ok = frozenset(name for name, s in T.SCALARS.items() if compatible(p.dtype, s))

    def conv(v: Any) -> bytes:
        if type(v) is TensorMap:
            s = v.spec
            if p.swizzle is not None and s.swizzle != tma_name(p.swizzle):
                raise LaunchError(
                    f"argument '{p.name}' is a tensor map with swizzle {s.swizzle}, but the "
                    f"kernel's buffer '{p.buffer}' declares "
                    f"{f'swizzle {p.swizzle}' if p.swizzle else 'no swizzle'}: TMA would lay "
                    "the tile out differently from what the kernel reads"
                )
            if s.elem.name in ok and len(s.shape) == p.rank:
                return v.raw
            raise LaunchError(
                f"argument '{p.name}' is a tensor map of {s.elem} with rank {len(s.shape)}; "
                f"the kernel expects {want}"
            )
        raise LaunchError(
            f"argument '{p.name}' ({want}) must be a ptxdsl TensorMap, got {_describe_value(v)}"
        )

    return conv


def _converter(p: ParamInfo) -> tuple[str, int, Converter]:
    """struct code, alignment and converter of one parameter."""
    if p.kind == "ptr":
        return "Q", 8, _ptr_converter(p)
    if p.kind == "tmap":
        return "128s", 64, _tmap_converter(p)
    if p.kind != "scalar":
        raise LaunchError(f"parameter '{p.name}' has unknown kind {p.kind!r}")
    conv = _float_converter(p) if p.dtype.is_float else _int_converter(p)
    return _CODE[p.dtype.name], p.dtype.nbytes, conv


class ArgPacker:
    """Checks a kernel's arguments and packs them into reusable parameter storage."""

    def __init__(self, info: KernelInfo):
        self.info = info
        self.names = tuple(p.name for p in info.params)
        self._index = {n: i for i, n in enumerate(self.names)}
        fmt, offsets, convs, size = ["<"], [], [], 0
        for p in info.params:
            code, align, conv = _converter(p)
            pad = -size % align
            if pad:
                fmt.append(f"{pad}x")
            size += pad
            offsets.append(size)
            fmt.append(code)
            size += p.nbytes
            convs.append(conv)
        self._pack_into = struct.Struct("".join(fmt)).pack_into
        self._convs = tuple(convs)
        store = np.zeros(size + 64, np.uint8)
        start = -store.ctypes.data % 64
        aligned = store[start : start + max(size, 1)]
        base = aligned.ctypes.data
        self._buffer = aligned.data
        self._pointers = np.array([base + off for off in offsets], np.uint64)
        # The driver takes the array's address as an int: the cheapest kernelParams form.
        self.params_address = int(self._pointers.ctypes.data) if offsets else 0

    def pack(self, args: tuple, kwargs: dict) -> int:
        """Check and store the arguments; returns the address of the `void*[]` array."""
        if kwargs or len(args) != len(self._convs):
            args = self.bind(args, kwargs)
        try:
            # map() with a C-level call keeps the per-launch cost well under a microsecond.
            self._pack_into(self._buffer, 0, *map(_call, self._convs, args))
        except LaunchError:
            self._raise_all(args)
            raise
        return self.params_address

    def bind(self, args: tuple, kwargs: dict) -> tuple:
        """Positional and keyword arguments in parameter order, or a LaunchError naming every
        missing, extra or duplicated argument."""
        name, n = self.info.name, len(self.names)
        listing = ", ".join(self.names) or "none"
        errors = []
        if len(args) > n:
            errors.append(
                f"kernel '{name}' takes {n} argument{'s' * (n != 1)} ({listing}), got {len(args)}"
            )
        bound: list[Any] = list(args[:n]) + [_MISSING] * (n - min(len(args), n))
        for key, value in kwargs.items():
            i = self._index.get(key)
            if i is None:
                errors.append(f"kernel '{name}' has no parameter '{key}' (parameters: {listing})")
            elif i < len(args):
                errors.append(f"argument '{key}' given both by position and by keyword")
            else:
                bound[i] = value
        missing = [self.names[i] for i, v in enumerate(bound) if v is _MISSING]
        if missing and len(args) <= n:
            which = ", ".join(f"'{m}'" for m in missing)
            errors.append(
                f"kernel '{name}' is missing argument{'s' * (len(missing) > 1)} {which} "
                f"(parameters: {listing})"
            )
        if errors:
            raise LaunchError([Diagnostic(e) for e in errors])
        return tuple(bound)

    def _raise_all(self, args: tuple) -> None:
        """Report every bad argument at once, not only the first."""
        errors: list[Diagnostic] = []
        for conv, a in zip(self._convs, args, strict=True):
            try:
                conv(a)
            except LaunchError as e:
                errors += e.diagnostics
        if len(errors) > 1:
            raise LaunchError(errors)


_MISSING = object()
_call = getattr(operator, "call", lambda f, v: f(v))  # operator.call is new in 3.11
