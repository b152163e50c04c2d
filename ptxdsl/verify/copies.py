"""Checks on the async proxy and bulk groups: generic writes fenced before a bulk store reads
them, buffers not rewritten while a store reads them, stores waited for before exit, and
single-thread operations issued by many threads.

One pass over the trace in program order keeps, per thread, the state of every generic
shared-memory write (unfenced, fenced, published by a barrier) and of every bulk store
(uncommitted, in group g, read).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .. import ir
from ..errors import Note
from .effects import duplicated, effect, issuers, op_name, smem
from .facts import Facts, Report, text
from .remote import root
from .threads import BarRef, SmemRef, Visit

UNFENCED, FENCED, PUBLISHED = 0, 1, 2


def _span(ref: SmemRef, mask: np.ndarray, nbytes: int) -> tuple[int, int] | None:
    """The byte range of `ref` touched by the threads of `mask`, None if unknown."""
    vals = ref.offset.values(mask)
    if vals is None or vals.size == 0:
        return None
    return int(vals.min()), int(vals.max()) + nbytes


def _overlap(a: tuple[int, int] | None, b: tuple[int, int] | None) -> bool:
    return a is None or b is None or (a[0] < b[1] and b[0] < a[1])


@dataclass
class _Write:
    visit: Visit
    ref: SmemRef
    span: tuple[int, int] | None
    state: np.ndarray  # per thread; only writer threads matter
    fence: Visit | None = None


@dataclass
class _Store:
    visit: Visit
    ref: SmemRef
    span: tuple[int, int] | None
    group: np.ndarray  # per thread: -1 until bulk_commit() puts the store in a group
    done: np.ndarray  # per thread: the source has been read
    written: np.ndarray | None = None  # per thread: complete (bulk_wait, not _read)


def _store_nbytes(v: Visit, ref: SmemRef) -> int:
    e = effect(v.stmt)
    size = v.args.get(e.size) if e.size else None
    k = getattr(size, "known", None)
    return k if isinstance(k, int) else ref.nbytes


class _Scan:
    def __init__(self, facts: Facts, out: Report):
        self.n = facts.n
        self.facts = facts
        self.out = out
        self.writes: list[_Write] = []
        self.stores: list[_Store] = []
        self.committed = np.zeros(self.n, dtype=np.int64)

    def run(self) -> None:
        for v in self.facts.trace.visits:
            self.visit(v)
        self.exit(None, self.facts.trace.end_may)

    def visit(self, v: Visit) -> None:
        s, e = v.stmt, effect(v.stmt)
        if isinstance(s, ir.Store) and isinstance(v.args.get("ref"), SmemRef):
            ref = v.args["ref"]
            assert isinstance(ref, SmemRef)
            size = s.value.type.nbytes  # type: ignore[attr-defined]
            self.rewrite(v, ref, _span(ref, v.may, size))
            self.writes.append(_Write(v, ref, _span(ref, v.may, size),
                                      np.zeros(self.n, dtype=np.int8)))
        elif (dst := smem(v, e.async_write)) is not None:
            self.rewrite(v, dst, _span(dst, v.may, dst.nbytes))
        if isinstance(s, ir.FenceProxyAsync) or \
                isinstance(s, ir.Asm) and "fence.proxy.async" in s.template:
            for w in self.writes:
                sel = v.may & (w.state == UNFENCED) & w.visit.may
                if sel.any():
                    w.state = np.where(sel, FENCED, w.state).astype(np.int8)
                    w.fence = v
        if e.publishes:
            for w in self.writes:
                w.state = np.where(v.may & (w.state == FENCED), PUBLISHED, w.state).astype(np.int8)
        if isinstance(s, ir.ClusterReduce):
            self.reduced_into(v, root(s.dst))
        if (src := smem(v, e.async_read)) is not None:
            span = _span(src, v.may, _store_nbytes(v, src))
            self.read_by_async(v, src, span)
            self.stores.append(_Store(v, src, span, np.where(v.may, -1, -2),
                                      np.zeros(self.n, dtype=bool), np.zeros(self.n, dtype=bool)))
        if isinstance(s, ir.BulkCommit):
            for st in self.stores:
                sel = v.may & (st.group == -1)
                st.group = np.where(sel, self.committed, st.group)
            self.committed = self.committed + v.may
        if isinstance(s, (ir.BulkWait, ir.BulkWaitRead)):
            k = getattr(v.args.get("n"), "known", None)  # groups left in flight
            if isinstance(k, int):
                for st in self.stores:
                    waited = v.may & (st.group >= 0) & (st.group < self.committed - k)
                    st.done = st.done | waited
                    if isinstance(s, ir.BulkWait):
                        st.written = st.written | waited  # type: ignore[operator]
        for rel in self.facts.trace.interp.releases.get(id(s), ()):
            self.release(v, rel)
        if isinstance(s, ir.Return):
            self.exit(v, v.may)

    def release(self, v: Visit, rel: ir.Node) -> None:
        """A release (a semaphore increment, a flag store): the thread's bulk stores and
        reductions into global memory must be complete, or whoever acquires the value may
        read the memory before they land."""
        for st in self.stores:  # every one reads shared memory into global (its async_read)
            pending = v.may & (st.group >= -1) & ~st.written  # type: ignore[operator]
            if not pending.any():
                continue
            op = op_name(st.visit.stmt)
            what = rel.syntax if isinstance(rel, (ir.Atomic, ir.StoreRelease)) else "release"
            how = ("it is never committed" if (pending & (st.group == -1)).any() else
                   "bulk_wait_read() only waits for its source to be read")
            self.out.error(
                f"{what} releases a semaphore before the {op} issued by the same thread has "
                f"completed ({how}); run bulk_commit() and bulk_wait(0) before the release",
                rel.loc or v.stmt.loc,
                Note(f"the {op} is issued here", st.visit.stmt.loc))
            st.written = st.written | pending  # type: ignore[operator]

    def rewrite(self, v: Visit, ref: SmemRef, span: tuple[int, int] | None) -> None:
        """A write into `ref`: no bulk store may still be reading it."""
        for st in self.stores:
            reading = (st.group >= -1) & ~st.done
            # Only a known overlap counts: with a stage index unknown, the write may well go
            # to the other stage of a double buffer (one loop pass cannot tell).
            if st.ref.decl is ref.decl and reading.any() and span is not None and \
                    st.span is not None and _overlap(span, st.span):
                how = "generic store" if isinstance(v.stmt, ir.Store) else op_name(v.stmt)
                self.out.error(
                    f"'{ref.decl.name}' is rewritten here ({how}) while the "
                    f"{op_name(st.visit.stmt)} from it may still be reading it",
                    v.stmt.loc,
                    Note(f"{op_name(st.visit.stmt)} reads '{text(st.ref.expr)}' here; wait with "
                         "bulk_commit() and bulk_wait_read(0) before rewriting it",
                         st.visit.stmt.loc))

    def read_by_async(self, v: Visit, ref: SmemRef, span: tuple[int, int] | None) -> None:
        """A bulk store reads `ref`: its generic writers fenced (and, if another thread wrote,
        the fence came before the barrier that orders writer and reader)."""
        op = op_name(v.stmt)
        for w in self.writes:
            if w.ref.decl is not ref.decl or not _overlap(span, w.span):
                continue
            own = w.visit.may & v.may
            other = w.visit.may & ~v.may
            if (own & (w.state == UNFENCED)).any() or (other & (w.state == UNFENCED)).any():
                self.out.error(
                    f"{op} reads '{ref.decl.name}', written by generic stores with no "
                    "fence_proxy_async() in between", v.stmt.loc,
                    Note(f"'{text(w.ref.expr)}' is written here; every writing thread must run "
                         "fence_proxy_async() before the barrier that orders it with the "
                         "store", w.visit.stmt.loc))
            elif (other & (w.state == FENCED)).any():
                assert w.fence is not None
                self.out.error(
                    f"{op} reads '{ref.decl.name}', but the writers' fence_proxy_async() comes "
                    "after the barrier that orders them with this store", v.stmt.loc,
                    Note(f"'{text(w.ref.expr)}' is written here", w.visit.stmt.loc),
                    Note("fenced here: move the fence before the barrier", w.fence.stmt.loc))

    def reduced_into(self, v: Visit, name: str | None) -> None:
        """A reduction into a peer's `name` reads it there through the async proxy: the
        generic stores that initialised it (every CTA runs them) must be fenced first."""
        for w in self.writes:
            if w.ref.decl.name == name and (w.visit.may & (w.state == UNFENCED)).any():
                self.out.error(
                    f"{op_name(v.stmt)} reduces into '{name}' of a peer CTA, which that CTA "
                    "wrote with generic stores and no fence_proxy_async() after them: the "
                    "async proxy may combine with stale bytes", v.stmt.loc,
                    Note(f"'{text(w.ref.expr)}' is written here; every writing thread must run "
                         "fence_proxy_async() before the cluster barrier that orders it with "
                         "the reduction", w.visit.stmt.loc))
                return

    def exit(self, v: Visit | None, leaving: np.ndarray) -> None:
        if v is not None:
            exit_note = Note("the thread exits here", v.stmt.loc)
        else:
            exit_note = Note("the kernel ends after this statement", _last_stmt_loc(self.facts))
        for st in self.stores:
            pending = leaving & (st.group >= -1) & ~st.done
            if not pending.any():
                continue
            op = op_name(st.visit.stmt)
            if (pending & (st.group == -1)).any():
                msg = (f"{op} is never committed and waited for before its thread exits; add "
                       "bulk_commit() and bulk_wait_read(0)")
            else:
                msg = (f"{op} may still be reading shared memory when its thread exits; add "
                       "bulk_wait_read(0) (or bulk_wait(0)) after bulk_commit()")
            self.out.error(msg, st.visit.stmt.loc, exit_note)
            st.done = st.done | pending


def _last_stmt_loc(facts: Facts):
    body = [s for s in facts.kernel.body if not isinstance(s, (ir.SharedDecl, ir.BarrierDecl))]
    return body[-1].loc if body else facts.kernel.loc


def check_bulk_stores(facts: Facts, out: Report) -> None:
    """Generic shared-memory writes fenced before a bulk/tma store reads them; buffers not
    rewritten while a store reads them; stores waited for before exit."""
    if facts.asm_bulk:
        return
    _Scan(facts, out).run()


_HALF_ADD = re.compile(r"cp\.reduce\.async\.bulk\S*?\.add\.(bf16|f16)\b")


def check_asm_reductions(facts: Facts, out: Report) -> None:
    """A hand-written `cp.reduce.async.bulk ... .add.bf16` (or .f16): PTX only has the
    `.add.noftz` form, which bulk_reduce_add / tma_reduce_add derive."""
    for s in ir.walk(facts.kernel.body):
        if isinstance(s, ir.Asm) and (m := _HALF_ADD.search(s.template)):
            out.error(f"PTX has no cp.reduce.async.bulk add on {m.group(1)} without .noftz "
                      f"(write .add.noftz.{m.group(1)}, or use bulk_reduce_add / "
                      "tma_reduce_add, which derive it)", s.loc)


def check_issuers(facts: Facts, out: Report) -> None:
    """Single-thread operations (copies, init, expect_tx) run by many threads."""
    n = facts.n
    for v in facts.trace.visits:
        e = effect(v.stmt)
        if not e.one_thread or not v.counted or not v.certain:
            continue
        k = issuers(v)
        if k <= 1:
            continue
        bar = v.args.get(e.arrive) if e.arrive else None
        if e.arrive and (k != n or isinstance(bar, BarRef) and bar.decl.count == n):
            # some threads chosen on purpose, or every thread arriving as the barrier's count
            # says (a pipeline committed by every thread): check_arrival_counts' and the
            # expect_tx totals' to judge
            continue
        if not duplicated(v, n):
            continue  # each thread copies its own part
        elect = any(_has_elect(g) for g in v.guards)
        hint = ("elect() picks one thread in each warp: select one warp too, e.g. "
                "'if %warp == 0'") if elect else \
            "guard it with a condition that selects one thread, e.g. 'if %tid.x == 0'"
        out.error(f"{op_name(v.stmt)} is issued by {k} threads; it is meant for one thread "
                  f"({hint})", v.stmt.loc)


def _has_elect(e: ir.Expr) -> bool:
    if isinstance(e, ir.Call) and e.fn == "elect":
        return True
    return any(_has_elect(getattr(e, f)) for f in e.__dataclass_fields__
               if isinstance(getattr(e, f), ir.Expr))

