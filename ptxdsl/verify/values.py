"""What the verifier knows about a value in every thread of one CTA.

A value is known exactly (one integer per thread, or one integer for all threads), or unknown
with facts that still matter: whether it is the same in every thread (kernel parameters,
`%ctaid`, counters of loops with uniform bounds), a power of two known to divide it (for
alignment proofs), and its `absint.Range` (bounds and a congruence, for every thread).
Floats are never tracked: no thread selection or address depends on them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import ir
from .. import types as T
from . import absint
from .absint import Range

ALIGN_CAP = 1 << 20  # the alignment of 0: larger than anything a check asks for

Known = int | np.ndarray


@dataclass(frozen=True, eq=False)
class Val:
    """`known` is an int (same in every thread), an int64 array (one per thread), or None."""

    known: Known | None = None
    uniform: bool = False
    align: int = 1
    varies: bool = False  # depends on a loop counter: changes from one iteration to the next
    # The range of an unknown value (None: nothing beyond its type), or a function that
    # computes it: most values are never asked for theirs.
    rng: Range | Callable[[], Range] | None = None

    @property
    def range(self) -> Range:
        r = self.rng
        if isinstance(r, Range):
            return r
        if self.known is not None:
            r = absint.of_known(self.known)
        else:
            r = r() if r is not None else absint.TOP
        object.__setattr__(self, "rng", r)
        return r

    def __post_init__(self) -> None:
        k = self.known
        if isinstance(k, int) and not -(1 << 62) <= k < (1 << 62):  # beyond what int64 holds
            object.__setattr__(self, "known", None)  # after arithmetic: unknown, uniform
            object.__setattr__(self, "uniform", True)
            object.__setattr__(self, "align", min(lowbit(k), ALIGN_CAP))

    @property
    def is_uniform(self) -> bool:
        k = self.known
        if k is None:
            return self.uniform
        return isinstance(k, int) or bool((k == k[0]).all())

    def alignment(self, mask: np.ndarray | None = None) -> int:
        """A power of two dividing the value in every thread (of `mask`)."""
        k = self.known
        if k is None:
            return self.align
        if isinstance(k, int):
            return lowbit(k)
        vals = k if mask is None else k[mask]
        if vals.size == 0:
            return ALIGN_CAP
        g = int(np.bitwise_or.reduce(vals))
        return lowbit(g)

    def values(self, mask: np.ndarray) -> np.ndarray | None:
        """The value in each thread of `mask`, or None if unknown."""
        k = self.known
        if k is None:
            return None
        if isinstance(k, int):
            return np.full(int(mask.sum()), k, dtype=np.int64)
        return k[mask]

    def same_as(self, other: Val, ranges: bool = True) -> bool:
        """Equal values, or unknown ones with equal facts (and ranges, if asked)."""
        a, b = self.known, other.known
        if a is None or b is None:
            return a is None and b is None and self.uniform == other.uniform and \
                self.align == other.align and self.varies == other.varies and \
                (not ranges or self.range == other.range)
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        return bool(np.all(np.asarray(a) == np.asarray(b)))


def top(uniform: bool = False, align: int = 1, varies: bool = False,
        rng: Range | Callable[[], Range] | None = None) -> Val:
    return Val(None, uniform, min(max(align, 1), ALIGN_CAP), varies, rng)


_CONSTS: dict[int, Val] = {}


def const(v: int) -> Val:
    v = int(v)
    c = _CONSTS.get(v)
    if c is None:
        c = Val(v)
        if -256 <= v <= 1 << 16:  # values are immutable: the common ones are shared
            _CONSTS[v] = c
    return c


def lowbit(v: int) -> int:
    """The largest power of two dividing `v` (ALIGN_CAP for 0)."""
    return ALIGN_CAP if v == 0 else min(v & -v, ALIGN_CAP)


def join(a: Val, b: Val, uniform_choice: bool = True, varies: bool = False) -> Val:
    """A value that is `a` or `b`; `uniform_choice`: every thread makes the same choice;
    `varies`: the choice changes from one loop iteration to the next."""
    if a is b:
        return a
    if a.known is None and a.same_as(b, ranges=False):
        # The same facts: keep them (and `a`'s range, if it is `b`'s) without computing the
        # ranges, which most values never need.
        return a if a.rng is b.rng else \
            Val(None, a.uniform, a.align, a.varies, lambda: absint.join(a.range, b.range))
    if a.same_as(b):
        return a
    return top(uniform=a.is_uniform and b.is_uniform and uniform_choice,
               align=min(a.alignment(), b.alignment()), varies=varies or a.varies or b.varies,
               rng=lambda: absint.join(a.range, b.range))


def _wrap(v: Known, t: T.Type) -> Known | None:
    """`v` reduced to the range of type `t`; None when int64 cannot hold it."""
    if not isinstance(t, T.Scalar) or t.is_float:
        return None
    if t.is_pred:
        return int(v != 0) if isinstance(v, int) else (v != 0).astype(np.int64)
    bits = t.nbits
    if bits == 64:
        big = abs(v) >= (1 << 62) if isinstance(v, int) else bool((np.abs(v) >= (1 << 62)).any())
        return None if big else v
    mask = (1 << bits) - 1
    v = v & mask
    if t.is_signed:
        sign = 1 << (bits - 1)
        v = (v ^ sign) - sign
    return v


def _result(v: Known | None, t: T.Type, uniform: bool, align: int, varies: bool,
            rng: Callable[[], Range] | None = None) -> Val:
    if v is not None:
        w = _wrap(v, t)
        if w is not None:
            return Val(w, varies=varies)
    return top(uniform, align, varies, None if rng is None else lambda: absint.fit(rng(), t))


def _pick(cond: Known, a: Known, b: Known) -> Known:
    if isinstance(cond, int):
        return a if cond else b
    return np.where(cond != 0, a, b)


def _div(a: Known, b: Known, rem: bool) -> Known:
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            return 0
        q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
        return a - b * q if rem else q
    a_arr, b_arr = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    safe = np.where(b_arr == 0, 1, b_arr)
    quot = np.abs(a_arr) // np.abs(safe) * np.where((a_arr >= 0) == (safe >= 0), 1, -1)
    out = a_arr - safe * quot if rem else quot
    return np.where(b_arr == 0, 0, out)


def _shift(a: Known, b: Known, left: bool, t: T.Scalar) -> Known:
    bits = t.nbits
    if isinstance(a, int) and isinstance(b, int):
        if b >= bits:
            return -1 if (not left and t.is_signed and a < 0) else 0
        return a << b if left else a >> b
    a_arr = np.asarray(a, dtype=np.int64)
    b_arr = np.minimum(np.asarray(b, dtype=np.int64), 63)
    out = np.left_shift(a_arr, b_arr) if left else np.right_shift(a_arr, b_arr)
    over = np.asarray(b, dtype=np.int64) >= bits
    fill = np.where(a_arr < 0, -1, 0) if (not left and t.is_signed) else 0
    return np.where(over, fill, out)


_ARITH = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "and": lambda a, b: a & b, "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b,
    "min": lambda a, b: min(a, b) if isinstance(a, int) and isinstance(b, int)
    else np.minimum(a, b),
    "max": lambda a, b: max(a, b) if isinstance(a, int) and isinstance(b, int)
    else np.maximum(a, b),
}  # fmt: skip

_COMPARE = {
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
}  # fmt: skip


def _as_int(v: object) -> Known:
    if isinstance(v, np.ndarray):
        return v.astype(np.int64)
    return int(v)  # type: ignore[call-overload]


def _binary_align(op: str, a: Val, b: Val) -> int:
    la, lb = a.alignment(), b.alignment()
    kb = b.known if isinstance(b.known, int) else None
    ka = a.known if isinstance(a.known, int) else None
    if op in ("add", "sub", "or", "xor", "min", "max"):
        return min(la, lb)
    if op == "mul":
        return min(la * lb, ALIGN_CAP)
    if op == "shl" and kb is not None:
        return min(la << min(kb, 20), ALIGN_CAP)
    if op == "shr" and kb is not None:
        return max(1, la >> kb)
    if op == "and":
        return max(la if kb is None else max(la, lowbit(kb)),
                   lb if ka is None else max(lb, lowbit(ka)))
    return 1


class Evaluator:
    """Evaluates IR expressions for every thread of a CTA of shape `threads`."""

    def __init__(self, threads: tuple[int, int, int]):
        x, y, z = threads
        self.n = x * y * z
        lin = np.arange(self.n, dtype=np.int64)
        self.linear = lin
        self.sregs: dict[str, Val] = {
            "tid.x": Val(lin % x), "tid.y": Val((lin // x) % y), "tid.z": Val(lin // (x * y)),
            "ntid.x": const(x), "ntid.y": const(y), "ntid.z": const(z),
            "laneid": Val(lin & 31), "warp": Val(lin >> 5),
        }
        self.warp_of = lin >> 5

    def sreg(self, name: str) -> Val:
        v = self.sregs.get(name)
        if v is not None:
            return v
        # Grid, cluster and launch-size registers are the same in every thread of a CTA.
        per_cta = name.split(".")[0] in {"ctaid", "nctaid", "clusterid", "nclusterid",
                                         "cluster_ctaid", "cluster_nctaid", "cluster_ctarank",
                                         "cluster_nctarank", "dynamic_smem_size"}
        return top(uniform=per_cta)

    def ev(self, e: ir.Expr, env: dict[str, Val], must: np.ndarray, may: np.ndarray) -> Val:
        """The value of `e`; `must`/`may` are the threads that (may) evaluate it (for elect)."""
        if isinstance(e, ir.Var):
            return env.get(e.name) or top()
        if isinstance(e, ir.Const):
            v = e.value
            if isinstance(v, bool) or isinstance(v, int):
                return const(int(v))
            return top(uniform=True)
        if isinstance(e, ir.SReg):
            return self.sreg(e.name)
        if isinstance(e, ir.Binary):
            return self.binary(e, env, must, may)
        if isinstance(e, ir.Compare):
            a, b = self.ev(e.a, env, must, may), self.ev(e.b, env, must, may)
            # Pointers are offsets from an unknown base: comparing them tells nothing.
            if _is_float(e.a.type) or isinstance(e.a.type, T.Ptr) or a.known is None or \
                    b.known is None:
                return top(uniform=a.is_uniform and b.is_uniform, varies=a.varies or b.varies)
            r = _COMPARE[e.op](a.known, b.known)
            return Val(_as_int(r), varies=a.varies or b.varies)
        if isinstance(e, ir.Unary):
            x = self.ev(e.x, env, must, may)
            if _is_float(e.type):
                return top(uniform=x.is_uniform, varies=x.varies)
            if x.known is None:
                neg = (lambda: absint.add(absint.Range(0, 0), x.range, -1)) \
                    if e.op == "neg" else None
                return _result(None, e.type, x.is_uniform, 1, x.varies, neg)
            if e.op == "neg":
                return _result(-x.known, e.type, x.uniform, x.align, x.varies)
            r = (1 - x.known) if e.type == T.pred else ~x.known
            return _result(r, e.type, False, 1, x.varies)
        if isinstance(e, ir.Cast):
            x = self.ev(e.x, env, must, may)
            if _is_float(e.type) or _is_float(e.x.type):
                return top(uniform=x.is_uniform, varies=x.varies)
            return _result(x.known, e.type, x.is_uniform, x.alignment(), x.varies,
                           lambda: x.range)
        if isinstance(e, ir.Select):
            c = self.ev(e.cond, env, must, may)
            a, b = self.ev(e.a, env, must, may), self.ev(e.b, env, must, may)
            if c.known is not None and a.known is not None and b.known is not None:
                return Val(_pick(c.known, a.known, b.known), varies=a.varies or b.varies or
                           c.varies)
            return join(a, b, c.is_uniform, c.varies)
        if isinstance(e, ir.Call):
            if e.fn == "elect":
                return self.elect(must, may)
            if e.fn == "abs" and not _is_float(e.type):
                x = self.ev(e.args[0], env, must, may)
                if x.known is not None:
                    return Val(abs(x.known) if isinstance(x.known, int) else np.abs(x.known))
            args = [self.ev(a, env, must, may) for a in e.args]
            uniform = e.fn not in ("shfl_xor", "shfl_down", "shfl_up", "shfl_idx") and \
                all(a.is_uniform for a in args)
            return top(uniform=uniform, varies=any(a.varies for a in args))
        # Loads, vector elements and anything newer: unknown and possibly different per thread.
        return top()

    def binary(self, e: ir.Binary, env: dict[str, Val], must: np.ndarray,
               may: np.ndarray) -> Val:
        a, b = self.ev(e.a, env, must, may), self.ev(e.b, env, must, may)
        varies = a.varies or b.varies
        t = e.type
        if isinstance(t, T.Ptr):
            # Pointers are tracked as a byte offset from a (16-byte aligned) parameter.
            b = self._scaled(b, t.elem.nbytes)
            op = "add" if e.op == "add" else "sub"
            if a.known is not None and b.known is not None:
                return Val(_ARITH[op](a.known, b.known), varies=varies)
            return top(a.is_uniform and b.is_uniform, _binary_align(op, a, b), varies,
                       lambda: absint.add(a.range, b.range, 1 if op == "add" else -1))
        ka, kb = a.known, b.known
        if ka is not None and kb is not None and isinstance(t, T.Scalar) and not t.is_float:
            if e.op in ("div", "rem"):
                r = _div(ka, kb, e.op == "rem")
            elif e.op in ("shl", "shr"):
                r = _shift(ka, kb, e.op == "shl", t)
            else:
                r = _ARITH[e.op](ka, kb)
            w = _wrap(r, t)
            if w is not None:
                return Val(w, varies=varies)
        op = e.op
        tb = e.b.type
        # Two operands known only by their types give a result known only by its type.
        rng = (lambda: absint.binary(op, a.range, b.range, t, tb)) \
            if _is_int(t) and (a.known is not None or a.rng is not None or
                               b.known is not None or b.rng is not None) else None
        return top(a.is_uniform and b.is_uniform, _binary_align(e.op, a, b), varies, rng)

    @staticmethod
    def _scaled(v: Val, k: int) -> Val:
        if v.known is not None:
            return Val(v.known * k, varies=v.varies)
        return top(v.uniform, v.align * lowbit(k), v.varies,
                   lambda: absint.mul(v.range, absint.Range(k, k)))

    def elect(self, must: np.ndarray, may: np.ndarray) -> Val:
        """elect.sync: the lowest lane of each warp among the threads executing it."""
        if not np.array_equal(must, may):
            return top()
        out = np.zeros(self.n, dtype=np.int64)
        idx = np.flatnonzero(must)
        if idx.size:
            warps = self.warp_of[idx]
            first = np.ones(idx.size, dtype=bool)
            first[1:] = warps[1:] != warps[:-1]
            out[idx[first]] = 1
        return Val(out)

    def offset(self, index: Val, stride: int) -> Val:
        """`index * stride` bytes."""
        return self._scaled(index, stride)

    def add(self, a: Val, b: Val) -> Val:
        if a.known is not None and b.known is not None:
            return Val(a.known + b.known, varies=a.varies or b.varies)
        return top(a.is_uniform and b.is_uniform, min(a.alignment(), b.alignment()),
                   a.varies or b.varies, lambda: absint.add(a.range, b.range))


def _is_float(t: T.Type) -> bool:
    return isinstance(t, T.Scalar) and t.is_float


def _is_int(t: T.Type) -> bool:
    return isinstance(t, T.Scalar) and not t.is_float and not t.is_pred
