"""Binding and packing of kernel arguments, checked against a KernelInfo before any driver call.

All parameters of a kernel live in one 64-byte-aligned host buffer laid out once per kernel;
a launch refills it with a single `struct.pack_into` and hands the driver the address of a
fixed array of pointers into it (the `void**` form of kernelParams). The driver copies the
values at launch, so the buffer can be reused by the next launch at once.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import fp8
from .. import types as T
from ..codegen import abi
from ..errors import Diagnostic, LaunchError
from ..kernelinfo import KernelInfo, ParamInfo
from ..swizzle import swizzle_align, tma_name, tma_swizzle_bytes
from ..target import target
from .dtypes import compatible, ml_float
from .interop import CUPY_TYPES, TORCH_TYPES, DevicePointer, array_family, describe
from .memory import DeviceArray
from .tensormap import TensorMap

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
        ml_number = isinstance(v, np.generic) and ml_float(v.dtype)  # ml_dtypes' bf16 / fp8
        if isinstance(v, (bool, np.bool_)) or not (ml_number or isinstance(
            v, (int, float, np.integer, np.floating)
        )):
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

    elif t.is_fp8:

        def conv(v: Any) -> Any:
            x = number(v)
            if not fp8.literal_fits(x, t):
                top, extra = fp8.MAX[t.name], "inf/nan" if t == T.e5m2 else "nan"
                raise LaunchError(f"argument '{p.name}' ({t}) must be within [-{top:g}, "
                                  f"{top:g}] (or {extra}), got {x!r}")
            return fp8.to_bits(x, t)

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


class _Trusted:
    """dtypes of torch tensors and cupy arrays already checked against one `ptr` parameter:
    a later array of a trusted dtype (a torch tensor also on the GPU) passes on its address
    alone."""

    __slots__ = ("torch", "cupy")

    def __init__(self) -> None:
        self.torch: set = set()
        self.cupy: set = set()


def _ptr_converter(p: ParamInfo, trusted: _Trusted) -> Converter:
    t = p.dtype
    ok = frozenset(name for name, s in T.SCALARS.items() if compatible(t, s))

    def mismatch(given: T.Scalar) -> LaunchError:
        return LaunchError(
            f"argument '{p.name}' points to {given} elements; the kernel expects ptr<{t}>"
        )

    def conv(v: Any) -> int:
        if type(v) is DeviceArray and v.ptr and v.elem.name in ok:
            return v.ptr
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
        family = array_family(type(v))
        if family == "torch":
            trusted.torch.add(v.dtype)
        elif family == "cupy":
            trusted.cupy.add(v.dtype)
        return desc.ptr

    conv.ok = ok  # type: ignore[attr-defined]
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
            need = swizzle_align(tma_swizzle_bytes(s.swizzle))
            if p.tile_align and p.tile_align < need:
                raise LaunchError(
                    f"argument '{p.name}' is a tensor map with swizzle {s.swizzle}, which needs "
                    f"{need}-byte aligned shared tiles, but the kernel's tile in '{p.tile}' is "
                    f"{p.tile_align}-byte aligned: declare it `align {need}`, or pass a map "
                    "without swizzle"
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

    # what the generated fast path accepts without calling conv: element type, rank and the
    # swizzle the kernel's buffer declares (any, when no buffer declares one) that its tiles
    # are aligned for
    declared = ("none", "32B", "64B", "128B") if p.swizzle is None else (tma_name(p.swizzle),)
    swizzles = [sw for sw in declared if not p.tile_align or
                swizzle_align(tma_swizzle_bytes(sw)) <= p.tile_align]
    conv.sigs = frozenset((name, p.rank, sw) for name in ok  # type: ignore[attr-defined]
                          for sw in swizzles)
    return conv


def _converter(p: ParamInfo, trusted: _Trusted, tma: bool) -> tuple[str, int, Converter]:
    """struct code, alignment and converter of one parameter (`tma`: whether the kernel's
    target reads tensor maps, or tensor descriptors in their place)."""
    if p.kind == "ptr":
        return abi.POINTER_CODE, abi.param_align(p.kind, p.dtype), _ptr_converter(p, trusted)
    if p.kind == "tmap":
        if not tma:  # cp.async reads a tensor descriptor where TMA reads a map
            from .tensordesc import desc_converter

            return abi.TMAP_CODE, abi.TMAP_ALIGN, desc_converter(p)
        return abi.TMAP_CODE, abi.TMAP_ALIGN, _tmap_converter(p)
    if p.kind != "scalar":
        raise LaunchError(f"parameter '{p.name}' has unknown kind {p.kind!r}")
    conv = _float_converter(p) if p.dtype.is_float else _int_converter(p)
    return abi.STRUCT_CODE[p.dtype.name], abi.param_align(p.kind, p.dtype), conv


class ArgPacker:
    """Checks a kernel's arguments and packs them into reusable parameter storage.

    The packing function is generated once per kernel signature: each argument of the
    common kinds (a DeviceArray, torch tensor or cupy array of an already checked dtype; a
    TensorMap of the right element type and rank; an in-range int or float) is checked inline
    in a few attribute reads, and anything else goes through the full converter, which
    checks everything and reports every bad argument at once."""

    _convs: tuple[Converter, ...]
    _trusted: list[_Trusted]
    _layout: tuple[list[str], list[int], int]

    def __init__(self, info: KernelInfo, _shared: ArgPacker | None = None):
        self.info = info
        self.names = tuple(p.name for p in info.params)
        self._index = {n: i for i, n in enumerate(self.names)}
        if _shared is not None:  # a copy with its own storage, for another thread
            self._convs, self._trusted = _shared._convs, _shared._trusted
            fmt, offsets, size = _shared._layout
        else:
            self._trusted = [_Trusted() for _ in info.params]
            fmt, offsets, convs, size = ["<"], [], [], 0
            tma = target(info.arch).tma
            for p, tr in zip(info.params, self._trusted, strict=True):
                code, align, conv = _converter(p, tr, tma)
                pad = -size % align
                if pad:
                    fmt.append(f"{pad}x")
                size += pad
                offsets.append(size)
                fmt.append(code)
                size += p.nbytes
                convs.append(conv)
            self._convs = tuple(convs)
        self._layout = (fmt, offsets, size)
        pack_into = struct.Struct("".join(fmt)).pack_into
        store = np.zeros(size + abi.PARAM_BUFFER_ALIGN, np.uint8)
        start = -store.ctypes.data % abi.PARAM_BUFFER_ALIGN
        aligned = store[start : start + max(size, 1)]
        base = aligned.ctypes.data
        self._buffer = aligned.data
        self._pointers = np.array([base + off for off in offsets], np.uint64)
        # The driver takes the array's address as an int: the cheapest kernelParams form.
        self.params_address = int(self._pointers.ctypes.data) if offsets else 0
        self.fast = _generate(info, self._convs, self._trusted, pack_into, self._buffer,
                              self.params_address, self._raise_all)

    def copy(self) -> ArgPacker:
        """A packer for the same kernel with its own storage (one per launching thread)."""
        return ArgPacker(self.info, self)

    def pack(self, args: tuple, kwargs: dict) -> int:
        """Check and store the arguments; returns the address of the `void*[]` array."""
        if kwargs or len(args) != len(self._convs):
            args = self.bind(args, kwargs)
        return self.fast(*args)

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


def _inline(i: int, p: ParamInfo, tma: bool) -> list[str]:
    """Source lines that set r{i} from a{i}: the common cases inline, else c{i}(a{i})."""
    a, r, c = f"a{i}", f"r{i}", f"c{i}({'a' + str(i)})"
    if p.kind == "ptr":
        return [
            f"t = type({a})",
            f"if t in TORCH_TYPES and {a}.dtype in torch{i} and {a}.is_cuda:",
            f"    {r} = {a}.data_ptr()",
            f"elif t is DeviceArray and {a}.ptr and {a}.elem.name in ok{i}:",
            f"    {r} = {a}.ptr",
            f"elif t in CUPY_TYPES and {a}.dtype in cupy{i}:",
            f"    {r} = {a}.data.ptr",
            "else:",
            f"    {r} = {c}",
        ]
    if p.kind == "tmap" and not tma:  # a tensor descriptor, built per call
        return [f"{r} = {c}"]
    if p.kind == "tmap":
        return [f"{r} = {a}.raw if type({a}) is TensorMap and {a}.sig in sigs{i} else {c}"]
    t = p.dtype
    if t.is_float:
        if t.name == "f64":
            return [f"{r} = {a} if type({a}) is float else {c}"]
        if t.name == "f32":
            return [f"{r} = {a} if type({a}) is float and -{_F32_MAX!r} <= {a} <= "
                    f"{_F32_MAX!r} else {c}"]
        return [f"{r} = {c}"]
    hi = _int_range(t)[1]
    return [f"{r} = {a} if type({a}) is int and 0 <= {a} <= {hi} else {c}"]


def _generate(info: KernelInfo, convs: tuple, trusted: list, pack_into: Any, buffer: Any,
              address: int, raise_all: Any) -> Callable[..., int]:
    """`pack(a0, a1, ...) -> address`: check, convert and pack one launch's arguments."""
    params = [f"a{i}" for i in range(len(convs))]
    tma = target(info.arch).tma
    body = [line for i, p in enumerate(info.params) for line in _inline(i, p, tma)]
    results = "".join(f", r{i}" for i in range(len(convs)))
    src = "\n".join([
        f"def pack({', '.join(params)}):",
        "    try:",
        *(f"        {line}" for line in body),
        f"        pack_into(buffer, 0{results})",
        "    except LaunchError:",
        f"        raise_all(({''.join(a + ', ' for a in params)}))",
        "        raise",
        "    return address",
    ])
    env: dict[str, Any] = {
        "DeviceArray": DeviceArray, "TensorMap": TensorMap, "TORCH_TYPES": TORCH_TYPES,
        "CUPY_TYPES": CUPY_TYPES, "LaunchError": LaunchError, "pack_into": pack_into,
        "buffer": buffer, "address": address, "raise_all": raise_all,
    }  # fmt: skip
    for i, (conv, tr) in enumerate(zip(convs, trusted, strict=True)):
        # each name the generated code reads is bound here, so a check is a global load
        env[f"c{i}"], env[f"torch{i}"], env[f"cupy{i}"] = conv, tr.torch, tr.cupy
        env[f"ok{i}"], env[f"sigs{i}"] = getattr(conv, "ok", None), getattr(conv, "sigs", None)
    exec(compile(src, f"<ptxdsl packer for {info.name}>", "exec"), env)  # noqa: S102
    return env["pack"]
