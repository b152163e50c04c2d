"""mbarrier checks: arrival counts, waits that cannot return, initialisation made visible
before use, stage barriers that do not rotate with their buffers (expect_tx bytes:
`expect_tx.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from .. import ir
from ..errors import Note, Span
from .effects import bar, effect, issuers, op_name, smem, val
from .facts import Facts, Report, text
from .threads import BarRef, Visit
from .values import Evaluator

_FOLD = Evaluator((1, 1, 1))


def constant(e: ir.Expr | None) -> int | None:
    """The value of an expression made of constants, if it is one."""
    if e is None:
        return None
    v = _FOLD.ev(e, {}, np.ones(1, dtype=bool), np.ones(1, dtype=bool))
    return v.known if isinstance(v.known, int) else None


def _label(b: BarRef, element: int | None = None) -> str:
    if b.index is None:
        return b.decl.name
    if element is not None:
        return f"{b.decl.name}[{element}]"
    return text(b.expr)


def _declared(d: ir.BarrierDecl) -> Note:
    return Note(f"'{d.name}' is declared here with count {d.count}", d.loc)


# ----------------------------------------------------------------------------- arrivals


def _init_count(facts: Facts, d: ir.BarrierDecl) -> tuple[int | None, Note]:
    counts = set()
    note = _declared(d)
    for v in facts.trace.visits:
        e = effect(v.stmt)
        b = bar(v, e.init)
        if b is None or b.decl is not d:
            continue
        c = val(v, e.count)
        if c is None:
            counts.add(d.count)
        else:
            k = c.known
            if not isinstance(k, int):
                return None, note
            counts.add(k)
            note = Note(f"'{d.name}' is initialised here with count {k}", v.stmt.loc)
    if len(counts) > 1:
        return None, note
    return (counts.pop() if counts else d.count), note


def many_arrivers(v: Visit, n: int) -> bool:
    """An arrive meant for one thread issued by every thread (reported by check_issuers)."""
    return effect(v.stmt).one_thread and issuers(v) == n > 1


@dataclass
class _Site:
    visit: Visit
    threads: int
    arrivals: int  # per thread
    elements: np.ndarray | None  # element per thread (of the must set); None: one, unknown

    @property
    def total(self) -> int:
        return self.threads * self.arrivals


def check_arrival_counts(facts: Facts, out: Report) -> None:
    """Threads arriving on a barrier in one phase (one arrive per loop iteration) = count."""
    if facts.asm_barriers:
        return
    sites: dict[str, list[Visit]] = {}
    for v in facts.trace.visits:
        b = bar(v, effect(v.stmt).arrive)
        if b is not None and v.counted:
            sites.setdefault(b.decl.name, []).append(v)
    for visits in sites.values():
        b0 = bar(visits[0], effect(visits[0].stmt).arrive)
        assert b0 is not None
        _arrivals_of(facts, b0.decl, visits, out)


def _arrivals_of(facts: Facts, d: ir.BarrierDecl, visits: list[Visit], out: Report) -> None:
    want, where = _init_count(facts, d)
    if want is None:
        return
    sites: list[_Site] = []
    for v in visits:
        if not v.certain or many_arrivers(v, facts.n):
            return
        e = effect(v.stmt)
        b = bar(v, e.arrive)
        count = val(v, e.count)
        per = 1 if count is None else count.known
        if not isinstance(per, int) or b is None:
            return
        idx = b.per_thread(facts.n)
        if idx is None and not (b.index is not None and b.index.is_uniform):
            return
        sites.append(_Site(v, issuers(v), per, None if idx is None else idx[v.must]))
    for one, other in combinations(sites, 2):
        if (one.visit.must & other.visit.must).any():
            return  # one thread arriving twice: one phase or two cannot be told apart
    floating = [s for s in sites if s.elements is None]
    if floating and len(floating) != len(sites):
        return
    if floating:
        # Each site hits one (unknown) element per iteration: several sites may share an
        # element or split the elements between them.
        sums = {sum(x.total for x in group) for r in range(1, len(floating) + 1)
                for group in combinations(floating, r)} if len(floating) <= 8 else {want}
        if want not in sums:
            _report_arrivals(floating, None, want, where, out)
        return
    per_element: dict[int, list[tuple[_Site, int]]] = {}
    for s in sites:
        assert s.elements is not None
        for el, k in zip(*np.unique(s.elements, return_counts=True), strict=True):
            per_element.setdefault(int(el), []).append((s, int(k)))
    for el, hits in sorted(per_element.items()):
        if sum(s.arrivals * k for s, k in hits) != want:
            parts = [_Site(s.visit, k, s.arrivals, None) for s, k in hits]
            _report_arrivals(parts, el if d.n else None, want, where, out)


def _report_arrivals(sites: list[_Site], element: int | None, want: int, where: Note,
                     out: Report) -> None:
    head = sites[0]
    b = bar(head.visit, effect(head.visit.stmt).arrive)
    assert b is not None
    label = _label(b, element)
    each = f" ({head.arrivals} arrivals each)" if head.arrivals != 1 else ""
    if len(sites) == 1:
        msg = (f"{head.threads} thread(s) arrive on '{label}' here in each phase{each}, but "
               f"its arrival count is {want}")
    else:
        total = sum(s.total for s in sites)
        msg = (f"'{label}' gets {total} arrivals in each phase ({head.total} here, "
               f"{total - head.total} at other sites), but its arrival count is {want}")
    notes = [Note(f"{s.total} more arrival(s) here", s.visit.stmt.loc) for s in sites[1:]]
    out.error(msg, head.visit.stmt.loc, *notes, where)


# ----------------------------------------------------------------------------- waits


def _sources(facts: Facts) -> list[tuple[Visit, BarRef]]:
    """Every arrive and every copy completion, with its barrier."""
    out = []
    for v in facts.trace.visits:
        e = effect(v.stmt)
        for role in (e.arrive, e.complete):
            b = bar(v, role)
            if b is not None:
                out.append((v, b))
    return out


def _hits(src: tuple[Visit, BarRef], d: ir.BarrierDecl, element: int) -> bool:
    v, b = src
    if b.decl is not d:
        return False
    els = b.elements(v.may)
    return els is None or element in els


@dataclass
class _Wait:
    visit: Visit
    bar: BarRef
    element: int
    sources: list[int] = field(default_factory=list)  # indices into the source list


def _parity_zero_waits(facts: Facts, sources: list[tuple[Visit, BarRef]]) -> list[_Wait]:
    """Waits that need a phase to complete in every thread that certainly runs them: parity
    known to be 0 (a fresh barrier passes parity 1 at once)."""
    out = []
    for v in facts.trace.of(ir.MBarrierWait):
        b = bar(v, effect(v.stmt).wait)
        par = val(v, effect(v.stmt).parity)
        if b is None or not v.must.any():
            continue
        vals = par.values(v.must) if par is not None else None
        els = b.elements(v.must)
        if vals is None or (vals != 0).any() or els is None or len(els) != 1:
            continue
        w = _Wait(v, b, els.pop())
        w.sources = [i for i, s in enumerate(sources) if _hits(s, b.decl, w.element)]
        if w.sources:
            out.append(w)
    return out


def check_waits(facts: Facts, out: Report) -> None:
    """Waits on a barrier nobody arrives on, and parity-0 waits whose every arrival can only
    come after the wait returns (the producer that forgot the `^ 1` on a fresh barrier)."""
    if facts.asm_barriers:
        return
    sources = _sources(facts)
    for v in facts.trace.of(ir.MBarrierWait):
        b = bar(v, effect(v.stmt).wait)
        if b is None:
            continue
        els = b.elements(v.may)
        if els is None:
            els = set(range(max(1, b.decl.n))) if not any(s[1].decl is b.decl for s in sources) \
                else set()
        par = val(v, effect(v.stmt).parity)
        pv = par.values(v.may) if par is not None else None
        passes_at_once = pv is not None and (pv == 1).all() and not v.loops
        for el in sorted(els):
            if not any(_hits(s, b.decl, el) for s in sources) and not passes_at_once:
                out.error(f"mbarrier_wait on '{_label(b, el if b.decl.n else None)}' can never "
                          "return: no thread arrives on it and no copy completes on it",
                          v.stmt.loc, _declared(b.decl))
                break
    _same_parity_waits(facts, sources, out)
    waits = _parity_zero_waits(facts, sources)
    stuck: list[_Wait] = []
    for w in waits:
        if any(x.visit.stmt is w.visit.stmt for x in stuck):
            continue
        blocked = _blocked_sources(w, waits, sources, facts.n)
        if all(i in blocked for i in w.sources):
            stuck.append(w)
    # In a cycle every wait is stuck; the one to blame waits on a barrier that only threads
    # arrive on (an "empty" barrier, which a fresh ring lets pass), not on one that copies fill.
    filled = {b.decl.name for v, b in sources if effect(v.stmt).complete}
    blame = [w for w in stuck if w.bar.decl.name not in filled] or stuck
    for w in blame:
        _report_deadlock(w, [sources[i][0] for i in w.sources],
                         w.bar.decl.name not in filled, out)


def _same_parity_waits(facts: Facts, sources: list[tuple[Visit, BarRef]], out: Report) -> None:
    """A loop that waits on the same barrier with the same parity every iteration while the
    barrier keeps completing phases: from the second round on the wait returns at once."""
    # Barriers that certainly get arrivals or copies in every iteration of some loop.
    repeating = {b.decl.name for v, b in sources
                 if v.loops and not v.first and v.certain and v.must.any()}
    for v in facts.trace.of(ir.MBarrierWait):
        b = bar(v, effect(v.stmt).wait)
        par = val(v, effect(v.stmt).parity)
        if b is None or par is None or v.first or not v.loops or \
                b.decl.name not in repeating:
            continue
        if par.varies or (b.index is not None and b.index.varies):
            continue
        pv = par.values(v.may)
        which = f"parity {int(pv[0])}" if pv is not None and (pv == pv[0]).all() else \
            "the same parity"
        out.error(f"mbarrier_wait on '{text(b.expr)}' waits for {which} in every iteration, "
                  f"but '{b.decl.name}' keeps completing phases: from the second round on the "
                  "wait returns before its phase completes; flip the parity after each phase",
                  v.stmt.loc, _declared(b.decl))


def _blocked_sources(start: _Wait, waits: list[_Wait], sources: list[tuple[Visit, BarRef]],
                     n: int) -> set[int]:
    """Sources that cannot happen before `start` returns: those run only by threads already
    past `start` or past a wait whose own sources are all blocked (to a fixpoint)."""
    at_source: dict[int, list[int]] = {}
    for i, (v, _) in enumerate(sources):
        at_source.setdefault(v.index, []).append(i)
    at_wait = {w.visit.index: w for w in waits}
    order = sorted(set(at_source) | set(at_wait))
    visits = {v.index: v for v, _ in sources} | {w.visit.index: w.visit for w in waits}
    blocked_src: set[int] = set()
    while True:
        stuck = np.zeros(n, dtype=bool)  # threads that cannot get past a blocked point
        found: set[int] = set()
        for idx in order:
            v = visits[idx]
            if idx == start.visit.index:
                stuck = stuck | v.must
                continue
            if idx in at_source and not (v.may & ~stuck).any():
                found.update(at_source[idx])
            w = at_wait.get(idx)
            if w is not None and all(i in blocked_src for i in w.sources):
                stuck = stuck | v.must
        if found == blocked_src:
            return found
        blocked_src = found


def _report_deadlock(w: _Wait, later: list[Visit], released_by_threads: bool,
                     out: Report) -> None:
    label = _label(w.bar, w.element if w.bar.decl.n else None)
    hint = ""
    if w.visit.loops and released_by_threads:
        hint = ("; a fresh mbarrier passes a parity-1 wait at once, so a producer waiting for "
                "free stages starts at parity 1 ('^ 1')")
    notes: list[Note] = []
    seen: set[int] = set()
    for v in later:
        if id(v.stmt) in seen or len(notes) == 3:
            continue
        seen.add(id(v.stmt))
        what = "arrives on" if effect(v.stmt).arrive else "completes on"
        notes.append(Note(f"{op_name(v.stmt)} {what} '{w.bar.decl.name}' here, but only after "
                          "that wait returns", v.stmt.loc))
    out.error(f"mbarrier_wait on '{label}' for parity 0 can never return: every arrival on "
              f"'{w.bar.decl.name}' comes after this wait{hint}", w.visit.stmt.loc, *notes)


# ----------------------------------------------------------------------------- init


@dataclass
class _Init:
    visit: Visit
    fence: Visit | None = None
    synced: bool = False  # a CTA-wide barrier after the fence
    any_sync: bool = False  # a CTA-wide barrier after the init


def is_cta_sync(v: Visit, n: int) -> bool:
    s = v.stmt
    if effect(s).cluster_wait:  # every thread of the cluster
        return True
    if not isinstance(s, ir.BarSync):
        return False
    cnt = v.args.get("nthreads")
    return cnt is None or getattr(cnt, "known", None) == n


def check_init_visibility(facts: Facts, out: Report) -> None:
    """mbarrier_init, then fence_mbarrier_init() and bar_sync(0), before any other thread
    (or a copy) uses the barrier."""
    if facts.asm_barriers:
        return
    visits = facts.trace.visits
    state: dict[tuple[str, int], _Init] = {}
    done: set[tuple[str, str]] = set()  # (barrier, kind of problem): each reported once
    for v in visits:
        e = effect(v.stmt)
        ib = bar(v, e.init)
        if ib is not None:
            for el in ib.elements(v.may) or range(max(1, ib.decl.n)):
                state[(ib.decl.name, el)] = _Init(v)
            continue
        if isinstance(v.stmt, ir.FenceMBarrierInit):
            for st in state.values():
                if st.fence is None and (st.visit.may & v.may).any():
                    st.fence = v
            continue
        if is_cta_sync(v, facts.n):
            for st in state.values():
                st.synced = st.synced or st.fence is not None
                st.any_sync = True
            continue
        for role in e.barrier_fields:
            b = bar(v, role)
            if b is None:
                continue
            els = b.elements(v.may)
            for el in sorted(els) if els is not None else range(max(1, b.decl.n)):
                if not 0 <= el < max(1, b.decl.n):
                    continue  # past the array: check_indices reports it
                problem = _init_problem(facts, v, b, el, state.get((b.decl.name, el)),
                                        role == e.complete)
                if problem is not None and (b.decl.name, problem[0]) not in done:
                    done.add((b.decl.name, problem[0]))
                    _, message, span, notes = problem
                    out.error(message, span, *notes)
                    break


def _init_problem(facts: Facts, v: Visit, b: BarRef, el: int, st: _Init | None,
                  by_copy: bool) -> tuple[str, str, Span | None, tuple[Note, ...]] | None:
    """(kind, message, span, notes) of a use of barrier element `el` that its
    initialisation does not reach, or None."""
    name = b.decl.name if not b.decl.n else f"{b.decl.name}[{el}]"
    used = f"mbarrier '{name}' is used here"
    if st is None:
        later = [x for x in facts.trace.visits if x.index > v.index and
                 (ib := bar(x, effect(x.stmt).init)) is not None and ib.decl is b.decl]
        if later:
            return ("early", f"{used} before it is initialised", v.stmt.loc,
                    (Note(f"'{name}' is initialised here", later[0].stmt.loc),))
        return ("never", f"{used} but never initialised (mbarrier_init)", v.stmt.loc,
                (_declared(b.decl),))
    others = bool((v.may & ~st.visit.may).any())
    init_note = Note(f"'{name}' is initialised here", st.visit.stmt.loc)
    if st.fence is None and others and not st.any_sync:
        return ("unpublished", f"{used} by other threads before fence_mbarrier_init() and a "
                "bar_sync(0) publish its initialisation", v.stmt.loc, (init_note,))
    if st.fence is None and (others or by_copy):
        return ("unfenced", f"{used} before fence_mbarrier_init() publishes its "
                "initialisation", v.stmt.loc, (init_note,))
    if st.fence is not None and not st.synced and others:
        return ("unsynced", f"{used} by other threads before a bar_sync(0) makes its "
                "initialisation visible", v.stmt.loc,
                (init_note, Note("fenced here", st.fence.stmt.loc)))
    return None


# ----------------------------------------------------------------------------- stages


def check_stage_rotation(facts: Facts, out: Report) -> None:
    """In a ring (a buffer whose outer dimension is the stage, one barrier per stage), the
    copy's stage and its barrier rotate together: one fixed while the other changes every
    iteration means consumers of a stage wait on another stage's barrier."""
    if facts.asm_barriers:
        return
    for v in facts.trace.visits:
        e = effect(v.stmt)
        b = bar(v, e.complete)
        dst = smem(v, e.async_write)
        if b is None or b.index is None or dst is None or not dst.indices or not v.loops:
            continue
        if len(dst.decl.shape) < 2 or dst.decl.shape[0] != b.decl.n:
            continue
        stage = dst.indices[0]
        op = op_name(v.stmt)
        if stage.varies and not b.index.varies:
            els = b.elements(v.may)
            if els is None or len(els) != 1:
                continue
            out.error(f"{op} fills stage '{text(dst.expr)}', which changes every iteration, but "
                      f"always completes on '{b.decl.name}[{els.pop()}]' of {b.decl.n} stage "
                      "barriers; index the barrier with the stage", v.stmt.loc, _declared(b.decl))
        elif b.index.varies and not stage.varies and isinstance(stage.known, int):
            out.error(f"{op} always fills stage {stage.known} of '{dst.decl.name}', but completes "
                      f"on '{text(b.expr)}', which changes every iteration; index the buffer "
                      "with the stage of the barrier", v.stmt.loc, _declared(b.decl))
