"""Scalar semantics of the PTX that each IR node lowers to (see codegen/ptx.py).

Integers wrap at the type width, `div`/`rem` truncate toward zero, shifts clamp at the
width; casts follow `cvt` (float -> int truncates toward zero, saturates, NaN -> 0; narrowing
float casts round to nearest even, to fp8 saturating; int -> f16/bf16/fp8 and f64 -> fp8 go
through f32 as the emitter does);
float results are rounded to their type after every operation. Approximate intrinsics
(`ex2.approx`, `rsqrt.approx`, ...) are computed exactly and rounded; ex2 is the `.ftz` form:
results below 2^-126 flush to zero.

Register values: integers are Python ints normalised to the type's range (`b` types are
unsigned), floats are Python floats holding a value exactly representable in the type (bf16
included), preds are bools, vectors are tuples, pointers are u64 ints.
"""

from __future__ import annotations

import functools
import math
import operator
import struct
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from .. import fp8
from .. import types as T

INF = math.inf
NAN = math.nan

# significand bits (with the implicit one), smallest and largest normal exponent
_FLOAT_FORMAT = {"f16": (11, -14, 15), "bf16": (8, -126, 127), "f32": (24, -126, 127),
                 "f64": (53, -1022, 1023)}  # fmt: skip

_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")
_F64 = struct.Struct("<d")
_U64 = struct.Struct("<Q")
_MAGNITUDE = (1 << 63) - 1  # all bits of a binary64 but the sign


def int_range(t: T.Scalar) -> tuple[int, int]:
    """The values a register of integer type `t` holds (`b` types as unsigned)."""
    if t.is_signed:
        return -(1 << (t.nbits - 1)), (1 << (t.nbits - 1)) - 1
    return 0, (1 << t.nbits) - 1


def wrapper(t: T.Scalar) -> Callable[[int], int]:
    mask = (1 << t.nbits) - 1
    if t.is_signed:
        half = 1 << (t.nbits - 1)
        return lambda v: ((v + half) & mask) - half
    return lambda v: v & mask


def _round_f32(x: float) -> float:
    # struct packs with the C cast, which rounds to nearest even, subnormals included.
    try:
        return _F32.unpack(_F32.pack(x))[0]
    except OverflowError:
        return math.copysign(INF, x)


def _binary_rounder(p: int, emin: int, emax: int) -> Callable[[float], float]:
    top = math.ldexp(2.0 - math.ldexp(1.0, 1 - p), emax)

    def rnd(x: float) -> float:
        if x == 0.0 or not math.isfinite(x):
            return x
        ulp = max(math.frexp(x)[1] - 1, emin) - (p - 1)
        r = math.ldexp(round(math.ldexp(x, -ulp)), ulp)  # round() is half-to-even
        return math.copysign(INF if abs(r) > top else r, x)

    # Normal results of the format: round the binary64 significand's bits to p, half to
    # even, on the bit pattern (a carry moves into the exponent as it should); the same
    # values as `rnd`, which remains for zeros, infinities, NaN and subnormal results.
    drop = 53 - p
    low = (1 << drop) - 1
    half = 1 << (drop - 1)
    smallest, beyond = (emin + 1023) << 52, (emax + 1024) << 52  # 2**emin, 2**(emax + 1)
    top_bits = _U64.unpack(_F64.pack(top))[0]

    def rnd_bits(x: float) -> float:
        b = _U64.unpack(_F64.pack(x))[0]
        if not smallest <= b & _MAGNITUDE < beyond:
            return rnd(x)
        b = (b + half - 1 + ((b >> drop) & 1)) & ~low
        if b & _MAGNITUDE > top_bits:
            return math.copysign(INF, x)
        return _F64.unpack(_U64.pack(b))[0]

    return rnd_bits


def rounder(t: T.Scalar) -> Callable[[float], float]:
    """Round a Python float to the nearest value of float type `t` (ties to even)."""
    if t == T.f64:
        return float
    if t == T.f32:
        return _round_f32
    if t.is_fp8:  # cvt.rn.satfinite through f32: saturates instead of overflowing
        return lambda x: fp8.convert(x, t)
    return _binary_rounder(*_FLOAT_FORMAT[t.name])


def fma_f32(a: float, b: float, c: float) -> float:
    """fma.rn.f32 of f32 values, rounded once: the product of two 24-bit significands is exact
    in f64, the sum is rounded to odd in f64 (TwoSum gives what the f64 sum lost; an inexact
    sum with an even last bit steps one ulp towards it), and a round-to-odd result 29 bits
    wider than f32 rounds to f32 as the exact value would."""
    p = a * b
    r = p + c
    if not math.isfinite(r):
        if math.isfinite(a) and math.isfinite(b) and math.isfinite(c):
            return round_exact(Fraction(a) * Fraction(b) + Fraction(c), T.f32)
        return _round_f32(r)
    z = r - p
    lost = (p - (r - z)) + (c - z)
    if lost and not _U64.unpack(_F64.pack(r))[0] & 1:
        r = math.nextafter(r, INF if lost > 0 else -INF)
    return _round_f32(r)


def round_exact(x: Fraction, t: T.Scalar) -> float:
    """An exact rational rounded once to float type `t` (no double rounding)."""
    if x == 0:
        return 0.0
    p, emin, emax = _FLOAT_FORMAT[t.name]
    a = abs(x)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if a < Fraction(2) ** e:
        e -= 1
    if e > emax:
        return math.copysign(INF, x)
    ulp = max(e, emin) - (p - 1)
    r = round(a / Fraction(2) ** ulp)  # Fraction rounds half to even
    if r >= 1 << p and max(e, emin) + 1 > emax:
        return math.copysign(INF, x)
    return math.copysign(math.ldexp(r, ulp), x)


def normaliser(t: T.Type) -> Callable[[Any], Any]:
    """Bring a Python value into the register representation of `t`."""
    if isinstance(t, T.Vector):
        f = normaliser(t.elem)
        return lambda v: tuple(f(x) for x in v)
    if isinstance(t, T.Ptr):
        return wrapper(T.u64)
    assert isinstance(t, T.Scalar), t
    if t.is_pred:
        return bool
    if t.is_float:
        r = rounder(t)
        return lambda v: r(float(v))
    return wrapper(t)


def zero(t: T.Type) -> Any:
    """The value of a declared but unassigned register (real registers hold garbage)."""
    if isinstance(t, T.Vector):
        return (zero(t.elem),) * t.n
    if isinstance(t, T.Scalar) and t.is_float:
        return 0.0
    if isinstance(t, T.Scalar) and t.is_pred:
        return False
    return 0


# ----------------------------------------------------------------------------- operators


def binary(op: str, t: T.Scalar) -> Callable[[Any, Any], Any]:
    """`op` on two values of type `t`; integer div/rem by zero raise ZeroDivisionError."""
    if t.is_pred:
        return {"and": lambda a, b: a and b, "or": lambda a, b: a or b,
                "xor": operator.ne}[op]  # fmt: skip
    if t.is_float:
        return _float_binary(op, t)
    return _int_binary(op, t)


def _int_binary(op: str, t: T.Scalar) -> Callable[[int, int], int]:
    w, n = wrapper(t), t.nbits
    if op == "div":
        if not t.is_signed:
            return operator.floordiv

        def div(a: int, b: int) -> int:
            q = abs(a) // abs(b)
            return w(q if (a < 0) == (b < 0) else -q)

        return div
    if op == "rem":
        if not t.is_signed:
            return operator.mod
        return lambda a, b: -(abs(a) % abs(b)) if a < 0 else abs(a) % abs(b)
    if op == "shl":
        return lambda a, b: w(a << b) if b < n else 0
    if op == "shr":
        if t.is_signed:  # Python's >> on negative ints is arithmetic
            return lambda a, b: a >> min(b, n - 1)
        return lambda a, b: a >> b if b < n else 0
    if op in ("min", "max"):
        return min if op == "min" else max
    f = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "and": operator.and_,
         "or": operator.or_, "xor": operator.xor}[op]  # fmt: skip
    return lambda a, b: w(f(a, b))


def _float_binary(op: str, t: T.Scalar) -> Callable[[float, float], float]:
    # Exact results rounded once: binary64 carries more than 2p+2 bits for every narrower
    # format, so computing +, -, *, / in double and rounding to t is correctly rounded.
    r = rounder(t)
    if op == "div":

        def div(a: float, b: float) -> float:
            if b == 0.0:
                if a != a or a == 0.0:
                    return NAN
                return math.copysign(INF, a) * math.copysign(1.0, b)
            return r(a / b)

        return div
    if op == "min":
        return _fmin
    if op == "max":
        return _fmax
    f = {"add": operator.add, "sub": operator.sub, "mul": operator.mul}[op]
    return lambda a, b: r(f(a, b))


def _fmin(a: float, b: float) -> float:
    # PTX min/max: a NaN operand yields the other one; -0.0 orders below +0.0.
    if a != a:
        return b
    if b != b or a < b:
        return a
    if a == b:
        return a if math.copysign(1.0, a) < 0 else b
    return b


def _fmax(a: float, b: float) -> float:
    if a != a:
        return b
    if b != b or a > b:
        return a
    if a == b:
        return b if math.copysign(1.0, a) < 0 else a
    return b


_COMPARE = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
            "gt": operator.gt, "ge": operator.ge}  # fmt: skip


def compare(op: str, t: T.Scalar) -> Callable[[Any, Any], bool]:
    """`setp.op.t`: ordered comparisons, so every float comparison with NaN is false."""
    if t.is_float and op == "ne":
        return lambda a, b: a != b and a == a and b == b
    return _COMPARE[op]


def unary(op: str, t: T.Scalar) -> Callable[[Any], Any]:
    if op == "neg":
        if t.is_float:
            return operator.neg
        w = wrapper(t)
        return lambda a: w(-a)
    if t.is_pred:
        return operator.not_
    w = wrapper(t)
    return lambda a: w(~a)


def cast(src: T.Scalar, dst: T.Scalar) -> Callable[[Any], Any]:
    """`cvt` from `src` to `dst` as the emitter writes it."""
    if src.is_pred:
        one, nil = (1.0, 0.0) if dst.is_float else (1, 0)
        return lambda v: one if v else nil
    if src.is_int and dst.is_int:
        return wrapper(dst)  # sign- or zero-extension follows the source's Python value
    if src.is_float and dst.is_float:
        if dst.nbytes == 2 and src.nbytes == 2:  # f16 <-> bf16 through f32, exact widening
            return rounder(dst)
        return float if dst.nbytes > src.nbytes else rounder(dst)
    if src.is_float:
        lo, hi = int_range(dst)

        def to_int(v: float) -> int:
            if v != v:
                return 0
            if v >= hi:
                return hi
            if v <= lo:
                return lo
            return int(v)

        return to_int
    if dst == T.f64:
        return float
    if dst == T.f32:
        return lambda v: _round_f32(float(v)) if abs(v) < 1 << 53 else round_exact(
            Fraction(v), T.f32)
    r32, r16 = cast(src, T.f32), rounder(dst)  # cvt.rn.f32 then cvt.rn.f16 / .bf16
    return lambda v: r16(r32(v))


# ----------------------------------------------------------------------------- intrinsics


def _safe(f: Callable[[float], float], on_error: float) -> Callable[[float], float]:
    def g(x: float) -> float:
        try:
            return f(x)
        except (ValueError, OverflowError):
            return on_error
    return g


_F32_MIN_NORMAL = 2.0**-126


def _ex2(x: float) -> float:
    """`ex2.approx.ftz.f32`: 2^x, a subnormal result flushed to zero."""
    try:
        r = 2.0**x
    except OverflowError:
        return INF
    return 0.0 if r < _F32_MIN_NORMAL else r


def _lg2(x: float) -> float:
    if x == 0.0:
        return -INF
    return math.log2(x) if x > 0.0 or x != x else NAN


def _rsqrt(x: float) -> float:
    if x == 0.0:
        return math.copysign(INF, x)
    if x != x or x < 0.0:
        return NAN
    return 0.0 if x == INF else 1.0 / math.sqrt(x)


def _rcp(x: float) -> float:
    return math.copysign(INF, x) if x == 0.0 else 1.0 / x


_FLOAT_FN: dict[str, Callable[[float], float]] = {
    "ex2": _ex2, "lg2": _lg2, "rsqrt": _rsqrt, "rcp": _rcp, "tanh": math.tanh,
    "sqrt": _safe(math.sqrt, NAN), "sin": _safe(math.sin, NAN), "cos": _safe(math.cos, NAN),
}  # fmt: skip


def intrinsic(fn: str, t: T.Scalar) -> Callable[..., Any]:
    """A value intrinsic other than the warp collectives: ex2 ... tanh, abs, fma."""
    if fn == "abs":
        if t.is_float:
            return abs
        w = wrapper(t)
        return lambda a: w(abs(a))
    if fn == "fma":
        if t == T.f32:
            return fma_f32

        def fma(a: float, b: float, c: float) -> float:
            if math.isfinite(a) and math.isfinite(b) and math.isfinite(c):
                return round_exact(Fraction(a) * Fraction(b) + Fraction(c), t)
            return rounder(t)(a * b + c)

        return fma
    f, r = _FLOAT_FN[fn], rounder(t)
    return lambda a: r(f(a))


# ----------------------------------------------------------------------------- memory codecs

_FMT = {"u8": "B", "s8": "b", "u16": "H", "s16": "h", "u32": "I", "s32": "i", "u64": "Q",
        "s64": "q", "b16": "H", "b32": "I", "b64": "Q", "f16": "e", "bf16": "H", "f32": "f",
        "f64": "d", "e4m3": "B", "e5m2": "B"}  # fmt: skip


def bf16_from_bits(bits: int) -> float:
    return _F32.unpack(_U32.pack(bits << 16))[0]


@functools.cache
def _bf16_values() -> list[float]:
    """`bf16_from_bits` of every bit pattern, in order (unpacked by the same routine)."""
    return list(struct.unpack("<65536f", struct.pack("<65536I", *range(0, 1 << 32, 1 << 16))))


def bf16_to_bits(v: float) -> int:
    if v != v:
        return 0x7FC0
    return _U32.unpack(_F32.pack(v))[0] >> 16  # v is exactly a bf16 value


Reader = Callable[[Any, int], Any]
Writer = Callable[[Any, int, Any], None]


def codec(t: T.Type) -> tuple[Reader, Writer]:
    """Little-endian load and store of a scalar or vector value at a byte offset of a buffer
    (vector forms move the same bytes as consecutive scalars)."""
    elem, n = (t.elem, t.n) if isinstance(t, T.Vector) else (t, 1)
    assert isinstance(elem, T.Scalar) and not elem.is_pred, t
    s = struct.Struct(f"<{n}{_FMT[elem.name]}")
    bf = elem == T.bf16
    if elem.is_fp8:
        return _fp8_codec(s, elem, n)
    if bf:  # loads look their values up
        values = _bf16_values()
    if n == 1:
        if bf:
            return (lambda buf, off: values[s.unpack_from(buf, off)[0]],
                    lambda buf, off, v: s.pack_into(buf, off, bf16_to_bits(v)))
        return (lambda buf, off: s.unpack_from(buf, off)[0],
                lambda buf, off, v: s.pack_into(buf, off, v))
    if bf:
        return (lambda buf, off: tuple(map(values.__getitem__, s.unpack_from(buf, off))),
                lambda buf, off, v: s.pack_into(buf, off, *map(bf16_to_bits, v)))
    return (lambda buf, off: s.unpack_from(buf, off),
            lambda buf, off, v: s.pack_into(buf, off, *v))


def _fp8_codec(s: struct.Struct, elem: T.Scalar, n: int) -> tuple[Reader, Writer]:
    if n == 1:
        return (lambda buf, off: fp8.from_bits(s.unpack_from(buf, off)[0], elem),
                lambda buf, off, v: s.pack_into(buf, off, fp8.to_bits(v, elem)))
    return (lambda buf, off: tuple(fp8.from_bits(b, elem) for b in s.unpack_from(buf, off)),
            lambda buf, off, v: s.pack_into(buf, off, *(fp8.to_bits(x, elem) for x in v)))
