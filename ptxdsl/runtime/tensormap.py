"""`TensorMap`: a CUtensorMap (TMA descriptor) checked against every encoder rule first.

Shapes, strides, boxes, element strides and im2col corners are given in numpy order
(row-major: outermost dimension first, strides in bytes); the driver wants innermost first,
so they are reversed only when encoding. Validation is pure Python, so every rejection can
be tested without a GPU, and its messages use the same numpy-order indices the caller used.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import types as T
from ..errors import Diagnostic, LaunchError
from .driver import check, driver, ensure_current
from .dtypes import scalar_of
from .interop import DevicePointer, contiguous_strides, describe, host_array_error

SWIZZLE_SPAN = {"none": 0, "32B": 32, "64B": 64, "128B": 128}
INTERLEAVES = ("none", "16B", "32B")
L2_PROMOTIONS = ("none", "64B", "128B", "256B")
OOB_FILLS = ("zero", "nan")

_DATA_TYPE = {
    "u8": "UINT8", "s8": "UINT8", "u16": "UINT16", "s16": "UINT16", "b16": "UINT16",
    "u32": "UINT32", "b32": "UINT32", "s32": "INT32", "u64": "UINT64", "b64": "UINT64",
    "s64": "INT64", "f16": "FLOAT16", "bf16": "BFLOAT16", "f32": "FLOAT32", "f64": "FLOAT64",
}  # fmt: skip
# s8/s16 have no TMA type of their own; copies move bytes, so the unsigned type of the
# same width moves them unchanged.

# Range of each im2col corner offset, by tensor rank (cuTensorMapEncodeIm2col).
_CORNER_RANGE = {3: (-(2**15), 2**15 - 1), 4: (-(2**7), 2**7 - 1), 5: (-(2**4), 2**4 - 1)}


@dataclass(frozen=True, slots=True)
class TensorMapSpec:
    """Every input of one encoding, normalised; equal specs encode to equal bytes."""

    mode: str
    elem: T.Scalar
    address: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    element_strides: tuple[int, ...]
    swizzle: str
    interleave: str
    l2_promotion: str
    oob_fill: str
    pixel_box_lower: tuple[int, ...] = ()
    pixel_box_upper: tuple[int, ...] = ()
    channels_per_pixel: int = 0
    pixels_per_column: int = 0

    @property
    def rank(self) -> int:
        return len(self.shape)


class TensorMap:
    """A 128-byte tensor map for `cp.async.bulk.tensor`, passed to a `tmap` parameter by value.

    `source` is a device array (DeviceArray, torch or cupy CUDA array): address, shape,
    strides and dtype come from it (`dtype` may relabel elements of the same size, e.g.
    uint16 data as bf16). Or `source` is a `DevicePointer`/int address, and `dtype`, `shape`
    and optionally `strides` (bytes; default row-major contiguous) describe the memory.

    mode "tiled" (rank 1..5) copies `box`-shaped tiles; `box` and `element_strides` list one
    entry per dimension, outermost first like numpy (the driver's order is reversed).
    mode "im2col" (rank 3..5, channels innermost, e.g. NHWC) takes `pixel_box_lower` /
    `pixel_box_upper` (rank - 2 corner offsets, outermost spatial dimension first),
    `channels_per_pixel` and `pixels_per_column` instead of `box`.

    swizzle: "none", "32B", "64B", "128B"; interleave: "none", "16B", "32B";
    l2_promotion: "none", "64B", "128B", "256B"; oob_fill: "zero" or "nan".

    Encodings are cached by all inputs: building the same map again does not call the
    driver (see `encode_cache_info`)."""

    __slots__ = ("spec", "raw", "buffer")

    def __init__(
        self,
        source: Any,
        box: Any = None,
        *,
        dtype: Any = None,
        shape: Any = None,
        strides: Any = None,
        element_strides: Any = None,
        swizzle: str = "none",
        interleave: str = "none",
        l2_promotion: str = "128B",
        oob_fill: str = "zero",
        mode: str = "tiled",
        pixel_box_lower: Any = None,
        pixel_box_upper: Any = None,
        channels_per_pixel: int | None = None,
        pixels_per_column: int | None = None,
    ):
        address, elem, shape_t, strides_t = _resolve_source(source, dtype, shape, strides)
        rank = len(shape_t)
        spec = TensorMapSpec(
            mode=mode,
            elem=elem,
            address=address,
            shape=shape_t,
            strides=strides_t,
            box=_ints("box", box) if box is not None else (),
            element_strides=(
                _ints("element_strides", element_strides) if element_strides is not None
                else (1,) * rank
            ),
            swizzle=swizzle,
            interleave=interleave,
            l2_promotion=l2_promotion,
            oob_fill=oob_fill,
            pixel_box_lower=_ints("pixel_box_lower", pixel_box_lower or ()),
            pixel_box_upper=_ints("pixel_box_upper", pixel_box_upper or ()),
            channels_per_pixel=_int_or_zero("channels_per_pixel", channels_per_pixel),
            pixels_per_column=_int_or_zero("pixels_per_column", pixels_per_column),
        )
        errors = validate(spec, box_given=box is not None)
        if errors:
            raise LaunchError([Diagnostic(m) for m in errors])
        self.spec = spec
        self.raw: bytes = _encode(spec)
        # The driver wants the map 64-byte aligned; keep an aligned copy for callers that pass
        # its address (kernel launches copy `raw` into their own aligned parameter storage).
        store = np.zeros(128 + 64, np.uint8)
        start = -store.ctypes.data % 64
        self.buffer = store[start : start + 128]
        self.buffer[:] = np.frombuffer(self.raw, np.uint8)

    @property
    def dtype(self) -> T.Scalar:
        """The element type the map was encoded for."""
        return self.spec.elem

    @property
    def rank(self) -> int:
        return self.spec.rank

    @property
    def address(self) -> int:
        """Host address of the 64-byte-aligned 128-byte copy in `buffer`."""
        return self.buffer.ctypes.data

    def __repr__(self) -> str:
        s = self.spec
        tile = f"box={s.box}" if s.mode == "tiled" else (
            f"channels_per_pixel={s.channels_per_pixel}, pixels_per_column={s.pixels_per_column}"
        )
        return (
            f"TensorMap({s.mode}, {s.elem}, shape={s.shape}, {tile}, swizzle={s.swizzle}, "
            f"global=0x{s.address:x})"
        )


def encode_cache_info() -> functools._CacheInfo:
    """Hits and misses of the encoding cache (a hit means the driver was not called)."""
    return _encode.cache_info()


def clear_encode_cache() -> None:
    """Forget cached encodings."""
    _encode.cache_clear()


def _ints(name: str, value: Any) -> tuple[int, ...]:
    seq = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    for v in seq:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise LaunchError(f"{name} must hold ints, got {value!r}")
    return tuple(int(v) for v in seq)


def _int_or_zero(name: str, value: Any) -> int:
    return 0 if value is None else _ints(name, value)[0]


def _resolve_source(
    source: Any, dtype: Any, shape: Any, strides: Any
) -> tuple[int, T.Scalar, tuple[int, ...], tuple[int, ...]]:
    if isinstance(source, np.ndarray):
        raise host_array_error("the tensor map source")
    if isinstance(source, (DevicePointer, int)) and not isinstance(source, bool):
        ptr = DevicePointer(source) if isinstance(source, int) else source
        elem_src = dtype if dtype is not None else ptr.dtype
        if elem_src is None or shape is None:
            raise LaunchError("a tensor map over a raw address needs dtype= and shape=")
        elem = scalar_of(elem_src)
        shape_t = _ints("shape", shape)
        strides_t = (
            _ints("strides", strides) if strides is not None
            else contiguous_strides(shape_t, elem.nbytes)
        )
        if len(strides_t) != len(shape_t):
            raise LaunchError(
                f"strides has {len(strides_t)} entries, expected {len(shape_t)} (one per dim)"
            )
        return ptr.address, elem, shape_t, strides_t
    if shape is not None or strides is not None:
        raise LaunchError(
            "shape= and strides= describe raw addresses; an array brings its own "
            "(pass DevicePointer(address) to describe memory yourself)"
        )
    desc = describe(source, "the tensor map source")
    elem = desc.elem
    if dtype is not None:
        elem = scalar_of(dtype)
        if elem.nbytes != desc.elem.nbytes:
            raise LaunchError(
                f"dtype {elem} ({elem.nbytes} bytes) cannot relabel {desc.elem} elements "
                f"({desc.elem.nbytes} bytes)"
            )
    return desc.ptr, elem, desc.shape, desc.strides


def validate(spec: TensorMapSpec, box_given: bool = True) -> list[str]:
    """Every rule of cuTensorMapEncodeTiled/Im2col that `spec` breaks, as messages."""
    errs: list[str] = []
    rank, elem = spec.rank, spec.elem
    if spec.mode not in ("tiled", "im2col"):
        return [f"mode must be 'tiled' or 'im2col', got {spec.mode!r}"]
    for name, value, allowed in (
        ("swizzle", spec.swizzle, tuple(SWIZZLE_SPAN)),
        ("interleave", spec.interleave, INTERLEAVES),
        ("l2_promotion", spec.l2_promotion, L2_PROMOTIONS),
        ("oob_fill", spec.oob_fill, OOB_FILLS),
    ):
        if value not in allowed:
            errs.append(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
    if elem.name not in _DATA_TYPE:
        errs.append(f"tensor maps cannot hold {elem} elements")
    lo, hi = (1, 5) if spec.mode == "tiled" else (3, 5)
    if not lo <= rank <= hi:
        errs.append(f"tensor rank must be in [{lo}, {hi}] for mode '{spec.mode}', got {rank}")
        return errs
    if spec.interleave != "none" and rank < 3:
        errs.append(f"interleave {spec.interleave} needs a tensor of rank >= 3, got {rank}")
    if errs:
        return errs
    align = 32 if spec.interleave == "32B" else 16
    why = " (interleave 32B)" if align == 32 else ""
    if spec.address % align:
        errs.append(
            f"global address must be {align}-byte aligned{why}, got 0x{spec.address:x}"
        )
    for i, d in enumerate(spec.shape):
        if not 1 <= d <= 2**32:
            errs.append(f"shape[{i}] must be in [1, 4294967296], got {d}")
    inner = rank - 1
    if spec.strides[inner] != elem.nbytes:
        errs.append(
            f"the innermost dimension must be contiguous: stride of dim {inner} must be "
            f"{elem.nbytes} bytes (one {elem}), got {spec.strides[inner]}"
        )
    for i in range(inner):
        s = spec.strides[i]
        if s < 0 or s % align:
            errs.append(f"stride of dim {i} ({s} bytes) must be a multiple of {align}{why}")
        elif s >= 2**40:
            errs.append(f"stride of dim {i} ({s} bytes) must be less than 2**40")
    if len(spec.element_strides) != rank:
        errs.append(
            f"element_strides has {len(spec.element_strides)} entries, expected {rank} "
            "(one per dimension, outermost first)"
        )
    else:
        for i, e in enumerate(spec.element_strides):
            if not 1 <= e <= 8:
                errs.append(f"element_strides[{i}] must be in [1, 8], got {e}")
    if spec.mode == "tiled":
        errs += _validate_tiled(spec, box_given)
    else:
        errs += _validate_im2col(spec, box_given)
    if spec.interleave == "32B" and spec.swizzle != "32B":
        errs.append(f"interleave 32B requires swizzle 32B, got {spec.swizzle}")
    if spec.oob_fill == "nan" and not elem.is_float:
        errs.append(f"oob_fill 'nan' needs a floating-point dtype, got {elem}")
    return errs


def _inner_box_rules(spec: TensorMapSpec, inner_elems: int, what: str) -> list[str]:
    if spec.interleave != "none":
        return []
    errs = []
    nbytes = inner_elems * spec.elem.nbytes
    if nbytes % 16:
        errs.append(
            f"inner box bytes must be a multiple of 16, got {nbytes} "
            f"({what} = {inner_elems} x {spec.elem.nbytes}-byte {spec.elem})"
        )
    span = SWIZZLE_SPAN.get(spec.swizzle, 0)
    if span and nbytes > span:
        errs.append(
            f"inner box dimension is {nbytes} bytes; swizzle {spec.swizzle} allows at most {span}"
        )
    return errs


def _validate_tiled(spec: TensorMapSpec, box_given: bool) -> list[str]:
    rank = spec.rank
    if not box_given:
        return ["box is required in mode 'tiled' (one entry per dimension, outermost first)"]
    if spec.pixel_box_lower or spec.pixel_box_upper or spec.channels_per_pixel or (
        spec.pixels_per_column
    ):
        return ["pixel_box_*, channels_per_pixel and pixels_per_column need mode='im2col'"]
    if len(spec.box) != rank:
        return [
            f"box has {len(spec.box)} entries, expected {rank} "
            "(one per dimension, outermost first)"
        ]
    errs = [
        f"box[{i}] must be in [1, 256], got {b}" for i, b in enumerate(spec.box) if not 1 <= b <= 256
    ]
    if not errs:
        errs += _inner_box_rules(spec, spec.box[-1], f"box[{rank - 1}]")
    return errs


def _validate_im2col(spec: TensorMapSpec, box_given: bool) -> list[str]:
    rank = spec.rank
    if box_given:
        return ["box is not used in mode 'im2col'; give channels_per_pixel and pixels_per_column"]
    errs = []
    lo, hi = _CORNER_RANGE[rank]
    for name, corner in (("pixel_box_lower", spec.pixel_box_lower),
                         ("pixel_box_upper", spec.pixel_box_upper)):  # fmt: skip
        if len(corner) != rank - 2:
            errs.append(
                f"{name} has {len(corner)} entries, expected {rank - 2} (rank - 2, "
                "outermost spatial dimension first)"
            )
            continue
        errs += [
            f"{name}[{i}] must be in [{lo}, {hi}] for a rank-{rank} tensor, got {c}"
            for i, c in enumerate(corner)
            if not lo <= c <= hi
        ]
    if not errs:
        for i, (a, b) in enumerate(zip(spec.pixel_box_lower, spec.pixel_box_upper, strict=True)):
            extent = spec.shape[1 + i] + b - a
            if extent < 1:
                errs.append(
                    f"the im2col bounding box is empty along dim {1 + i}: shape "
                    f"{spec.shape[1 + i]} + upper {b} - lower {a} = {extent}"
                )
    if not 1 <= spec.channels_per_pixel <= 256:
        errs.append(f"channels_per_pixel must be in [1, 256], got {spec.channels_per_pixel}")
    else:
        errs += _inner_box_rules(spec, spec.channels_per_pixel, "channels_per_pixel")
    if not 1 <= spec.pixels_per_column <= 1024:
        errs.append(f"pixels_per_column must be in [1, 1024], got {spec.pixels_per_column}")
    return errs


@functools.lru_cache(maxsize=4096)
def _encode(spec: TensorMapSpec) -> bytes:
    return _driver_encode(spec)


def _driver_encode(spec: TensorMapSpec) -> bytes:
    drv = driver()
    ensure_current()
    u64, u32 = drv.cuuint64_t, drv.cuuint32_t
    dtype = getattr(drv.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{_DATA_TYPE[spec.elem.name]}")
    interleave = getattr(
        drv.CUtensorMapInterleave, f"CU_TENSOR_MAP_INTERLEAVE_{spec.interleave.upper()}"
    )
    swizzle = getattr(drv.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{spec.swizzle.upper()}")
    l2 = drv.CUtensorMapL2promotion
    l2 = l2.CU_TENSOR_MAP_L2_PROMOTION_NONE if spec.l2_promotion == "none" else getattr(
        l2, f"CU_TENSOR_MAP_L2_PROMOTION_L2_{spec.l2_promotion}"
    )
    fill = drv.CUtensorMapFloatOOBfill
    oob = (
        fill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE if spec.oob_fill == "zero"
        else fill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA
    )
    # The driver lists dimensions innermost first, and dim 0's stride is implicit.
    dims = [u64(d) for d in reversed(spec.shape)]
    strides = [u64(s) for s in reversed(spec.strides[:-1])]
    estrides = [u32(e) for e in reversed(spec.element_strides)]
    if spec.mode == "tiled":
        box = [u32(b) for b in reversed(spec.box)]
        tmap = check(
            drv.cuTensorMapEncodeTiled(
                dtype, spec.rank, spec.address, dims, strides, box, estrides,
                interleave, swizzle, l2, oob,
            ),
            "cuTensorMapEncodeTiled",
        )
    else:
        tmap = check(
            drv.cuTensorMapEncodeIm2col(
                dtype, spec.rank, spec.address, dims, strides,
                list(reversed(spec.pixel_box_lower)), list(reversed(spec.pixel_box_upper)),
                spec.channels_per_pixel, spec.pixels_per_column, estrides,
                interleave, swizzle, l2, oob,
            ),
            "cuTensorMapEncodeIm2col",
        )
    return bytes((ctypes.c_char * 128).from_address(tmap.getPtr()))
