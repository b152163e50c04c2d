"""The encoder rules of cuTensorMapEncodeTiled / cuTensorMapEncodeIm2col, in pure Python.

`validate` lists every rule a `TensorMapSpec` breaks, with messages that say what was
expected and what was given, using numpy-order (outermost-first) indices. It needs no GPU,
so the runtime checks maps before the driver sees them and the interpreter checks its
stand-in maps by the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import types as T

SWIZZLE_SPAN = {"none": 0, "32B": 32, "64B": 64, "128B": 128}
INTERLEAVES = ("none", "16B", "32B")
L2_PROMOTIONS = ("none", "64B", "128B", "256B")
OOB_FILLS = ("zero", "nan")

# The CU_TENSOR_MAP_DATA_TYPE_* each ptxdsl element type is encoded as.
TMA_DATA_TYPE = {
    "u8": "UINT8", "s8": "UINT8", "u16": "UINT16", "s16": "UINT16", "b16": "UINT16",
    "u32": "UINT32", "b32": "UINT32", "s32": "INT32", "u64": "UINT64", "b64": "UINT64",
    "s64": "INT64", "f16": "FLOAT16", "bf16": "BFLOAT16", "f32": "FLOAT32", "f64": "FLOAT64",
    "e4m3": "UINT8", "e5m2": "UINT8",
}  # fmt: skip
# s8/s16 and the fp8 types have no TMA type of their own; copies move bytes, so the unsigned
# type of the same width moves them unchanged.

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
    if elem.name not in TMA_DATA_TYPE:
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
        errs.append(f"global address must be {align}-byte aligned{why}, got 0x{spec.address:x}")
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
    if (
        spec.pixel_box_lower
        or spec.pixel_box_upper
        or spec.channels_per_pixel
        or (spec.pixels_per_column)
    ):
        return ["pixel_box_*, channels_per_pixel and pixels_per_column need mode='im2col'"]
    if len(spec.box) != rank:
        return [
            f"box has {len(spec.box)} entries, expected {rank} (one per dimension, outermost first)"
        ]
    errs = [
        f"box[{i}] must be in [1, 256], got {b}"
        for i, b in enumerate(spec.box)
        if not 1 <= b <= 256
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
