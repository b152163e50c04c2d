"""Happens-before inside a role: a stage is read after its wait and before its release, and
an mbarrier is invalidated only when nothing can still be pending on it.

A ring is found from its copies: a copy into `buf[x]` that completes on `full[x]`, where the
outer dimension of `buf` is the number of barriers of `full`. Its "empty" barriers are the
arrays of as many barriers that threads arrive on. The body of each role is then walked in
program order, keeping the stages waited for and released so far in the current iteration:
a fact is (barrier or buffer, index expression) and dies when a variable of the expression is
assigned; after a branch only what both sides established is waited for. A read of `buf[x]`
inside a loop that waits on `full` must come after a wait on `full[x]` in that iteration and
not after an arrive on `empty[x]`. Indices are compared as expressions: a read whose index
is not the index of a wait that precedes it stays silent, unless no wait on `full` at all
precedes it. Rings of `pipeline` declarations are left out: their stages can only be named
between `wait` and `release`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import ir
from .. import types as T
from ..errors import Note
from .barriers import is_cta_sync
from .effects import bar, effect, op_name, smem
from .facts import Facts, Report, text
from .remote import root
from .threads import Visit, _assigned


@dataclass(frozen=True)
class _Ring:
    buf: str
    full: str
    stages: int
    copy: ir.Stmt  # a copy into the ring, for the notes


def _rings(facts: Facts) -> dict[str, _Ring]:
    out: dict[str, _Ring] = {}
    for v in facts.trace.visits:
        e = effect(v.stmt)
        b, dst = bar(v, e.complete), smem(v, e.async_write)
        # A pipeline's stages (names with a dot) are only named between wait and release:
        # the frontend enforces the order these checks are about.
        if b is None or dst is None or b.index is None or not b.decl.n or "." in b.decl.name:
            continue
        if len(dst.decl.shape) >= 2 and dst.decl.shape[0] == b.decl.n:
            out.setdefault(dst.decl.name, _Ring(dst.decl.name, b.decl.name, b.decl.n, v.stmt))
    return out


def _stage_read(e: ir.Expr) -> tuple[str, ir.Expr, ir.Expr] | None:
    """(buffer, stage index, place) of a place into a multi-dimensional shared buffer."""
    place = e
    while isinstance(e, ir.Index) and isinstance(e.base, ir.Index):
        e = e.base
    if isinstance(e, ir.Index) and isinstance(e.base, ir.SharedBuf) and e.indices:
        return e.base.name, e.indices[0], place
    return None


def _shown(place: ir.Expr) -> str:
    """A place as written: a pipeline stage without the index the lowering added."""
    inner = place
    while isinstance(inner, ir.Index) and isinstance(inner.base, ir.Index):
        inner = inner.base
    if inner is not place and isinstance(inner, ir.Index) and len(inner.indices) == 1 and \
            isinstance(inner.indices[0], ir.Var) and "." in inner.indices[0].name:
        assert isinstance(place, ir.Index)
        return text(ir.Index(base=inner.base, indices=place.indices, type=place.type))
    return text(place)


def _reads(s: ir.Stmt, rings: dict[str, _Ring]) -> list[ir.Expr]:
    """Places of ring buffers a statement reads generically (loads) or hands to a
    shared-memory reader other than a copy's destination (a bulk store's source, a wgmma
    operand)."""
    out: list[ir.Expr] = []
    e = effect(s)
    reader = isinstance(s, ir.Op) and not e.barrier_fields
    for f in ir.node_fields(s):
        if f == e.async_write:
            continue
        x = getattr(s, f)
        if reader and isinstance(x, ir.Expr) and isinstance(x.type, T.SharedRef) and \
                _name(x) in rings:
            out.append(x)
        if isinstance(x, (ir.Node, tuple)):
            _loads(x, rings, out)
    return out


def _loads(x: object, rings: dict[str, _Ring], out: list[ir.Expr]) -> None:
    if isinstance(x, tuple):
        for y in x:
            _loads(y, rings, out)
        return
    if isinstance(x, ir.Load) and _name(x.ref) in rings:
        out.append(x.ref)
    if isinstance(x, ir.Node):
        for f in ir.node_fields(x):
            v = getattr(x, f)
            if isinstance(v, (ir.Node, tuple)):
                _loads(v, rings, out)


@dataclass
class _State:
    waited: dict[tuple[str, ir.Expr], ir.Stmt] = field(default_factory=dict)
    released: dict[tuple[str, ir.Expr], ir.Stmt] = field(default_factory=dict)
    # Waited for by some threads (under a branch): a barrier among the threads then orders
    # that wait before everything after it (one thread waits, bar_sync, all read).
    maybe: dict[tuple[str, ir.Expr], ir.Stmt] = field(default_factory=dict)

    def copy(self) -> _State:
        return _State(dict(self.waited), dict(self.released), dict(self.maybe))

    def kill(self, names: set[str]) -> None:
        for d in (self.waited, self.released, self.maybe):
            if d:
                for key in [k for k in d if _names_of(k[1]) & names]:
                    del d[key]


class _Walk:
    def __init__(self, facts: Facts, out: Report, rings: dict[str, _Ring]):
        self.out = out
        self.rings = rings
        self.fulls = {r.full: r for r in rings.values()}
        self.empties = _empties(facts, rings)
        self.loops: list[tuple[ir.Stmt, set[str]]] = []  # enclosing loops, fulls waited in
        self._waits_in: dict[int, set[str]] = {}

    def waits_in(self, body: tuple[ir.Stmt, ...]) -> set[str]:
        key = id(body)
        if key not in self._waits_in:
            self._waits_in[key] = {_name(s.bar) for s in ir.walk(body)  # type: ignore[attr-defined]
                                   if isinstance(s, ir.MBarrierWait)}
        return self._waits_in[key]

    def block(self, stmts: tuple[ir.Stmt, ...], st: _State) -> _State:
        for s in stmts:
            st = self.stmt(s, st)
        return st

    def stmt(self, s: ir.Stmt, st: _State) -> _State:
        # Only a read inside a loop that waits on a ring, or after a release, can be wrong.
        if st.released or any(fulls & self.fulls.keys() for _, fulls in self.loops):
            for place in _reads(s, self.rings):
                self.read(s, place, st)
        if isinstance(s, ir.MBarrierWait):
            idx = _index(s.bar)
            if idx is not None:
                st.waited[(_name(s.bar), idx)] = s
            else:
                st.waited[(_name(s.bar), ir.Const(value=-1, type=s.bar.type))] = s
        elif isinstance(s, ir.MBarrierArrive):
            idx = _index(s.bar)
            for r in self.empties.get(_name(s.bar), []):
                if idx is not None:
                    st.released[(r.buf, idx)] = s
        elif isinstance(s, (ir.BarSync, ir.RoleSync)):
            st.waited |= st.maybe
        elif isinstance(s, (ir.Let, ir.Assign, ir.SetElem)):
            st.kill({s.name})
        elif isinstance(s, ir.Asm):
            st.kill(set(s.outs))
        elif isinstance(s, ir.If):
            t = self.block(s.then, st.copy())
            e = self.block(s.orelse, st.copy())
            return _State({k: v for k, v in t.waited.items() if k in e.waited},
                          t.released | e.released, t.maybe | e.maybe | t.waited | e.waited)
        elif isinstance(s, (ir.For, ir.While)):
            names = _assigned(s.body) | ({s.var} if isinstance(s, ir.For) else set())
            st.kill(names)
            self.loops.append((s, self.waits_in(s.body)))
            inner = self.block(s.body, st.copy())
            self.loops.pop()
            inner.kill(names)
            return _State(st.waited, st.released | inner.released,
                          st.maybe | inner.maybe | inner.waited)
        else:
            for body in ir.blocks(s):
                st = self.block(body, st)
        return st

    def read(self, s: ir.Stmt, place: ir.Expr, st: _State) -> None:
        found = _stage_read(place)
        if found is None or found[0] not in self.rings:
            return
        name, idx, whole = found
        ring = self.rings[name]
        where = place.loc or s.loc
        rel = st.released.get((name, idx))
        if rel is not None:
            self.out.error(f"'{_shown(whole)}' is read after this thread released its stage "
                           f"({op_name(rel)} on '{text(rel.bar)}'): the producer may already "  # type: ignore[attr-defined]
                           "be refilling it", where,
                           Note("the stage is released here; release it after its last read",
                                rel.loc))
        if not any(ring.full in fulls for _, fulls in self.loops):
            return
        if (ring.full, idx) in st.waited or any(k[0] == ring.full for k in st.waited):
            return
        loop = next(lp for lp, fulls in reversed(self.loops) if ring.full in fulls)
        wait = next(x for x in ir.walk((loop,)) if isinstance(x, ir.MBarrierWait)
                    and _name(x.bar) == ring.full)
        self.out.error(f"'{_shown(whole)}' is read before this iteration waits on "
                       f"'{ring.full}' for its stage: the copy into '{name}' may still be "
                       "writing it", where,
                       Note(f"the wait on '{ring.full}' in this loop is here; no wait on "
                            f"'{ring.full}' precedes the read in the same iteration", wait.loc),
                       Note(f"the copy into '{name}' completes on '{ring.full}' here",
                            ring.copy.loc))


_NAMES: dict[int, tuple[ir.Expr, set[str]]] = {}


def _names_of(e: ir.Expr) -> set[str]:
    """free_names, remembered for the index expressions that facts are kept about."""
    hit = _NAMES.get(id(e))
    if hit is None or hit[0] is not e:
        if len(_NAMES) > 4096:
            _NAMES.clear()
        hit = _NAMES[id(e)] = (e, ir.free_names(e))
    return hit[1]


def _index(e: ir.Expr) -> ir.Expr | None:
    return e.indices[0] if isinstance(e, ir.Index) and e.indices else None


def _empties(facts: Facts, rings: dict[str, _Ring]) -> dict[str, list[_Ring]]:
    """The empty barriers of each ring: a barrier array of as many barriers that the threads
    issuing the ring's copies wait on before them, in the same loop."""
    out: dict[str, list[_Ring]] = {}
    waits: list[Visit] = []
    for v in facts.trace.visits:
        if isinstance(v.stmt, ir.MBarrierWait):
            waits.append(v)
            continue
        e = effect(v.stmt)
        dst = smem(v, e.async_write)
        ring = rings.get(dst.decl.name) if dst is not None else None
        if ring is None or not v.loops:
            continue
        for w in waits:
            b = bar(w, "bar")
            if b is not None and b.decl.n == ring.stages and b.decl.name != ring.full and \
                    w.loops and w.loops[-1] is v.loops[-1] and (w.may & v.may).any():
                group = out.setdefault(b.decl.name, [])
                if ring not in group:
                    group.append(ring)
    return out


def _name(e: ir.Expr) -> str:
    """The declared name under a place ("" if none)."""
    return root(e) or ""


def check_stage_order(facts: Facts, out: Report) -> None:
    """A stage read before the wait on its full barrier in the same iteration, or after
    the thread released it."""
    if facts.asm_barriers:
        return
    rings = _rings(facts)
    if rings:
        _Walk(facts, out, rings).block(facts.kernel.body, _State())


# ----------------------------------------------------------------------------- inval


def check_inval(facts: Facts, out: Report) -> None:
    """mbarrier_inval while a copy completing on the barrier, or another thread's wait on
    it, may still be pending."""
    if facts.asm_barriers:
        return
    visits = facts.trace.visits
    invals = [v for v in visits if isinstance(v.stmt, ir.MBarrierInval)]
    for v in invals:
        b = bar(v, "bar")
        if b is None:
            continue
        els = b.elements(v.may)
        before = [x for x in visits if x.index < v.index]
        for x in before:
            e = effect(x.stmt)
            for role in (e.complete, e.wait):
                xb = bar(x, role)
                if xb is None or xb.decl is not b.decl:
                    continue
                xe = xb.elements(x.may)
                if els is not None and xe is not None and not els & xe:
                    continue
                later = [y for y in before if y.index > x.index]
                if role == e.complete and not _waited(later, b.decl, v):
                    out.error(f"mbarrier_inval on '{text(b.expr)}' can run while the "
                              f"{op_name(x.stmt)} that completes on it may still be in flight: "
                              f"no wait on '{b.decl.name}' by this thread comes between",
                              v.stmt.loc, Note(f"{op_name(x.stmt)} completes on "
                                               f"'{b.decl.name}' here", x.stmt.loc))
                    return
                if role == e.wait and (x.may & ~v.may).any() and \
                        not any(is_cta_sync(y, facts.n) for y in later):
                    out.error(f"mbarrier_inval on '{text(b.expr)}' can run while other threads "
                              f"may still wait on '{b.decl.name}': no bar_sync(0) orders their "
                              "wait before the inval", v.stmt.loc,
                              Note(f"they wait on '{b.decl.name}' here", x.stmt.loc))
                    return


def _waited(later: list[Visit], d: ir.BarrierDecl, inval: Visit) -> bool:
    """A wait on `d` by the invalidating threads (or by anyone, then a CTA-wide barrier)."""
    for i, y in enumerate(later):
        yb = bar(y, effect(y.stmt).wait)
        if yb is None or yb.decl is not d:
            continue
        if not (inval.may & ~y.may).any():
            return True
        if any(is_cta_sync(z, len(inval.may)) for z in later[i + 1:]):
            return True
    return False
