"""Numbers written in a program: the one place that reads literal text (.ptxdsl literals,
`-D NAME=VALUE` values) and bounds compile-time numbers (Python numbers of the API, folded
constants), so that every form is either converted or rejected with a reason.

Integers are decimal without leading zeros (`0`, `32`) or hexadecimal (`0x1F`); `032` is
rejected rather than read as octal (C) or decimal (a surprise either way). Every integer a
program computes at compile time stays inside the 64-bit types' union, [-2**63, 2**64).
Floats are decimal with a fraction or an exponent; one that overflows f64 is rejected, and
a constant meets a float type only if it rounds to a finite value of that type (or is an
infinity or NaN that the type holds: e4m3 has no infinity).
"""

from __future__ import annotations

import math
import re

from . import types as T

INT_MIN = -(1 << 63)  # s64's least value
INT_MAX = (1 << 64) - 1  # u64's largest value
MAX_SHIFT = 64  # a constant shift by more is reported, not computed (1 << 4294967295)

_DECIMAL = re.compile(r"0|[1-9][0-9]*")
_HEX = re.compile(r"0[xX][0-9a-fA-F]+")

# The least magnitude that rounds to infinity in each float type (round to nearest even):
# max + half an ulp of max.
_OVERFLOW = {"f16": 65520.0, "bf16": (2 - 2**-8) * 2.0**127, "f32": (2 - 2**-24) * 2.0**127}


class LiteralError(ValueError):
    """A literal that is not a number of the language; the message says why."""


def int_literal(text: str) -> int:
    """The value of integer literal `text`, or LiteralError."""
    t = text.strip()
    neg = t.startswith("-")
    body = t[1:] if neg else t
    if _HEX.fullmatch(body):
        digits = body[2:].lstrip("0")
        if len(digits) > 16:
            raise LiteralError(f"integer literal {_short(t)} is too large: "
                               f"{_range_text()}")
        value = int(body, 16)
    elif _DECIMAL.fullmatch(body):
        if len(body) > 20:
            raise LiteralError(f"integer literal {_short(t)} is too large: {_range_text()}")
        value = int(body)
    elif re.fullmatch(r"0[0-9]+", body):
        raise LiteralError(f"integer literal {t} has a leading zero; write "
                           f"{'-' if neg else ''}{body.lstrip('0') or '0'} (octal literals "
                           "are not supported; hexadecimal is 0x...)")
    elif re.fullmatch(r"0[bBoO][0-9a-fA-F_]*", body):
        raise LiteralError(f"{_short(t)}: binary and octal literals are not supported; "
                           "write the number in decimal or hexadecimal (0x...)")
    else:
        raise LiteralError(f"{_short(t)} is not an integer (decimal, or hexadecimal 0x...)")
    value = -value if neg else value
    if not INT_MIN <= value <= INT_MAX:
        raise LiteralError(f"integer literal {_short(t)} is too large: {_range_text()}")
    return value


def float_literal(text: str) -> float:
    """The value of float literal `text`, or LiteralError (a value beyond f64's range)."""
    t = text.strip()
    if not re.fullmatch(r"-?([0-9]+\.[0-9]+([eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+"
                        r"|[0-9]+(\.[0-9]*)?)", t):
        raise LiteralError(f"{_short(t)} is not a number")
    mantissa, _, exponent = t.lower().partition("e")
    if exponent and len(exponent.lstrip("+-").lstrip("0")) > 6:
        # float() would take a while and give inf or 0.0 anyway
        big = not exponent.startswith("-") and mantissa.strip("-0.") != ""
        if big:
            raise LiteralError(f"float literal {_short(t)} is too large for f64 "
                               f"(at most {_fmax('f64')})")
        return 0.0
    value = float(t)
    if math.isinf(value):
        raise LiteralError(f"float literal {_short(t)} is too large for f64 "
                           f"(at most {_fmax('f64')})")
    return value


def int_fits_error(value: int) -> str | None:
    """Why a compile-time integer is out of every integer type's range, or None."""
    if INT_MIN <= value <= INT_MAX:
        return None
    return f"{_short(str(value)) if abs(value) < 1 << 256 else _bits(value)} is out of " \
           f"range of every integer type ({_range_text()})"


def float_fits(value: float, ty: T.Scalar) -> bool:
    """Whether `value` converts to float type `ty` without overflowing to infinity
    (infinities and NaN given as such convert to themselves)."""
    if ty.is_fp8:
        from .fp8 import literal_fits

        return literal_fits(value, ty)
    if not math.isfinite(value):
        return True
    limit = _OVERFLOW.get(ty.name)
    return limit is None or abs(value) < limit


def float_range_text(ty: T.Scalar) -> str:
    return f"{ty} holds at most {_fmax(ty.name)}"


def show_int(value: int) -> str:
    """A compile-time integer for a message: digits, or its size when it is huge."""
    return str(value) if abs(value) < 1 << 256 else _bits(value)


def _fmax(name: str) -> str:
    return {"f16": "65504", "bf16": "3.39e38", "f32": "3.40e38", "f64": "1.80e308",
            "e4m3": "448 and no infinity", "e5m2": "57344"}[name]


def _range_text() -> str:
    return f"integers lie in [{INT_MIN}, {INT_MAX}] (s64 to u64)"


def _bits(value: int) -> str:
    return f"a {value.bit_length()}-bit integer"


def _short(text: str) -> str:
    return text if len(text) <= 40 else f"{text[:20]}...{text[-8:]} ({len(text)} digits)"
