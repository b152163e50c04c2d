"""Tensor maps for the interpreter: a numpy tensor, a box, a swizzle mode and an OOB fill.

A TMA load copies the box at the given coordinates (innermost first, as in PTX) into shared
memory in row-major order with the innermost dimension contiguous; elements outside the
tensor are filled with zero (or NaN). Swizzling permutes 16-byte chunks by the absolute
shared-memory address: 128B XORs address bits [4:6] with bits [7:9], 64B bits [4:5] with
[7:8], 32B bit 4 with bit 7. The permutation is its own inverse, so stores undo it by reading
through the same index.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import ir
from .. import types as T
from ..errors import Diagnostic, LaunchError
from ..opdef import effect
from ..runtime.dtypes import scalar_of
from ..runtime.tensormap import TensorMapSpec, validate
from ..swizzle import mask, tma_swizzle_bytes
from .gwrites import Dest, window_dest


@dataclass(frozen=True, eq=False)
class TensorMapModel:
    """A tiled tensor map for `interp.run`, standing in for a CUtensorMap.

    `array` is the global tensor (C-contiguous numpy array; bf16 as uint16 bits with
    `dtype="bf16"`); `box` is the tile shape, outermost first like numpy shapes (the IR's
    coordinates are innermost first, as in PTX); `swizzle` is "none", "32B", "64B" or "128B";
    `oob_fill` is "zero" or "nan". The encoder's rules (box sizes, inner box bytes, strides)
    are checked as the driver would."""

    array: np.ndarray
    box: tuple[int, ...]
    swizzle: str = "none"
    oob_fill: str = "zero"
    dtype: object = None

    def __post_init__(self) -> None:
        a = self.array
        if not isinstance(a, np.ndarray) or not a.flags.c_contiguous:
            raise LaunchError("TensorMapModel needs a C-contiguous numpy array, got "
                              f"{type(a).__name__}")
        object.__setattr__(self, "box", tuple(int(b) for b in self.box))
        elem = scalar_of(self.dtype if self.dtype is not None else a.dtype)
        if elem.nbytes != a.itemsize:
            raise LaunchError(f"dtype {elem} ({elem.nbytes} bytes) cannot relabel "
                              f"{a.dtype} elements ({a.itemsize} bytes)")
        spec = TensorMapSpec(mode="tiled", elem=elem, address=0, shape=a.shape,
                             strides=a.strides, box=self.box, element_strides=(1,) * a.ndim,
                             swizzle=self.swizzle, interleave="none", l2_promotion="none",
                             oob_fill=self.oob_fill)
        errors = validate(spec)
        if errors:
            raise LaunchError([Diagnostic(m) for m in errors])
        object.__setattr__(self, "_elem", elem)

    @property
    def elem(self) -> T.Scalar:
        """The element type the map holds."""
        return self._elem  # type: ignore[attr-defined]

    @property
    def nbytes(self) -> int:
        """Bytes of one box: what a TMA load completes on its mbarrier."""
        n = self.array.itemsize
        for b in self.box:
            n *= b
        return n

    def _windows(self, coords: list[int]) -> tuple[tuple[slice, ...], tuple[slice, ...]] | None:
        """(tensor slices, box slices) of the in-bounds part of the box at `coords`
        (innermost first), or None when the box lies wholly outside."""
        src, dst = [], []
        for c, b, n in zip(reversed(coords), self.box, self.array.shape, strict=True):
            lo, hi = max(c, 0), min(c + b, n)
            if lo >= hi:
                return None
            src.append(slice(lo, hi))
            dst.append(slice(lo - c, hi - c))
        return tuple(src), tuple(dst)

    def read_box(self, coords: list[int]) -> np.ndarray:
        """The box at `coords` as bytes, out-of-bounds elements filled."""
        fill: float = 0
        if self.oob_fill == "nan":  # bf16 held as uint16 bits gets the quiet-NaN pattern
            fill = 0x7FC0 if self.array.dtype.kind == "u" else np.nan
        box = np.full(self.box, fill, self.array.dtype)
        win = self._windows(coords)
        if win is not None:
            box[win[1]] = self.array[win[0]]
        return box.reshape(-1).view(np.uint8)

    def write_box(self, coords: list[int], data: np.ndarray) -> None:
        """Store a box of bytes at `coords`; elements outside the tensor are dropped."""
        win = self._windows(coords)
        if win is not None:
            box = data.view(self.array.dtype).reshape(self.box)
            self.array[win[0]] = box[win[1]]

    def dest(self, coords: list[int], name: str) -> Dest | None:
        """The bytes of the tensor that a store of the box at `coords` writes (None: it lies
        wholly outside), for `gwrites.py`; `name` is the map's."""
        win = self._windows(coords)
        return None if win is None else window_dest(self.array, win[0], name)

    def smem_index(self, addr: int) -> np.ndarray | None:
        """The shared-memory addresses of the box's bytes, in box order, for a box placed at
        `addr`; None when they are simply consecutive (no swizzle)."""
        if self.swizzle == "none":
            return None
        a = np.arange(addr, addr + self.nbytes, dtype=np.int64)
        return a ^ (((a >> 7) & mask(tma_swizzle_bytes(self.swizzle))) << 4)


def short_boxes(kernel: ir.Kernel, name: str, model: TensorMapModel) -> list[Any]:
    """The tensor loads of map `name` whose expect_tx the compiler derives (in a pipeline
    stage or an `async` block) and whose destination's bytes, which it counts, differ from
    the bytes of `model`'s box: each would leave its barrier waiting for bytes that never
    land (a larger box is refused when it is copied)."""
    def derived(s: Any) -> bool:
        return (effect(s).tma and isinstance(getattr(s, "dst", None), ir.Expr)
                and isinstance(getattr(s, "tmap", None), ir.Var) and s.tmap.name == name
                and isinstance(getattr(s, "bar", None), (ir.StageBarrier, ir.AsyncBarrier))
                and isinstance(s.dst.type, T.SharedRef) and s.dst.type.nbytes != model.nbytes)

    return [s for s in ir.walk(kernel.body) if derived(s)]


def short_box_message(name: str, model: TensorMapModel, s: Any) -> str:
    """What is wrong with a load of `short_boxes`, for the map called `name`."""
    dst: T.SharedRef = s.dst.type
    return (f"{name} has box {model.box}, {model.nbytes} bytes, but a {s.syntax} of it fills "
            f"a buffer of {dst.nbytes} bytes ({dst}); the expect_tx the compiler derives counts "
            "the buffer's bytes, so the stage would never complete: expected box "
            f"{dst.shape} or another of {dst.nbytes} bytes")
