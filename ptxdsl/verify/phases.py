"""Waits that return at once: the parity of a phase the barrier has already completed.

The k-th phase of a barrier (from 0) has parity k & 1, and a wait for the parity of a
phase already complete (a fresh barrier's "previous" phase, parity 1, or one step behind the
phases the copies complete) returns without waiting. For a
barrier that copies complete on, the k-th wait of a thread on one barrier must ask for
parity k & 1; when it asks for the other one and the thread then reads what the copies
deliver, the read is unordered with the copy. Waits are counted per thread and barrier
element in program order: outside loops from the trace, inside a loop from its iterations
run one by one (`unroll`), when nothing waited on the barrier before the loop. Pipelines are
left out: their phases are derived.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import ir
from .. import types as T
from ..errors import Note
from .effects import bar, effect, op_name, smem, val
from .facts import Facts, Report, text
from .remote import root
from .threads import Visit


@dataclass
class _Filled:
    """A barrier that copies complete on: the buffers they fill and one copy for notes."""

    buffers: set[str]
    copy: ir.Stmt


def _filled(facts: Facts) -> dict[str, _Filled]:
    out: dict[str, _Filled] = {}
    for v in facts.trace.visits:
        e = effect(v.stmt)
        b, dst = bar(v, e.complete), smem(v, e.async_write)
        if b is None or dst is None or "." in b.decl.name:
            continue
        out.setdefault(b.decl.name, _Filled(set(), v.stmt)).buffers.add(dst.decl.name)
    return out


def _reads(x: object, names: set[str]) -> bool:
    """Whether an expression loads from one of the buffers."""
    if isinstance(x, tuple):
        return any(_reads(y, names) for y in x)
    if not isinstance(x, ir.Node):
        return False
    if isinstance(x, ir.Load):
        return root(x.ref) in names
    return any(_reads(getattr(x, f), names) for f in ir.node_fields(x))


def _read_after(facts: Facts, w: Visit, names: set[str]) -> ir.Stmt | None:
    """A statement after wait `w`, in program order, that reads one of the buffers."""
    stmts = facts.statements
    at = next(i for i, s in enumerate(stmts) if s is w.stmt)  # equal statements may repeat
    for s in stmts[at + 1:]:
        if isinstance(s, ir.MBarrierWait):
            continue
        dst = effect(s).async_write
        for f in ir.node_fields(s):
            x = getattr(s, f)
            if f != dst and (_reads(x, names) or isinstance(s, ir.Op) and
                             isinstance(x, ir.Expr) and isinstance(x.type, T.SharedRef) and
                             root(x) in names):
                return s
    return None


def _uniform(x: object, mask: np.ndarray) -> int | None:
    vals = x.values(mask) if x is not None else None  # type: ignore[attr-defined]
    if vals is None or vals.size == 0 or (vals != vals[0]).any():
        return None
    return int(vals[0])


@dataclass
class _Wait:
    visit: Visit  # the visit with the operands of this wait (an iteration's, in a loop)
    site: Visit  # the trace's visit of the statement (its threads and place in the body)
    element: int
    parity: int
    iteration: str  # " in iteration 2 (t = 2)" inside a loop


def _sequence(facts: Facts, filled: dict[str, _Filled]) -> dict[tuple[str, int], list[_Wait]]:
    """The waits on each element of each filled barrier, in the order a thread runs them."""
    seqs: dict[tuple[str, int], list[_Wait]] = {}
    done_loops: set[int] = set()
    for v in facts.trace.visits:
        if not isinstance(v.stmt, ir.MBarrierWait) or not v.certain:
            continue
        b = bar(v, "bar")
        if b is None or b.decl.name not in filled:
            continue
        if not v.loops:
            el, par = _uniform(b.index, v.must) if b.index is not None else 0, \
                _uniform(val(v, "parity"), v.must)
            if el is not None and par is not None:
                seqs.setdefault((b.decl.name, el), []).append(_Wait(v, v, el, par & 1, ""))
            continue
        loop = v.loops[-1]
        if id(loop) in done_loops or not isinstance(loop, (ir.For, ir.While)):
            continue
        done_loops.add(id(loop))
        n = max(2 * max(b.decl.n, 1) + 2, 4)
        sites = {id(x.stmt): x for x in facts.trace.visits if x.loops and x.loops[-1] is loop}
        for it in facts.unroller.iterations(loop, n):
            for x in it.visits:
                xb = bar(x, "bar")
                site = sites.get(id(x.stmt))
                if not isinstance(x.stmt, ir.MBarrierWait) or xb is None or site is None or \
                        xb.decl.name not in filled:
                    continue
                el = _uniform(xb.index, x.must) if xb.index is not None else 0
                par = _uniform(val(x, "parity"), x.must)
                if el is None or par is None:
                    seqs.setdefault((xb.decl.name, -1), [])  # not decided: drop the barrier
                    continue
                where = f" in iteration {it.number}"
                if isinstance(loop, ir.For) and it.var is not None and \
                        isinstance(it.var.known, int):
                    where += f" ({loop.var} = {it.var.known})"
                seqs.setdefault((xb.decl.name, el), []).append(
                    _Wait(x, site, el, par & 1, where))
    undecided = {name for name, el in seqs if el == -1}
    return {key: ws for key, ws in seqs.items() if key[0] not in undecided}


def check_early_waits(facts: Facts, out: Report) -> None:
    """A wait for a phase that is already complete, followed by a read of what the copies
    completing on that barrier deliver."""
    if facts.asm_barriers:
        return
    filled = _filled(facts)
    if not filled:
        return
    late: dict[str, list[tuple[_Wait, int]]] = {}  # per barrier: (wait, its phase)
    for (name, _), waits in _sequence(facts, filled).items():
        count = np.zeros(facts.n, dtype=np.int64)  # waits each thread has done so far
        for w in waits:
            ks = count[w.site.must]
            count[w.site.must] += 1
            if ks.size == 0 or (ks != ks[0]).any():
                late.setdefault(name, []).append((w, -1))  # threads at different phases
                break
            late.setdefault(name, []).append((w, int(ks[0])))
    for name, seq in late.items():
        wrong = [(w, k) for w, k in seq if k >= 0 and w.parity != k & 1]
        if not wrong or any(k < 0 for _, k in seq):
            continue
        # In a loop, parities that do not rotate with the stage are check_ring_phases'; a
        # ring one phase behind throughout is this check's.
        if any(w.iteration for w, _ in seq) and len(wrong) < len(seq):
            continue
        for w, k in wrong:
            read = _read_after(facts, w.site, filled[name].buffers)
            if read is None:
                continue
            f = filled[name]
            b = bar(w.visit, "bar")
            assert b is not None
            label = f"{name}[{w.element}]" if b.decl.n else name
            done = "the phase before the first, which a fresh barrier counts as complete" \
                if k == 0 else f"phase {k - 1}, already complete"
            out.error(f"mbarrier_wait on '{text(b.expr)}' asks for parity {w.parity}{w.iteration}, "
                      f"but it is this thread's wait number {k + 1} on '{label}', for phase {k} "
                      f"(parity {k & 1}); parity {w.parity} names {done}, so the wait returns at "
                      f"once and the read after it is unordered with the {op_name(f.copy)} that "
                      f"fills '{sorted(f.buffers)[0]}'", w.site.stmt.loc,
                      Note("the read that may see the data before it lands is here", read.loc),
                      Note(f"the {op_name(f.copy)} completes on '{name}' here", f.copy.loc))
            break

