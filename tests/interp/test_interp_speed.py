"""The interpreter's fast paths against the plain semantics they stand for: operators that the
compiled kernel writes out as Python source against `scalar.py`, the bit-level rounding to
16-bit floats against exact rational rounding, the fallbacks for kernels nested too deep to
write as one function, and the wgmma fragment helpers against the PTX ISA's layout."""

from __future__ import annotations

import math
import random
import struct
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest

import ptxdsl
from ptxdsl import ir
from ptxdsl import types as T
from ptxdsl.interp import InterpError, run, scalar
from ptxdsl.interp import wgmma as W
from ptxdsl.interp.exprs import compile_expr

INTS = [T.u8, T.u16, T.u32, T.u64, T.s8, T.s16, T.s32, T.s64, T.b32]
FLOATS = [T.f16, T.bf16, T.f32, T.f64]


def evaluate(e: ir.Expr, *regs):
    """`e` compiled as the interpreter compiles it, over registers a, b: its value, or the
    kind of InterpError it raises."""
    code = SimpleNamespace(slots={"a": 0, "b": 1}, hoisted={})
    th = SimpleNamespace(regs=list(regs), name="thread 0")
    try:
        return compile_expr(code, e)(th)  # type: ignore[arg-type]
    except InterpError as err:
        return err.kind


def reference(f, *args):
    try:
        return f(*args)
    except ZeroDivisionError:
        return "arithmetic"


def same(x, y) -> bool:
    """Equal values of equal type, -0.0 told from 0.0 and NaN equal to NaN."""
    if isinstance(x, float) and isinstance(y, float):
        return struct.pack("<d", x) == struct.pack("<d", y) or (x != x and y != y)
    return type(x) is type(y) and x == y


def int_values(t: T.Scalar, rng: random.Random) -> list[int]:
    lo, hi = scalar.int_range(t)
    return [lo, hi, 0, 1, min(hi, 2), max(lo, hi // 2)] + [rng.randint(lo, hi) for _ in range(10)]


@pytest.mark.parametrize("t", INTS, ids=str)
def test_integer_operators_and_casts_match_scalar_semantics(t):
    rng = random.Random(t.nbits + t.is_signed)
    a, b = ir.Var(name="a", type=t), ir.Var(name="b", type=t)
    values = int_values(t, rng)
    for op in ("add", "sub", "mul", "and", "or", "xor", "div", "rem", "shl", "shr", "min", "max"):
        e = ir.Binary(op=op, a=a, b=b, type=t)
        for x in values:
            for y in values:
                if op in ("shl", "shr"):  # amounts below and past the width
                    y %= 2 * t.nbits
                got, want = evaluate(e, x, y), reference(scalar.binary(op, t), x, y)
                assert same(got, want), (op, x, y, got, want)
    for dst in INTS:
        e = ir.Cast(x=a, type=dst)
        for x in values:
            assert same(evaluate(e, x), scalar.cast(t, dst)(x)), (dst, x)


@pytest.mark.parametrize("t", FLOATS, ids=str)
def test_float_operators_and_comparisons_match_scalar_semantics(t):
    rng = random.Random(t.nbits)
    r = scalar.rounder(t)
    values = [0.0, -0.0, 1.0, -2.5, math.inf, -math.inf, math.nan] + \
        [r(rng.uniform(-1, 1) * 2.0 ** rng.randint(-30, 30)) for _ in range(12)]
    a, b = ir.Var(name="a", type=t), ir.Var(name="b", type=t)
    for x in values:
        for y in values:
            for op in ("add", "sub", "mul", "div", "min", "max"):
                got = evaluate(ir.Binary(op=op, a=a, b=b, type=t), x, y)
                assert same(got, scalar.binary(op, t)(x, y)), (op, x, y)
            for op in ("eq", "ne", "lt", "le", "gt", "ge"):
                got = evaluate(ir.Compare(op=op, a=a, b=b, type=T.pred), x, y)
                assert got is scalar.compare(op, t)(x, y), (op, x, y)
            pick = evaluate(ir.Select(cond=ir.Compare(op="lt", a=a, b=b, type=T.pred), a=a, b=b,
                                      type=t), x, y)
            assert same(pick, x if x < y else y)


@pytest.mark.parametrize("t", [T.f16, T.bf16], ids=str)
def test_rounding_to_16_bit_floats_rounds_exactly_once(t):
    """The bit-level rounding of normal results, and the arithmetic one of subnormal and
    overflowing ones, give the correctly rounded value of the binary64 input."""
    rng = random.Random(7)
    p, emin, emax = scalar._FLOAT_FORMAT[t.name]
    r = scalar.rounder(t)
    samples = []
    for e in range(emin - p - 2, emax + 3):
        samples += [math.ldexp(1.0 + rng.random(), e) for _ in range(20)]
        ulp = math.ldexp(1.0, max(e, emin) - p + 1)
        tie = math.ldexp(1.0, e) + ulp * (rng.randrange(1 << (p - 1)) + 0.5)  # halfway
        samples += [tie, math.nextafter(tie, 0.0), math.nextafter(tie, math.inf)]
    for x in samples + [-x for x in samples]:
        assert same(r(x), scalar.round_exact(Fraction(x), t)), x
    assert same(r(-0.0), -0.0) and same(r(math.inf), math.inf) and math.isnan(r(math.nan))


def test_bf16_loads_read_what_bf16_from_bits_gives():
    values = scalar._bf16_values()
    assert all(same(values[b], scalar.bf16_from_bits(b)) for b in range(1 << 16))


def test_kernels_nested_deeper_than_one_function_holds_still_run():
    """An expression deeper than one written function takes (a chain of 60 additions that
    read shared memory) and loops and branches 12 levels deep."""
    chain = " + ".join(["s[%tid.x]"] + ["s[(%tid.x + 1) % 32]"] * 60)
    body = "acc = acc + 1;"
    for i in range(12):
        body = (f"if %tid.x < 64 {{ {body} }}" if i % 2 else
                f"for i{i} in 0 .. 2 {{ {body} }}")
    text = f"""
    kernel k(dst: ptr<u32>) threads(32) {{
        shared s: u32[32];
        s[%tid.x] = %tid.x;
        bar_sync(0);
        let acc: u32 = {chain};
        {body}
        dst[%tid.x] = acc;
    }}
    """
    dst = np.zeros(32, np.uint32)
    run(ptxdsl.parse(text, "deep.ptxdsl").kernel(), 1, {"dst": dst})
    tid = np.arange(32)
    assert (dst == tid + 60 * ((tid + 1) % 32) + 2 ** 6).all()


@pytest.mark.parametrize("tid", [0, 5, 70, 127])
def test_wgmma_fragments_follow_the_register_layout(tid):
    """d[4j + 2i + c] = D[row i, 8j + 2(l % 4) + c]; a[4h + 2i + c] = A[row i, 8h + 2(l % 4) + c]
    of the lane l of the quad that holds it."""
    th = SimpleNamespace(tid=tid)
    lane = tid % 32
    rows = np.arange(2 * 64, dtype=np.float32).reshape(2, 64)
    frag = W.scatter(th, rows)  # type: ignore[arg-type]
    for j in range(8):
        for i in range(2):
            for c in range(2):
                assert frag[4 * j + 2 * i + c] == rows[i, 8 * j + 2 * (lane % 4) + c]
    first = lane // 4 * 4
    quad = {q: [float(100 * q + k) for k in range(8)] for q in range(first, first + 4)}
    a = W.a_from_regs(th, quad, "bf16")  # type: ignore[arg-type]
    for q in range(first, first + 4):
        for h in range(2):
            for i in range(2):
                for c in range(2):
                    assert a[i, 8 * h + 2 * (q % 4) + c] == quad[q][4 * h + 2 * i + c]
