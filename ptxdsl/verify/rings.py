"""Rings of stage barriers: indices inside their arrays, and stage and parity that rotate
together.

A ring is a barrier array of N stages (and buffers whose outer dimension is the stage) that a
loop walks through: iteration after iteration the stage index moves on, and the parity a
waiter asks for flips each time the index wraps around. Both are read from the loops run
iteration by iteration (`unroll`), from the values of the trace, and from the value ranges
of `absint`; an index whose range is only bounded by a type or a run-time value is left
alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import ir
from ..errors import Note
from . import absint
from .effects import bar, effect
from .facts import Facts, Report, text
from .threads import BarRef, SmemRef, Visit
from .unroll import Iteration
from .values import Val


def _declared(d: ir.BarrierDecl) -> Note:
    return Note(f"'{d.name}' is declared here with {d.n} barriers", d.loc)


def _stages_declared(d: ir.SharedDecl) -> Note:
    return Note(f"'{d.name}' is declared here with {d.shape[0]} stages (shape "
                f"{list(d.shape)})", d.loc)


def unrolled(facts: Facts) -> dict[int, list[Iteration]]:
    """The ring loops run iteration by iteration (see `Unroller.rings`)."""
    return facts.unroller.rings()


# ----------------------------------------------------------------------------- indices


def _loop_var_text(loop: ir.Stmt, it: Iteration) -> str:
    if isinstance(loop, ir.For) and it.var is not None and isinstance(it.var.known, int):
        return f" ({loop.var} = {it.var.known})"
    return ""


@dataclass
class _Index:
    """One index operand: into a barrier array, or into the stage (outer) dimension of a
    shared buffer. The words of a report are made only when one is due."""

    ref: BarRef | SmemRef
    val: Val
    size: int

    @property
    def expr(self) -> ir.Expr:
        """The index expression."""
        return _stage(self.ref.expr)

    @property
    def key(self) -> tuple[str, ir.Expr]:
        return self.ref.decl.name, self.expr

    @property
    def what(self) -> str:
        kind = "index" if isinstance(self.ref, BarRef) else "stage index"
        return f"the {kind} of '{text(self.ref.expr)}'"

    @property
    def has(self) -> str:
        unit = "barriers" if isinstance(self.ref, BarRef) else "stages"
        return f"'{self.ref.decl.name}' has {self.size} {unit}"

    @property
    def note(self) -> Note:
        d = self.ref.decl
        return _declared(d) if isinstance(d, ir.BarrierDecl) else _stages_declared(d)


def _indices(v: Visit) -> list[_Index]:
    out: list[_Index] = []
    for arg in v.args.values():
        if isinstance(arg, BarRef):
            if arg.index is not None and arg.decl.n and \
                    not any(x.ref is arg for x in out):
                out.append(_Index(arg, arg.index, arg.decl.n))
        elif isinstance(arg, SmemRef) and len(arg.decl.shape) >= 2 and arg.indices and \
                "." not in arg.decl.name:
            out.append(_Index(arg, arg.indices[0], arg.decl.shape[0]))
    return out


def check_indices(facts: Facts, out: Report) -> None:
    """An index into a barrier array, or into the stage dimension of a shared buffer, that
    can leave the array: known values and unrolled iterations decide (an error when the
    iteration certainly runs), a bounded range warns."""
    done: set[tuple[str, ir.Expr]] = set()
    for loop_its in unrolled(facts).values():
        for it in loop_its:
            for v in it.visits:
                for idx in _indices(v):
                    bad = _outside(idx.val, v, idx.size)
                    if bad is None or idx.key in done:
                        continue
                    done.add(idx.key)
                    loop = v.loops[-1] if v.loops else None
                    where = f" in iteration {it.number}{_loop_var_text(loop, it)}" \
                        if loop is not None else ""
                    msg = f"{idx.what} reaches {bad}{where}; {idx.has}"
                    if it.sure:
                        out.error(msg, v.stmt.loc, idx.note)
                    else:
                        out.warning(msg + " (if the loop runs that long)", v.stmt.loc, idx.note)
    for v in facts.trace.visits:
        for idx in _indices(v):
            val = idx.val
            bad = _outside(val, v, idx.size)
            if bad is not None and idx.key not in done:
                done.add(idx.key)
                out.error(f"{idx.what} can reach {bad}; {idx.has}", v.stmt.loc, idx.note)
                continue
            if val.known is not None or val.rng is None or idx.key in done:
                continue
            r = val.range
            if not (r.small and (r.lo < 0 or r.hi >= idx.size)):  # type: ignore[operator]
                continue
            if r == absint.typed(absint.TOP, idx.expr.type):
                continue  # bounded by its type only: nothing is known
            if _guarded(v, idx.expr):
                continue  # a condition around it may keep the index in range
            done.add(idx.key)
            if r.lo is not None and r.hi is not None:
                reach = r.hi if r.hi >= idx.size else r.lo
                out.warning(f"{idx.what} may reach {reach} (the analysis bounds it to "
                            f"{r.lo}..{r.hi}); {idx.has}", v.stmt.loc, idx.note)


def _stage(e: ir.Expr) -> ir.Expr:
    while isinstance(e, ir.Index) and isinstance(e.base, ir.Index):
        e = e.base
    return e.indices[0] if isinstance(e, ir.Index) and e.indices else e


def _guarded(v: Visit, index: ir.Expr) -> bool:
    names = ir.free_names(index)
    return any(ir.free_names(g) & names for g in v.guards)


def _outside(val: Val, v: Visit, size: int) -> int | None:
    k = val.known
    if isinstance(k, int):
        return None if 0 <= k < size else k
    vals = val.values(v.may)
    if vals is None or vals.size == 0:
        return None
    bad = vals[(vals < 0) | (vals >= size)]
    return int(bad.max()) if bad.size else None


# ----------------------------------------------------------------------------- phases


@dataclass
class _Use:
    iteration: Iteration
    visit: Visit
    element: int
    parity: int


def _uniform(val: object, v: Visit) -> int | None:
    vals = val.values(v.must if v.must.any() else v.may) if val is not None else None  # type: ignore[attr-defined]
    if vals is None or vals.size == 0 or (vals != vals[0]).any():
        return None
    return int(vals[0])


def check_ring_phases(facts: Facts, out: Report) -> None:
    """The waits of a loop on a barrier array, iteration after iteration: the k-th wait on
    each barrier asks for the parity of its k-th phase in one ring, that is, the parity
    flips exactly when the stage index wraps around."""
    if facts.asm_barriers:
        return
    for its in unrolled(facts).values():
        uses: dict[str, list[_Use]] = {}
        broken: set[str] = set()
        for it in its:
            for v in it.visits:
                e = effect(v.stmt)
                b = bar(v, e.wait)
                if b is None or b.index is None or not b.decl.n or not v.loops:
                    continue
                el = _uniform(b.index, v)
                par = _uniform(v.args.get(e.parity or ""), v)
                # A wait some iterations skip would not count the phases that pass meanwhile.
                if el is None or par is None or not 0 <= el < b.decl.n or not v.certain:
                    broken.add(b.decl.name)
                    continue
                uses.setdefault(b.decl.name, []).append(_Use(it, v, el, par & 1))
        for name, seq in uses.items():
            if name not in broken:
                _check_ring(seq, out)


def _check_ring(seq: list[_Use], out: Report) -> None:
    # One wait per barrier and iteration (two sites waiting on the same phase count once).
    per: dict[tuple[int, int], set[int]] = {}
    for u in seq:
        per.setdefault((u.iteration.number, u.element), set()).add(u.parity)
    if any(len(p) > 1 for p in per.values()):
        return  # several phases of one barrier per iteration: not a ring of one wait each
    if len({u.parity for u in seq}) == 1:
        return  # a parity that never flips: check_waits reports it
    first = seq[0]
    count: dict[int, int] = {}
    seen: set[tuple[int, int]] = set()
    for u in seq:
        key = (u.iteration.number, u.element)
        if key in seen:
            continue
        seen.add(key)
        k = count.get(u.element, 0)
        count[u.element] = k + 1
        wrapped = 1 if u.element < first.element else 0
        want = first.parity ^ (k & 1) ^ wrapped
        if u.parity == want:
            continue
        b = bar(u.visit, effect(u.visit.stmt).wait)
        assert b is not None
        d = b.decl
        loop = u.visit.loops[-1]
        nth = {0: "first", 1: "second", 2: "third"}.get(k, f"{k + 1}th")
        notes = [_declared(d)]
        if first.visit.stmt is not u.visit.stmt:
            notes.insert(0, Note(f"the ring starts here, in iteration {first.iteration.number}",
                                 first.visit.stmt.loc))
        out.error(f"mbarrier_wait on '{text(b.expr)}' waits on '{d.name}[{u.element}]' for "
                  f"parity {u.parity} in iteration {u.iteration.number}"
                  f"{_loop_var_text(loop, u.iteration)}, its {nth} wait there; in a ring of "
                  f"{d.n} stages that starts at '{d.name}[{first.element}]' with parity "
                  f"{first.parity}, that phase has parity {want}: the stage index and the "
                  "parity do not follow the same ring (the parity must flip each time the "
                  "stage index wraps around)", u.visit.stmt.loc, *notes)
        return
