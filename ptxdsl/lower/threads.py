"""Which threads of a CTA run a statement: conditions on thread indices evaluated per thread.

Shared by the passes that must know who issues an operation: the pipelines pass counts the
arrivals of commit and release, the sm_80 pass widens a one-thread copy block to its warp."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import ir
from .. import types as T


@dataclass
class ThreadModel:
    """Which threads of a CTA run a statement, from conditions on thread indices. `env` (the
    values of let-bound names) is filled before the first question; answers are kept."""

    threads: tuple[int, int, int]
    env: dict[str, ir.Expr] = field(default_factory=dict)
    # keyed by the ids of the path's conditions, which each entry keeps alive: a freed
    # condition's id may be reused by another one (a role's condition is built per question)
    _answers: dict[tuple, tuple[frozenset[int], tuple]] = field(default_factory=dict,
                                                                repr=False)

    def value(self, e: ir.Expr, tid: np.ndarray, active: np.ndarray) -> Any:
        """`e` for every thread index in `tid` at once (an array, or a scalar where `e` does
        not depend on the thread), `active` the threads that reach it (sorted)."""
        x, y, _ = self.threads
        if isinstance(e, ir.Const):
            return e.value
        if isinstance(e, ir.SReg):
            table = {"tid.x": lambda: tid % x, "tid.y": lambda: tid // x % y,
                     "tid.z": lambda: tid // (x * y), "warp": lambda: tid // 32,
                     "laneid": lambda: tid % 32, "ntid.x": lambda: x, "ntid.y": lambda: y,
                     "ntid.z": lambda: self.threads[2]}
            if e.name in table:
                return table[e.name]()
            raise ir.Unknown
        if isinstance(e, ir.Var) and e.name in self.env:
            return self.value(self.env[e.name], tid, active)
        if isinstance(e, ir.Call) and e.fn == "elect":  # the first active thread of a warp
            warps = int(max(tid.max(initial=0), active.max(initial=0))) // 32 + 1
            low = np.full(warps, np.iinfo(np.int64).max)  # no active thread: none elected
            np.minimum.at(low, active // 32, active)
            return tid == low[tid // 32]
        if isinstance(e, ir.Compare):
            a, b = self.value(e.a, tid, active), self.value(e.b, tid, active)
            return {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
                    "gt": np.greater, "ge": np.greater_equal}[e.op](a, b)
        if isinstance(e, ir.Unary) and e.op == "not" and e.type == T.pred:
            return np.logical_not(self.value(e.x, tid, active))
        if isinstance(e, ir.Binary):
            a, b = self.value(e.a, tid, active), self.value(e.b, tid, active)
            if e.type == T.pred:
                return {"and": np.logical_and, "or": np.logical_or}.get(
                    e.op, np.logical_xor)(a, b)
            if e.op in ("div", "rem") and np.any(np.equal(b, 0)):
                raise ir.Unknown
            ops = {"add": np.add, "sub": np.subtract, "mul": np.multiply,
                   "div": np.floor_divide, "rem": np.mod, "and": np.bitwise_and,
                   "or": np.bitwise_or, "xor": np.bitwise_xor, "shl": np.left_shift,
                   "shr": np.right_shift, "min": np.minimum, "max": np.maximum}
            return ops[e.op](a, b)
        if isinstance(e, ir.Cast):
            return self.value(e.x, tid, active)
        raise ir.Unknown

    def active(self, path: list[tuple[ir.Expr, bool]]) -> frozenset[int]:
        """The threads that reach the end of a path of (condition, taken-branch) pairs."""
        key = tuple((id(cond), polarity) for cond, polarity in path)
        hit = self._answers.get(key)
        if hit is not None:
            return hit[0]
        x, y, z = self.threads
        act = np.arange(x * y * z, dtype=np.int64)
        for cond, polarity in path:
            taken = np.broadcast_to(np.asarray(self.value(cond, act, act), bool), act.shape)
            act = act[taken == polarity]
        out = frozenset(act.tolist())
        self._answers[key] = (out, tuple(cond for cond, _ in path))
        return out
