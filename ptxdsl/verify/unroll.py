"""Loops run iteration by iteration, for what the widened trace cannot tell.

The trace runs a loop body as its first iteration and one generic iteration, where every
variable the body changes is widened. A ring's stage index and parity change every
iteration in a pattern that widening loses, but that a few concrete iterations show: this
module re-runs a loop body from the state in which the trace first reached the loop, one
iteration after another, with the loop variable known when its start and step are. Only the
slice of the body that barrier operations depend on is run (their operands, the variables
those are computed from, the branches around them), which keeps it cheap.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .. import ir
from .effects import bar, effect
from .threads import Interpreter, Trace, Visit, _Flow, _trips
from .values import Val, top


@dataclass
class Iteration:
    number: int
    visits: list[Visit]
    sure: bool  # every thread that reached the loop runs this iteration
    var: Val | None  # the loop variable


def _is_barrier_op(s: ir.Stmt) -> bool:
    return bool(effect(s).barrier_fields)


def _slice(stmts: tuple[ir.Stmt, ...], need: set[str], keep=_is_barrier_op
           ) -> tuple[ir.Stmt, ...]:
    out: list[ir.Stmt] = []
    for s in stmts:
        if isinstance(s, (ir.Let, ir.Assign)):
            if s.name in need:
                out.append(s)
                if s.value is not None:
                    need |= ir.free_names(s.value)
        elif isinstance(s, ir.Asm) and need & set(s.outs):
            out.append(s)
        elif isinstance(s, ir.Return) or keep(s):
            out.append(s)
            need |= ir.free_names(s)
        elif ir.blocks(s):
            names = [f for f in s.__dataclass_fields__  # type: ignore[attr-defined]
                     if isinstance(getattr(s, f), tuple) and getattr(s, f) and
                     isinstance(getattr(s, f)[0], ir.Stmt)]
            parts = {f: _slice(getattr(s, f), need, keep) for f in names}
            if any(parts.values()):
                out.append(replace(s, **parts))  # type: ignore[arg-type]
                need |= ir.free_names(s)
    return tuple(out)


def ring_slice(body: tuple[ir.Stmt, ...], keep=_is_barrier_op) -> tuple[ir.Stmt, ...]:
    """The statements of `body` that barrier operations (or those `keep` selects) need, to a
    fixpoint."""
    need: set[str] = set()
    while True:
        before = set(need)
        sliced = _slice(body, need, keep)
        if need == before:
            return sliced


MAX_STAGES = 16  # rings larger than this are unrolled for this many stages only


class Unroller:
    def __init__(self, trace: Trace):
        self.trace = trace
        self.interp: Interpreter = trace.interp
        self._slices: dict[tuple[int, object], tuple[ir.Stmt, ...]] = {}
        self._rings: dict[int, list[Iteration]] | None = None

    def ring_loops(self) -> list[ir.For | ir.While]:
        """Innermost loops with a barrier operation whose array index changes per iteration.
        Rings of `pipeline` declarations (their names have a dot, which no user name has)
        are left out: the compiler derives their stage and phase."""
        out: dict[int, ir.For | ir.While] = {}
        for v in self.trace.visits:
            if v.first or not v.loops:
                continue
            e = effect(v.stmt)
            if any((b := bar(v, r)) is not None and b.index is not None and b.index.varies
                   and "." not in b.decl.name for r in e.barrier_fields):
                loop = v.loops[-1]
                if isinstance(loop, (ir.For, ir.While)):
                    out.setdefault(id(loop), loop)
        return list(out.values())

    def rings(self) -> dict[int, list[Iteration]]:
        """The ring loops (by id), each run for two full turns of the largest ring."""
        if self._rings is None:
            k = self.interp.k
            n = max((d.n for d in k.body if isinstance(d, ir.BarrierDecl)), default=1)
            turns = 2 * min(max(n, 1), MAX_STAGES) + 2
            self._rings = {id(loop): self.iterations(loop, turns) for loop in self.ring_loops()}
        return self._rings

    def iterations(self, loop: ir.For | ir.While, count: int, keep=_is_barrier_op
                   ) -> list[Iteration]:
        """Up to `count` iterations of `loop` from the state it was first reached in (none
        if the trace never reached it), running the statements `keep` selects and what they
        need."""
        entry = self.interp.entries.get(id(loop))
        if entry is None:
            return []
        it = self.interp
        body = self._slices.get((id(loop), keep))
        if body is None:
            body = self._slices[(id(loop), keep)] = ring_slice(loop.body, keep)
        f = entry.flow
        flow = _Flow(f.must, f.may, dict(f.env), dict(f.live))
        mode = entry.mode.but(loops=entry.mode.loops + (loop,), counted=False)
        start = step = trips = None
        if isinstance(loop, ir.For):
            start, stop, step = (it.value(x, flow) for x in (loop.start, loop.stop, loop.step))
            trips = _trips(start, stop, step, it.n)
        saved = it.visits
        out: list[Iteration] = []
        try:
            for i in range(count):
                var: Val | None = None
                if isinstance(loop, ir.For):
                    assert start is not None and step is not None
                    if start.known is not None and isinstance(step.known, int):
                        var = Val(np.asarray(start.known) + i * step.known
                                  if not isinstance(start.known, int)
                                  else start.known + i * step.known, varies=True)
                    else:
                        var = top(uniform=start.is_uniform and step.is_uniform, varies=True)
                    enter = it.all if trips is None else trips > i
                    flow.env[loop.var], flow.live[loop.var] = var, flow.may
                else:
                    c = it.value(loop.cond, flow)
                    enter = it.all if c.known is None else \
                        np.broadcast_to(np.asarray(c.known) != 0, (it.n,))
                flow.must, flow.may = flow.must & enter, flow.may & enter
                if not flow.may.any():
                    break
                sure = trips is not None and bool((trips[f.may] > i).all())
                it.visits = []
                it.block(body, flow, mode.but(first=i == 0))
                out.append(Iteration(i, it.visits, sure, var))
        finally:
            it.visits = saved
        return out


def loops_of(body: tuple[ir.Stmt, ...]):
    """Every loop statement, nested ones included."""
    return [s for s in ir.walk(body) if isinstance(s, (ir.For, ir.While))]
