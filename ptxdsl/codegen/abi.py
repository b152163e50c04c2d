"""The kernel-parameter ABI: how each parameter crosses from the host to a kernel.

The emitter declares parameters from these facts (`.param .align 64 .b8 p_m[128]`), the
runtime lays out its host parameter buffer and packs arguments from the same ones, and
`KernelInfo` reports their sizes; a change here changes all three together.
"""

from __future__ import annotations

from .. import types as T

TMAP_BYTES = 128  # a CUtensorMap (sm_80: the tensor descriptor in its place), passed by value
TMAP_ALIGN = 64  # the driver's alignment of a map, in host memory and in the parameter space
POINTER_BYTES = 8  # a device address: `.param .u64`
PARAM_BUFFER_ALIGN = TMAP_ALIGN  # the host buffer of all parameters: the largest alignment

# The PTX type a scalar parameter is declared with, where it differs from the scalar's own:
# a predicate crosses as a byte (0 or 1), since `.param .pred` does not exist.
PARAM_TYPE = {"pred": "u8"}

# struct codes of the bit pattern each scalar type is passed as; f16 and bf16 are converted to
# their 16-bit patterns first so that range errors can be reported per argument.
STRUCT_CODE = {
    "u8": "B", "s8": "b", "u16": "H", "s16": "h", "b16": "H", "f16": "H", "bf16": "H",
    "u32": "I", "s32": "i", "b32": "I", "f32": "f", "u64": "Q", "s64": "q", "b64": "Q",
    "f64": "d", "pred": "B", "e4m3": "B", "e5m2": "B",
}  # fmt: skip
POINTER_CODE = "Q"

# sm_80's tensor descriptor (the stand-in for a tensor map, in the same 128-byte parameter),
# little-endian: 0 u64 base address; 8 u32 dims[5] (innermost first); 28 u32 swizzle mask
# (`swizzle.mask`); 32 u64 strides[5] in elements (innermost first)
DESC_BASE, DESC_DIMS, DESC_SWIZZLE, DESC_STRIDES = 0, 8, 28, 32
TMAP_CODE = f"{TMAP_BYTES}s"


def param_bytes(kind: str, dtype: T.Scalar) -> int:
    """The size of a parameter of `kind` ("scalar", "ptr" or "tmap") in the parameter space."""
    return {"scalar": dtype.nbytes, "ptr": POINTER_BYTES, "tmap": TMAP_BYTES}[kind]


def param_align(kind: str, dtype: T.Scalar) -> int:
    """The alignment of a parameter of `kind`: a map's 64 bytes, else its own size."""
    return TMAP_ALIGN if kind == "tmap" else param_bytes(kind, dtype)
