"""The verifier's integer domain is sound: every value an operation produces from values
inside its operands' ranges lies inside the result's range and congruence (u32 and s32
arithmetic, random ranges with congruences)."""

from __future__ import annotations

import random

import pytest

from ptxdsl import types as T
from ptxdsl.verify import absint
from ptxdsl.verify.absint import Range


def _members(r: Range, rng: random.Random, n: int = 12) -> list[int]:
    assert r.lo is not None and r.hi is not None
    out = [x for x in range(r.lo, r.hi + 1) if (x - r.res) % r.mod == 0]
    return rng.sample(out, min(n, len(out)))


def _random_range(rng: random.Random, signed: bool, exact: bool = False) -> Range:
    lo = rng.randint(-300 if signed else 0, 300)
    if exact:
        return Range(lo, lo)
    mod = rng.choice([1, 2, 3, 4, 8, 16, 5, 12])
    return Range(lo, lo + rng.randint(mod, 400), mod, rng.randint(0, mod - 1))


def _concrete(op: str, a: int, b: int, t: T.Scalar) -> int | None:
    bits = t.nbits
    if op in ("div", "rem"):
        if b == 0:
            return None
        q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
        v = a - b * q if op == "rem" else q
    elif op == "shl":
        v = a << b
    elif op == "shr":
        v = a >> b
    else:
        v = {"add": a + b, "sub": a - b, "mul": a * b, "and": a & b, "or": a | b,
             "xor": a ^ b, "min": min(a, b), "max": max(a, b)}[op]
    v &= (1 << bits) - 1
    if t.is_signed and v >= 1 << (bits - 1):
        v -= 1 << bits
    return v


def _contains(r: Range, v: int) -> bool:
    return (r.lo is None or r.lo <= v) and (r.hi is None or v <= r.hi) and \
        (v - r.res) % r.mod == 0


@pytest.mark.parametrize("t", [T.u32, T.s32], ids=str)
@pytest.mark.parametrize("op", sorted(absint.BINARY))
def test_binary_transfer_is_sound(op, t):
    rng = random.Random(f"{op}{t}")
    signed = t.is_signed
    for _ in range(150):
        a = _random_range(rng, signed)
        exact_b = op in ("shl", "shr", "div", "rem") or rng.random() < 0.3
        b = _random_range(rng, signed and not exact_b, exact_b)
        if op in ("shl", "shr"):
            k = rng.randint(0, 6)
            b = Range(k, k)
        if op in ("div", "rem"):
            k = rng.randint(1, 20)
            b = Range(k, k)
        r = absint.binary(op, a, b, t, t)
        for x in _members(a, rng):
            for y in _members(b, rng, 4):
                v = _concrete(op, x, y, t)
                if v is not None:
                    assert _contains(r, v), (op, a, b, x, y, v, r)


def test_congruence_decides_misalignment():
    # (16 t + 4) bytes: never a multiple of 16, and its residue is told
    r = absint.add(absint.mul(Range(0, 100), Range(16, 16)), Range(4, 4))
    assert r.never_multiple_of(16) and r.residue(16) == 4
    assert not absint.add(r, Range(12, 12)).never_multiple_of(16)


def test_loop_variable_range():
    r = absint.loop_var(Range(3, 3), Range(40, 40), Range(4, 4))
    assert (r.lo, r.hi, r.mod, r.res) == (3, 39, 4, 3)
