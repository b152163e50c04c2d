"""Which threads of a CTA run a statement: conditions on thread indices evaluated per thread.

Shared by the passes that must know who issues an operation: the pipelines pass counts the
arrivals of commit and release, the sm_80 pass widens a one-thread copy block to its warp."""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import ir
from .. import types as T


class Unknown(Exception):
    """A condition that depends on more than thread indices and constants."""


@dataclass
class ThreadModel:
    """Which threads of a CTA run a statement, from conditions on thread indices."""

    threads: tuple[int, int, int]
    env: dict[str, ir.Expr] = field(default_factory=dict)

    def value(self, e: ir.Expr, tid: int, active: frozenset[int]):
        x, y, _ = self.threads
        if isinstance(e, ir.Const):
            return e.value
        if isinstance(e, ir.SReg):
            table = {"tid.x": tid % x, "tid.y": tid // x % y, "tid.z": tid // (x * y),
                     "warp": tid // 32, "laneid": tid % 32, "ntid.x": x, "ntid.y": y,
                     "ntid.z": self.threads[2]}
            if e.name in table:
                return table[e.name]
            raise Unknown
        if isinstance(e, ir.Var) and e.name in self.env:
            return self.value(self.env[e.name], tid, active)
        if isinstance(e, ir.Call) and e.fn == "elect":
            warp = [t for t in active if t // 32 == tid // 32]
            return bool(warp) and tid == min(warp)
        if isinstance(e, ir.Compare):
            a, b = self.value(e.a, tid, active), self.value(e.b, tid, active)
            return {"eq": a == b, "ne": a != b, "lt": a < b, "le": a <= b, "gt": a > b,
                    "ge": a >= b}[e.op]
        if isinstance(e, ir.Unary) and e.op == "not" and e.type == T.pred:
            return not self.value(e.x, tid, active)
        if isinstance(e, ir.Binary):
            a, b = self.value(e.a, tid, active), self.value(e.b, tid, active)
            if e.type == T.pred:
                return (a and b) if e.op == "and" else (a or b) if e.op == "or" else a != b
            ops = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
                   "div": lambda: a // b, "rem": lambda: a % b, "and": lambda: a & b,
                   "or": lambda: a | b, "xor": lambda: a ^ b, "shl": lambda: a << b,
                   "shr": lambda: a >> b, "min": lambda: min(a, b), "max": lambda: max(a, b)}
            return ops[e.op]()
        if isinstance(e, ir.Cast):
            return self.value(e.x, tid, active)
        raise Unknown

    def active(self, path: list[tuple[ir.Expr, bool]]) -> frozenset[int]:
        """The threads that reach the end of a path of (condition, taken-branch) pairs."""
        x, y, z = self.threads
        act = frozenset(range(x * y * z))
        for cond, polarity in path:
            act = frozenset(t for t in act if bool(self.value(cond, t, act)) == polarity)
        return act
