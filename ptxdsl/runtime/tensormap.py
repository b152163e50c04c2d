"""`TensorMap`: a CUtensorMap (TMA descriptor) checked against every encoder rule first.

Shapes, strides, boxes, element strides and im2col corners are given in numpy order
(row-major: outermost dimension first, strides in bytes); the driver wants innermost first,
so they are reversed only when encoding. Validation is pure Python, so every rejection can
be tested without a GPU, and its messages use the same numpy-order indices the caller used.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
from typing import Any

import numpy as np

from .. import types as T
from ..codegen.abi import TMAP_ALIGN, TMAP_BYTES
from ..errors import Diagnostic, LaunchError
from .driver import any_current, check, driver
from .dtypes import scalar_of
from .interop import DevicePointer, contiguous_strides, describe, host_array_error, layout_key
from .tensormap_rules import TMA_DATA_TYPE, TensorMapSpec, validate


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

    Maps are cached by their inputs: building the same map again (same source address,
    shape, strides, dtype, box and options) returns the map built before, without checking
    or encoding again, so `k[grid](TensorMap(x, box), ...)` per call is cheap; different
    inputs that describe the same memory share one driver encoding (see `encode_cache_info`).

    `device`: the GPU whose kernels will use the map. When given, the memory is checked to
    be reachable from it (its own, VMM memory mapped for it, or a peer's with peer access
    enabled) and PeerAccessError names the fix otherwise; see peer.check_reachable."""

    __slots__ = ("spec", "raw", "sig", "device", "_buffer", "_key", "_moved")
    _key: Any  # the cache key while building, then _BUILT

    def __new__(cls, source: Any, box: Any = None, **options: Any) -> TensorMap:
        key = _map_key(source, box, options)
        if key is not None:
            try:
                hit = _maps.get(key)
            except TypeError:  # an unhashable option: build without caching
                hit = key = None
            if hit is not None and type(hit) is cls:
                _stats[0] += 1
                return hit
        self = object.__new__(cls)
        self._key = key
        return self

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
        device: Any = None,
    ):
        if self._key is _BUILT:  # a cached map returned by __new__
            return
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
                _ints("element_strides", element_strides)
                if element_strides is not None
                else (1,) * rank
            ),
            swizzle=swizzle,
            interleave=interleave,
            l2_promotion=l2_promotion,
            oob_fill=oob_fill,
            pixel_box_lower=_ints(
                "pixel_box_lower", () if pixel_box_lower is None else pixel_box_lower
            ),
            pixel_box_upper=_ints(
                "pixel_box_upper", () if pixel_box_upper is None else pixel_box_upper
            ),
            channels_per_pixel=_int_or_zero("channels_per_pixel", channels_per_pixel),
            pixels_per_column=_int_or_zero("pixels_per_column", pixels_per_column),
        )
        errors = validate(spec, box_given=box is not None)
        if errors:
            raise LaunchError([Diagnostic(m) for m in errors])
        self.spec = spec
        self.device = device
        if device is not None:
            from .peer import check_reachable

            check_reachable(address, device, "the tensor map's memory")
        self.raw: bytes = _encode(spec)
        self.sig = (elem.name, rank, swizzle)  # what a kernel's tmap parameter checks at once
        self._buffer: np.ndarray | None = None
        self._moved: dict[int, TensorMap] | None = None
        key, self._key = self._key, _BUILT
        if key is not None:
            if len(_maps) >= _CACHE_SIZE:
                _maps.clear()
            _maps[key] = self

    def at(self, address: int) -> TensorMap:
        """This map over memory of the same layout at `address` (a torch op's next output,
        or its next input of the same shape and strides): the driver re-points a copy
        (`cuTensorMapReplaceAddress`) instead of encoding again, and each address's copy is
        kept, so a caller cycling through a few buffers pays a dictionary lookup.

        Raises LaunchError for an address the map's rules refuse (alignment)."""
        moved = self._moved
        if moved is None:
            moved = self._moved = {}
        hit = moved.get(address)
        if hit is not None:
            return hit
        spec = dataclasses.replace(self.spec, address=address)
        errors = validate(spec, box_given=spec.mode == "tiled")
        if errors:
            raise LaunchError([Diagnostic(m) for m in errors])
        other = object.__new__(TensorMap)
        other.spec, other.sig, other.device = spec, self.sig, self.device
        other.raw = _repoint(self.raw, address)
        other._buffer, other._moved, other._key = None, None, _BUILT
        if len(moved) >= _MOVED_PER_MAP:
            moved.clear()
        moved[address] = other
        return other

    @property
    def dtype(self) -> T.Scalar:
        """The element type the map was encoded for."""
        return self.spec.elem

    @property
    def rank(self) -> int:
        return self.spec.rank

    @property
    def buffer(self) -> np.ndarray:
        """The 128 bytes in a 64-byte-aligned array, as the driver wants a map in host memory
        (kernel launches copy `raw` into their own aligned parameter storage instead)."""
        if self._buffer is None:
            store = np.zeros(TMAP_BYTES + TMAP_ALIGN, np.uint8)
            start = -store.ctypes.data % TMAP_ALIGN
            self._buffer = store[start : start + TMAP_BYTES]
            self._buffer[:] = np.frombuffer(self.raw, np.uint8)
        return self._buffer

    @property
    def address(self) -> int:
        """Host address of the 64-byte-aligned 128-byte copy in `buffer`."""
        return self.buffer.ctypes.data

    def __repr__(self) -> str:
        s = self.spec
        if s.mode == "tiled":
            tile = f"box={s.box}"
        else:
            tile = f"channels_per_pixel={s.channels_per_pixel}, "
            tile += f"pixels_per_column={s.pixels_per_column}"
        return (
            f"TensorMap({s.mode}, {s.elem}, shape={s.shape}, {tile}, swizzle={s.swizzle}, "
            f"global=0x{s.address:x})"
        )


_CACHE_SIZE = 4096
_MOVED_PER_MAP = 64  # re-pointed copies kept per map (see TensorMap.at)
_BUILT = object()  # TensorMap._key once the map is built
_maps: dict[tuple, TensorMap] = {}  # (source layout, box, options) -> map
_encodings: dict[TensorMapSpec, bytes] = {}  # spec -> the driver's 128 bytes
_stats = [0, 0]  # hits (either cache), misses (driver called)


def _map_key(source: Any, box: Any, options: dict) -> tuple | None:
    """What a TensorMap is built from, cheap to compute (hashable unless an option is not);
    None for an unknown source type."""
    if type(source) is int:
        src: Any = ("address", source)
    elif type(source) is DevicePointer:
        src = ("address", source.address, source.dtype)
    else:
        src = layout_key(source)
        if src is None:
            return None
    return (src, box if type(box) is not list else tuple(box), *options.items())


def encode_cache_info() -> functools._CacheInfo:
    """Hits and misses of the tensor-map caches (a hit means the driver was not called)."""
    return functools._CacheInfo(_stats[0], _stats[1], _CACHE_SIZE, len(_encodings))


def clear_encode_cache() -> None:
    """Forget cached maps and encodings."""
    _maps.clear()
    _encodings.clear()


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _ints(name: str, value: Any) -> tuple[int, ...]:
    try:
        seq = (value,) if _is_int(value) else tuple(value)
    except TypeError:
        seq = (value,)
    if not all(_is_int(v) for v in seq):
        raise LaunchError(f"{name} must be an int or a sequence of ints, got {value!r}")
    return tuple(int(v) for v in seq)


def _int_or_zero(name: str, value: Any) -> int:
    if value is None:
        return 0
    if not _is_int(value):
        raise LaunchError(f"{name} must be an int, got {value!r}")
    return int(value)


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
            _ints("strides", strides)
            if strides is not None
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


def _encode(spec: TensorMapSpec) -> bytes:
    raw = _encodings.get(spec)
    if raw is not None:
        _stats[0] += 1
        return raw
    raw = _driver_encode(spec)
    _stats[1] += 1
    if len(_encodings) >= _CACHE_SIZE:
        _encodings.clear()
    _encodings[spec] = raw
    return raw


def _repoint(raw: bytes, address: int) -> bytes:
    """The 128 bytes of map `raw` with its global address replaced by the driver."""
    drv = driver()
    tmap = drv.CUtensorMap()
    ctypes.memmove(tmap.getPtr(), raw, TMAP_BYTES)
    check(drv.cuTensorMapReplaceAddress(tmap, address), "cuTensorMapReplaceAddress")
    _stats[1] += 1
    return bytes((ctypes.c_char * TMAP_BYTES).from_address(tmap.getPtr()))


def _driver_encode(spec: TensorMapSpec) -> bytes:
    drv = driver()
    any_current()
    u64, u32 = drv.cuuint64_t, drv.cuuint32_t
    dtype = getattr(
        drv.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{TMA_DATA_TYPE[spec.elem.name]}"
    )
    interleave = getattr(
        drv.CUtensorMapInterleave, f"CU_TENSOR_MAP_INTERLEAVE_{spec.interleave.upper()}"
    )
    swizzle = getattr(drv.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{spec.swizzle.upper()}")
    l2 = drv.CUtensorMapL2promotion
    l2 = (
        l2.CU_TENSOR_MAP_L2_PROMOTION_NONE
        if spec.l2_promotion == "none"
        else getattr(l2, f"CU_TENSOR_MAP_L2_PROMOTION_L2_{spec.l2_promotion}")
    )
    fill = drv.CUtensorMapFloatOOBfill
    oob = (
        fill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE
        if spec.oob_fill == "zero"
        else fill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA
    )
    # The driver lists dimensions innermost first, and dim 0's stride is implicit.
    dims = [u64(d) for d in reversed(spec.shape)]
    strides = [u64(s) for s in reversed(spec.strides[:-1])]
    # A rank-1 map has no strides, but an empty list reaches the driver as NULL, which it
    # rejects (CUDA_ERROR_INVALID_VALUE, seen on the H200 with cuda-bindings 13.3): pass
    # one placeholder that the driver does not read.
    strides = strides or [u64(0)]
    estrides = [u32(e) for e in reversed(spec.element_strides)]
    if spec.mode == "tiled":
        box = [u32(b) for b in reversed(spec.box)]
        tmap = check(
            drv.cuTensorMapEncodeTiled(
                dtype,
                spec.rank,
                spec.address,
                dims,
                strides,
                box,
                estrides,
                interleave,
                swizzle,
                l2,
                oob,
            ),
            "cuTensorMapEncodeTiled",
        )
    else:
        tmap = check(
            drv.cuTensorMapEncodeIm2col(
                dtype,
                spec.rank,
                spec.address,
                dims,
                strides,
                list(reversed(spec.pixel_box_lower)),
                list(reversed(spec.pixel_box_upper)),
                spec.channels_per_pixel,
                spec.pixels_per_column,
                estrides,
                interleave,
                swizzle,
                l2,
                oob,
            ),
            "cuTensorMapEncodeIm2col",
        )
    return bytes((ctypes.c_char * TMAP_BYTES).from_address(tmap.getPtr()))
