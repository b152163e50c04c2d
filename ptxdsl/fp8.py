"""The fp8 element types, e4m3 (ml_dtypes' float8_e4m3fn: no infinities, one NaN pattern per
sign) and e5m2 (IEEE-like, with infinities): their ranges and the conversion that PTX's
`cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32` performs, for the compiler (literals, immediates),
the interpreter (registers, memory, wgmma operands) and examples (quantised inputs).

PTX converts to fp8 only from f32 and f16x2 and with `.satfinite`: NaN stays NaN, anything
beyond the largest finite value (infinities included) becomes that value with its sign, the
rest rounds to nearest even. Other sources go through f32 first (so an f64 or an integer is
rounded twice, as the emitted code does). fp8 widens exactly to f16, hence to every float.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np

from . import types as T

# largest finite magnitude, and the least magnitude that a literal may not have: the largest
# value plus half an ulp of it (what would round beyond the largest value)
MAX = {"e4m3": 448.0, "e5m2": 57344.0}
LITERAL_LIMIT = {"e4m3": 464.0, "e5m2": 61440.0}


def dtype(t: T.Scalar) -> np.dtype:
    """ml_dtypes' numpy dtype of fp8 type `t`."""
    return T.numpy_dtype(t)


def literal_fits(value: float, t: T.Scalar) -> bool:
    """Whether a literal converts to `t` without leaving its range (NaN converts to NaN;
    e5m2 holds infinities, e4m3 none)."""
    if math.isnan(value):
        return True
    if math.isinf(value):
        return t.name == "e5m2"
    return abs(value) < LITERAL_LIMIT[t.name]


def quantize(values, t: T.Scalar) -> np.ndarray:
    """`values` converted to fp8 type `t` as the GPU converts them: through f32, saturating to
    the finite range, NaN kept (an ml_dtypes array of `t`)."""
    x = np.asarray(values, np.float32)
    m = np.float32(MAX[t.name])
    with np.errstate(invalid="ignore"):
        x = np.where(np.isnan(x), x, np.clip(x, -m, m))
    return x.astype(dtype(t))


def convert(value: float, t: T.Scalar) -> float:
    """One value converted to `t` (`cvt.rn.satfinite` through f32), as a Python float."""
    return float(quantize(value, t))


@cache
def _decode(t: T.Scalar) -> tuple[float, ...]:
    return tuple(np.arange(256, dtype=np.uint8).view(dtype(t)).astype(np.float64).tolist())


def from_bits(bits: int, t: T.Scalar) -> float:
    """The value of the byte `bits` of fp8 type `t`."""
    return _decode(t)[bits & 0xFF]


def to_bits(value: float, t: T.Scalar) -> int:
    """The byte of a value of `t` (a value `t` holds, or one `convert` makes so)."""
    return int(quantize(value, t).view(np.uint8))


def conversion_unsupported(src: T.Scalar, dst: T.Scalar, target: str) -> str:
    """What a conversion to or from fp8 on a target without fp8 `cvt` (before sm_89) is
    told: by `check` (the verifier) and by codegen alike."""
    return (f"converting {src} to {dst} needs sm_89 or later (cvt of fp8 pairs); the module "
            f"is compiled for {target}")
