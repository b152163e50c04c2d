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

from .. import types as T

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


def fold(op: str, symbol: str, x: int | float, y: int | float) -> int | float:
    """The value of the constant expression `x op y` (`symbol`: the operator as written);
    integer division and remainder truncate toward zero, as the target's do. Raises
    LiteralError saying why it has none."""
    both = f"'{symbol}' of {show_value(x)} and {show_value(y)}"
    if op in ("shl", "shr") and isinstance(y, int) and not 0 <= y <= MAX_SHIFT:
        raise LiteralError(f"shift count {show_value(y)} of a constant expression is outside "
                           f"[0, {MAX_SHIFT}]")
    try:
        r = _arith(op, x, y)
    except ZeroDivisionError:
        raise LiteralError("division by zero in a constant expression") from None
    except (OverflowError, ValueError):  # int(inf), a float from a huge integer
        raise LiteralError(f"the constant expression {both} has no finite value") from None
    if r is None:
        raise LiteralError(f"'{symbol}' is not defined for {x!r} and {y!r}")
    if isinstance(r, float) and not math.isfinite(r) and _finite(x) and _finite(y):
        raise LiteralError(f"the constant expression {both} overflows f64")
    if isinstance(r, int) and (why := int_fits_error(r)) is not None:
        raise LiteralError(f"the constant expression {both}: its value {why}")
    return r


def _arith(op: str, x: int | float, y: int | float) -> int | float | None:
    """`x op y` in Python's exact arithmetic; None where the operator has no meaning."""
    if op == "add":
        return x + y
    if op == "sub":
        return x - y
    if op == "mul":
        return x * y
    if op in ("div", "rem") and isinstance(x, int) and isinstance(y, int):
        q = abs(x) // abs(y) * (1 if (x >= 0) == (y >= 0) else -1)
        return q if op == "div" else x - y * q
    if op == "div":
        return x / y
    if op == "rem":
        return math.fmod(x, y)
    if op in ("min", "max"):
        return min(x, y) if op == "min" else max(x, y)
    if op in ("and", "or", "xor", "shl", "shr", "land", "lor") and \
            isinstance(x, int) and isinstance(y, int):
        return {"and": x & y, "or": x | y, "xor": x ^ y, "shl": x << y, "shr": x >> y,
                "land": bool(x and y), "lor": bool(x or y)}[op]
    return None


def float_fits(value: float, ty: T.Scalar) -> bool:
    """Whether `value` converts to float type `ty` without overflowing to infinity
    (infinities and NaN given as such convert to themselves)."""
    if ty.is_fp8:
        from ..fp8 import literal_fits

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


def show_value(v: object) -> str:
    """A compile-time value for a message."""
    if isinstance(v, bool):
        return "true" if v else "false"
    return show_int(v) if isinstance(v, int) else repr(v)


def _finite(v: object) -> bool:
    return not isinstance(v, float) or math.isfinite(v)


def _fmax(name: str) -> str:
    return {"f16": "65504", "bf16": "3.39e38", "f32": "3.40e38", "f64": "1.80e308",
            "e4m3": "448 and no infinity", "e5m2": "57344"}[name]


def _range_text() -> str:
    return f"integers lie in [{INT_MIN}, {INT_MAX}] (s64 to u64)"


def _bits(value: int) -> str:
    return f"a {value.bit_length()}-bit integer"


def _short(text: str) -> str:
    return text if len(text) <= 40 else f"{text[:20]}...{text[-8:]} ({len(text)} digits)"
