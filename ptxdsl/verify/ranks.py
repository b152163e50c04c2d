"""Values of expressions that depend only on a CTA's place in its cluster (its rank and
cluster coordinates): peer ranks, multicast masks and the conditions around them, evaluated
for each CTA of the cluster."""

from __future__ import annotations

from collections.abc import Callable

from .. import ir

_OPS: dict[str, Callable[[int, int], int]] = {
        "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
        "div": lambda a, b: a // b, "rem": lambda a, b: a % b, "and": lambda a, b: a & b,
        "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b, "shl": lambda a, b: a << b,
        "shr": lambda a, b: a >> b, "min": min, "max": max}


class RankEval:
    """Values of expressions that depend only on the CTA's place in its cluster."""

    def __init__(self, k: ir.Kernel):
        self.shape = k.cluster or (1, 1, 1)
        assigned = {s.name for s in ir.walk(k.body) if isinstance(s, ir.Assign)}
        self.env = {s.name: s.value for s in ir.walk(k.body)
                    if isinstance(s, ir.Let) and s.value is not None and s.name not in assigned}

    def value(self, e: ir.Expr, rank: int) -> int:
        nx, ny, nz = self.shape
        if isinstance(e, ir.Const) and isinstance(e.value, int):
            return int(e.value)
        if isinstance(e, ir.SReg):
            table = {"cluster_ctarank": rank, "cluster_nctarank": nx * ny * nz,
                     "cluster_ctaid.x": rank % nx, "cluster_ctaid.y": rank // nx % ny,
                     "cluster_ctaid.z": rank // (nx * ny), "cluster_nctaid.x": nx,
                     "cluster_nctaid.y": ny, "cluster_nctaid.z": nz}
            if e.name in table:
                return table[e.name]
        elif isinstance(e, ir.Var) and e.name in self.env:
            return self.value(self.env[e.name], rank)
        elif isinstance(e, ir.Cast):
            return self.value(e.x, rank) & ((1 << (e.type.nbytes * 8)) - 1)  # type: ignore[attr-defined]
        elif isinstance(e, ir.Binary) and e.op in _OPS:
            return _OPS[e.op](self.value(e.a, rank), self.value(e.b, rank))
        raise ir.Unknown

    def over_cluster(self, e: ir.Expr, ranks: list[int]) -> list[tuple[int, int]]:
        """(rank, value) for each of `ranks`; none if the value depends on more."""
        try:
            return [(r, self.value(e, r)) for r in ranks]
        except (ir.Unknown, ZeroDivisionError):
            return []


_COMPARE = {"eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
            "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b}


def holds(ev: RankEval, e: ir.Expr, rank: int) -> bool | None:
    """Whether condition `e` holds in the CTA of `rank`; None when that depends on more."""
    if isinstance(e, ir.Compare):
        try:
            return bool(_COMPARE[e.op](ev.value(e.a, rank), ev.value(e.b, rank)))
        except (ir.Unknown, ZeroDivisionError):
            return None
    if isinstance(e, ir.Unary) and e.op == "not":
        x = holds(ev, e.x, rank)
        return None if x is None else not x
    if isinstance(e, ir.Binary) and e.op in ("and", "or"):
        a, b = holds(ev, e.a, rank), holds(ev, e.b, rank)
        if e.op == "and":
            return False if False in (a, b) else (None if None in (a, b) else True)
        return True if True in (a, b) else (None if None in (a, b) else False)
    if isinstance(e, ir.Var) and e.name in ev.env:
        return holds(ev, ev.env[e.name], rank)
    return None
