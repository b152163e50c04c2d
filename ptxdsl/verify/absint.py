"""The abstract domain of integer values the checks share: an interval and a congruence.

A `Range` says `lo <= x <= hi` (None: unbounded on that side) and `x = res (mod mod)`
(`mod` 1: nothing known). Every transfer function over-approximates: the result contains
every value the operation can produce from values of its operands, wrapped to the result
type. The congruence is what alignment proofs need (an offset that is 4 modulo 16 on every
path is never 16-byte aligned); the interval bounds indices into barrier arrays and stage
buffers. Both come from the CTA shape (`%tid` and friends are known per thread), from loop
bounds and steps, and from parameter types.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

import numpy as np

from .. import types as T

# A bound this large comes from a type or a run-time value, not from the kernel's constants:
# an index the analysis can only bound by it is unknown rather than out of range.
SMALL = 1 << 20


@dataclass(frozen=True, slots=True)
class Range:
    lo: int | None = None
    hi: int | None = None
    mod: int = 1
    res: int = 0

    def __post_init__(self) -> None:
        if self.mod > 1:
            object.__setattr__(self, "res", self.res % self.mod)
        else:
            object.__setattr__(self, "mod", 1)
            object.__setattr__(self, "res", 0)

    @property
    def exact(self) -> int | None:
        return self.lo if self.lo is not None and self.lo == self.hi else None

    @property
    def small(self) -> bool:
        """Both bounds come from the kernel's constants (see SMALL)."""
        return self.lo is not None and self.hi is not None and -SMALL < self.lo and \
            self.hi < SMALL

    def residue(self, m: int) -> int | None:
        """The value modulo `m` when the congruence decides it."""
        if self.exact is not None:
            return self.exact % m
        return self.res % m if self.mod % m == 0 else None

    def never_multiple_of(self, m: int) -> bool:
        """No value of the range is a multiple of `m` (m a power of two)."""
        if self.exact is not None:
            return self.exact % m != 0
        g = gcd(self.mod, m)
        return g > 1 and self.res % g != 0

    def power_of_two(self) -> int:
        """A power of two dividing every value (1 if none is known)."""
        if self.exact is not None:
            v = abs(self.exact)
            return v & -v if v else SMALL
        g = gcd(self.mod, self.res)
        return g & -g if g else 1


TOP = Range()


def of_known(k: int | np.ndarray) -> Range:
    """The range of an exactly known value (one per thread)."""
    if isinstance(k, int):
        return Range(k, k)
    lo, hi = int(k.min()), int(k.max())
    if lo == hi:
        return Range(lo, hi)
    g = int(np.gcd.reduce(k - lo))
    return Range(lo, hi, g, lo)


def of_type(t: T.Type) -> Range:
    if not isinstance(t, T.Scalar) or t.is_float:
        return TOP
    if t.is_pred:
        return Range(0, 1)
    bits = t.nbits
    if t.is_signed:
        return Range(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    return Range(0, (1 << bits) - 1)


def fit(r: Range, t: T.Type) -> Range:
    """`r` wrapped to type `t`: kept if it fits, else the type's range with the congruence
    that wrapping modulo 2^bits preserves."""
    tr = of_type(t)
    if tr is TOP:
        return r
    inside = r.lo is not None and r.hi is not None and tr.lo is not None and \
        tr.hi is not None and tr.lo <= r.lo and r.hi <= tr.hi
    if inside:
        return r
    bits = t.nbits if isinstance(t, T.Scalar) else 64
    m = gcd(r.mod, 1 << bits) if r.exact is None else 1 << bits
    return Range(tr.lo, tr.hi, m, r.exact if r.exact is not None else r.res)


def _cong(r: Range) -> tuple[int, int]:
    """(mod, res) with mod 0 meaning the exact value res."""
    e = r.exact
    return (0, e) if e is not None else (r.mod, r.res)


def _mk(lo: int | None, hi: int | None, mod: int, res: int) -> Range:
    if mod == 0:
        return Range(res, res) if lo is None or lo == hi else Range(lo, hi)
    return Range(lo, hi, mod, res)


def join(a: Range, b: Range) -> Range:
    lo = None if a.lo is None or b.lo is None else min(a.lo, b.lo)
    hi = None if a.hi is None or b.hi is None else max(a.hi, b.hi)
    (ma, ra), (mb, rb) = _cong(a), _cong(b)
    m = gcd(gcd(ma, mb), abs(ra - rb))
    return Range(lo, hi, m, ra) if m else Range(lo, hi)


def _bound(f, *xs: int | None) -> int | None:
    return None if any(x is None for x in xs) else f(*xs)


def add(a: Range, b: Range, sign: int = 1) -> Range:
    lo = _bound(lambda x, y: x + y, a.lo, b.lo if sign > 0 else _neg(b.hi))
    hi = _bound(lambda x, y: x + y, a.hi, b.hi if sign > 0 else _neg(b.lo))
    (ma, ra), (mb, rb) = _cong(a), _cong(b)
    return _mk(lo, hi, gcd(ma, mb), ra + sign * rb)


def _neg(x: int | None) -> int | None:
    return None if x is None else -x


def mul(a: Range, b: Range) -> Range:
    lo = hi = None
    if None not in (a.lo, a.hi, b.lo, b.hi):
        ps = [x * y for x in (a.lo, a.hi) for y in (b.lo, b.hi)]  # type: ignore[operator]
        lo, hi = min(ps), max(ps)
    (ma, ra), (mb, rb) = _cong(a), _cong(b)
    return _mk(lo, hi, gcd(gcd(ma * mb, ma * rb), mb * ra), ra * rb)


def shl(a: Range, b: Range) -> Range:
    k = b.exact
    if k is None or not 0 <= k < 64:
        return TOP
    return mul(a, Range(1 << k, 1 << k))


def shr(a: Range, b: Range) -> Range:
    k = b.exact
    if k is None or not 0 <= k < 64 or a.lo is None or a.lo < 0:
        return TOP
    d = 1 << k
    m, r = _cong(a)
    lo, hi = a.lo >> k, None if a.hi is None else a.hi >> k
    if m and m % d == 0 and r % d == 0:
        return Range(lo, hi, m // d, r // d)
    return Range(lo, hi)


def rem(a: Range, b: Range) -> Range:
    """Truncating remainder by a positive constant."""
    k = b.exact
    if k is None or k <= 0:
        return TOP
    m, r = _cong(a)
    if m % k == 0:  # the residue decides the result (m 0: exact)
        if a.lo is not None and a.lo >= 0:
            return Range(r % k, r % k)
    nonneg = a.lo is not None and a.lo >= 0
    if nonneg and a.hi is not None and a.hi < k:
        return a
    g = gcd(m, k)
    lo = 0 if nonneg else -(k - 1)
    return Range(lo, k - 1, g, r) if g > 1 and nonneg else Range(lo, k - 1)


def div(a: Range, b: Range) -> Range:
    k = b.exact
    if k is None or k <= 0 or a.lo is None or a.lo < 0:
        return TOP
    m, r = _cong(a)
    lo, hi = a.lo // k, None if a.hi is None else a.hi // k
    if m and m % k == 0 and r % k == 0:
        return Range(lo, hi, m // k, r // k)
    return Range(lo, hi)


def and_(a: Range, b: Range) -> Range:
    """Bitwise and; a constant mask of low bits keeps the residue, any non-negative mask
    bounds the result."""
    for x, y in ((a, b), (b, a)):
        k = y.exact
        if k is None or k < 0:
            continue
        out_hi = k if x.lo is None or x.lo < 0 or x.hi is None else min(k, x.hi)
        if k & (k + 1) == 0:  # 2^j - 1
            m, r = _cong(x)
            g = gcd(m, k + 1)
            if g == k + 1 and (x.lo is not None and x.lo >= 0 or m == 0):
                v = r & k
                return Range(v, v)
            return Range(0, out_hi, g, r) if g > 1 else Range(0, out_hi)
        low = k & -k  # the result keeps the multiple of x's low bits below k's lowest bit
        return Range(0, out_hi, low, 0) if low > 1 else Range(0, out_hi)
    if a.lo is not None and a.lo >= 0 and b.lo is not None and b.lo >= 0:
        hi = _bound(min, a.hi, b.hi)
        return Range(0, hi)
    return TOP


def or_xor(a: Range, b: Range) -> Range:
    """Bitwise or / xor of non-negative values: below the next power of two of the bounds."""
    if a.lo is None or b.lo is None or a.lo < 0 or b.lo < 0 or a.hi is None or b.hi is None:
        return TOP
    top = 1 << max(a.hi, b.hi).bit_length()
    pa, pb = a.power_of_two(), b.power_of_two()
    p = min(pa, pb, top)
    return Range(0, top - 1, p, 0) if p > 1 else Range(0, top - 1)


def minmax(a: Range, b: Range, is_max: bool) -> Range:
    if is_max:
        lo = a.lo if b.lo is None else b.lo if a.lo is None else max(a.lo, b.lo)
        hi = _bound(max, a.hi, b.hi)
    else:
        lo = _bound(min, a.lo, b.lo)
        hi = b.hi if a.hi is None else a.hi if b.hi is None else min(a.hi, b.hi)
    j = join(a, b)
    return Range(lo, hi, j.mod, j.res)


BINARY = {
    "add": add,
    "sub": lambda a, b: add(a, b, -1),
    "mul": mul,
    "shl": shl,
    "shr": shr,
    "rem": rem,
    "div": div,
    "and": and_,
    "or": or_xor,
    "xor": or_xor,
    "min": lambda a, b: minmax(a, b, False),
    "max": lambda a, b: minmax(a, b, True),
}


def typed(r: Range, t: T.Type) -> Range:
    """`r` with the bounds it lacks taken from its type (a value of type `t` lies in it)."""
    if r.lo is not None and r.hi is not None:
        return r
    tr = of_type(t)
    return Range(tr.lo if r.lo is None else r.lo, tr.hi if r.hi is None else r.hi, r.mod, r.res)


def binary(op: str, a: Range, b: Range, t: T.Type, tb: T.Type) -> Range:
    """`a op b` for operands of types `t` and `tb`, wrapped to the result type `t`."""
    f = BINARY.get(op)
    return fit(f(typed(a, t), typed(b, tb)), t) if f is not None else of_type(t)


def loop_var(start: Range, stop: Range, step: Range) -> Range:
    """The values a `for` variable takes inside the body: from start towards stop, in steps
    of `step` (start + k*step)."""
    k = step.exact
    if k is None or k == 0:
        return Range(None, None)
    if k > 0:
        lo, hi = start.lo, None if stop.hi is None else stop.hi - 1
    else:
        lo, hi = None if stop.lo is None else stop.lo + 1, start.hi
    m, r = _cong(start)
    return Range(lo, hi, gcd(m, abs(k)), r)
