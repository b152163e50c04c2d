"""The math functions a kernel author expects (`exp exp2 log log2 sigmoid silu gelu`), each
composed from the `.approx` intrinsics (`ex2 lg2 rcp tanh`) and f32 arithmetic, so the IR,
verifier, interpreter and emitter see only nodes they already know. f16 and bf16 arguments
compute in f32 and convert back to their type; `rsqrt` and `tanh` are the intrinsics
themselves (exprs.py).

Accuracy in f32 (the PTX ISA's bounds of the instructions, plus the rounding of the scaling
multiply that feeds them; docs/language.md has the table):
- exp2(x) = ex2.approx.ftz(x): 2 ulp; a result below 2^-126 is 0.
- exp(x) = ex2(x log2 e): relative about 2^-22 + |x| 2^-24.
- log2(x) = lg2.approx(x); log(x) = lg2(x) ln 2: absolute 2^-22 for x in (0.5, 2), else
  relative 2^-22.
- sigmoid(x) = rcp.approx(1 + ex2(-x log2 e)), silu(x) = x sigmoid(x): relative about
  2^-21 + |x| 2^-24; exactly 0 / 1 far out.
- gelu(x) = x/2 (1 + tanh.approx(sqrt(2/pi) (x + 0.044715 x^3))) (the tanh form): absolute
  |x| 2^-12, from tanh.approx's relative 2^-11."""

from __future__ import annotations

import math

from .. import ir
from .. import types as T
from ..errors import Span
from .common import MATH_FUNCTIONS, Lit, Operand, is_err, untyped
from .exprs import Expressions, register_calls

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
GELU_K0 = math.sqrt(2.0 / math.pi)  # gelu(x) = x/2 (1 + tanh(K0 (x + 0.044715 x^3)))
GELU_K1 = GELU_K0 * 0.044715
REPEATS = frozenset({"silu", "gelu"})  # the formulas that use their argument more than once


def _sigmoid(b: Expressions, x: Operand, loc: Span | None) -> Operand:
    """1 / (1 + 2^(-x log2 e)): ex2 overflows to inf for x below about -88 and rcp makes
    that 0; below -87.3 (ex2 flushing) it is exactly 1."""
    e = b.call("ex2", [b.binary("mul", x, Lit(-LOG2E, loc), loc)], loc)
    return b.call("rcp", [b.binary("add", Lit(1.0, loc), e, loc)], loc)


def _compose(b: Expressions, fn: str, x: Operand, loc: Span | None) -> Operand:
    """`fn(x)` for an f32 `x` or constant. `x` is a tree, repeated where the formula repeats
    it (silu, gelu); ptxas merges the copies (docs/language.md)."""
    if fn == "exp2":
        return b.call("ex2", [x], loc)
    if fn == "log2":
        return b.call("lg2", [x], loc)
    if fn == "exp":
        return b.call("ex2", [b.binary("mul", x, Lit(LOG2E, loc), loc)], loc)
    if fn == "log":
        return b.binary("mul", b.call("lg2", [x], loc), Lit(LN2, loc), loc)
    if fn == "sigmoid":
        return _sigmoid(b, x, loc)
    if fn == "silu":
        return b.binary("mul", x, _sigmoid(b, x, loc), loc)
    assert fn == "gelu", fn
    x2 = b.binary("mul", x, x, loc)
    inner = b.binary("mul", x, b.binary("add", Lit(GELU_K0, loc),
                                        b.binary("mul", x2, Lit(GELU_K1, loc), loc), loc), loc)
    half = b.binary("mul", x, Lit(0.5, loc), loc)
    return b.binary("mul", half, b.binary("add", Lit(1.0, loc), b.call("tanh", [inner], loc),
                                          loc), loc)


def math_call(b: Expressions, fn: str, args: list[Operand], loc: Span | None) -> Operand:
    if fn == "erf":
        return b.error("erf() has no fast PTX form; for GELU write gelu(x) (the tanh form, "
                       "one tanh.approx), or write an erf polynomial with fma()", loc)
    if len(args) != 1:
        return b.error(f"{fn}() takes 1 argument(s), got {len(args)}", loc)
    x = b.value(args[0], T.f32 if untyped(args[0]) else None)
    if is_err(x.type):
        return x
    if x.type not in (T.f32, T.f16, T.bf16):
        return b.error(f"{fn}() takes f32, f16 or bf16 (the last two compute in f32), got "
                       f"{x.type}", loc)
    if fn in REPEATS and ir.has_expr(x, (ir.Atomic, ir.AtomicLoad)):
        # the formula evaluates its argument more than once: an atomic would run twice
        return b.error(f"{fn}() evaluates its argument more than once, and this one holds an "
                       f"atomic access, which would run as often: bind it first (let v = ...; "
                       f"{fn}(v))", loc)
    # a constant stays one, so its arithmetic folds as the printed IR's does when reparsed
    src = args[0] if isinstance(args[0], Lit) else x
    if x.type == T.f32:
        return _compose(b, fn, src, loc)
    r = b.value(_compose(b, fn, b.cast(src, T.f32, x.loc), loc))
    return r if is_err(r.type) else ir.Cast(x=r, type=x.type, loc=loc)


register_calls(MATH_FUNCTIONS, math_call)
