"""Flags that publish data across CTAs or ranks: a word a thread spins on with
`ld_acquire()` and after which it reads memory is a publication flag, and whoever sets it
publishes with it: a flip with relaxed order (an atomic exch / xor / or / and / cas left
`relaxed`, or a plain store of a value other than 0) orders nothing before it, so the
spinning thread may see the flag and then stale data. Counters (add, inc, ...) and resets to
0 are left to the protocols that use them, except one: a counter bumped with relaxed order
whose result picks the threads (the last CTA of a split-K or split-KV merge) that then read
a buffer the kernel stores to (the other CTAs' partials) acquires none of those stores. And a
release that only some threads run (under `if %tid.x == 0`, `elect()`) publishes the other
threads' stores only when a CTA barrier orders them before it."""

from __future__ import annotations

from collections.abc import Iterator

from .. import ir
from .. import types as T
from ..errors import Note
from .effects import effect
from .facts import Facts, Report, text
from .remote import root

_FLIPS = ("exch", "xor", "or", "and", "cas")


def check_relaxed_flags(facts: Facts, out: Report) -> None:
    spins = dict(_publishing_spins(facts.kernel.body, ()))
    if not spins:
        return
    for s in facts.statements:
        for flip, name in _flips(s):
            spin = spins.get(name)
            if spin is not None:
                out.error(f"'{text(flip) if isinstance(flip, ir.Expr) else 'this store'}' "
                          f"sets '{name}', on which a thread spins with ld_acquire() and then "
                          "reads memory, with relaxed order, which publishes nothing written "
                          "before it: make it a release (st_release(), or an atomic with "
                          "release order)", flip.loc or s.loc,
                          Note("the spin is here", spin.loc))


def check_relaxed_counters(facts: Facts, out: Report) -> None:
    stored = {name for s in facts.statements if isinstance(s, ir.Store)
              and isinstance(s.ref.type, T.GlobalRef) and (name := root(s.ref)) is not None}
    if not stored:
        return
    tainted: dict[str, ir.Atomic] = {}  # a variable or shared buffer -> the bump it holds
    for s in facts.statements:  # source order: a value derived from the result later
        bump = next((e for e in _exprs(s) if isinstance(e, ir.Atomic) and e.sem == "relaxed"),
                    None) or next((tainted[n] for n in _names(s) if n in tainted), None)
        if bump is None:
            continue
        if isinstance(s, (ir.Let, ir.Assign)):
            tainted[s.name] = bump
        elif isinstance(s, ir.Store) and isinstance(s.ref.type, T.SharedRef) and \
                (name := root(s.ref)) is not None:
            tainted[name] = bump
    for s in facts.statements:
        if not isinstance(s, ir.If) or (bump := next(
                (tainted[n] for n in _names(s) if n in tainted), None)) is None:
            continue
        read = next((e for b in (s.then, s.orelse) for x in ir.walk(b) for e in _exprs(x)
                     if isinstance(e, ir.Load) and isinstance(e.ref.type, T.GlobalRef)
                     and root(e.ref) in stored), None)
        if read is not None:
            out.warning(f"'{text(bump)}' has relaxed order, and its result picks the threads "
                        f"that then read '{root(read.ref)}', which this kernel's CTAs store: "
                        "the bump acquires none of the other CTAs' stores, so those threads "
                        "may read them stale; give it acq_rel order (after a CTA barrier that "
                        "orders the CTA's stores before it)", bump.loc or s.loc,
                        Note("the read is here", read.loc or s.loc))


_THREAD_REGS = ("tid.x", "tid.y", "tid.z", "laneid", "warp")


def check_release_before_barrier(facts: Facts, out: Report) -> None:
    per_thread: set[str] = set()  # variables that hold a thread's index, or derive from one
    for s in facts.statements:
        if isinstance(s, (ir.Let, ir.Assign)) and s.value is not None and \
                _some_threads(s.value, per_thread):
            per_thread.add(s.name)
    _scan_releases(facts.kernel.body, per_thread, out)


def _scan_releases(body: tuple[ir.Stmt, ...], per_thread: set[str], out: Report) -> None:
    """In each block: the plain global stores every thread made since the last CTA barrier,
    and a branch of some threads that releases after them."""
    stores: list[ir.Store] = []
    for s in body:
        if isinstance(s, ir.If) and _some_threads(s.cond, per_thread):
            rel = next((r for x in ir.walk(s.then) for r in ir.releases(x)), None)
            if rel is not None and stores:
                st = stores[-1]
                out.warning(f"'{text(rel) if isinstance(rel, ir.Expr) else 'this st_release'}' "
                            f"releases for the threads this branch picks, but every thread "
                            f"stored to '{root(st.ref)}' before it with no CTA barrier in "
                            "between: the other threads' stores are not ordered before the "
                            "release, so whoever acquires it may read them stale; put "
                            "bar_sync(0) before the branch", rel.loc or s.loc,
                            Note("the store is here", st.loc))
        elif any(isinstance(x, (ir.BarSync, ir.ClusterSync)) for x in ir.walk((s,))):
            stores = []
        else:
            stores += [x for x in ir.walk((s,), enter=lambda x: not (
                isinstance(x, ir.If) and _some_threads(x.cond, per_thread)))
                if isinstance(x, ir.Store) and isinstance(x.ref.type, T.GlobalRef)]
        for b in ir.blocks(s):
            _scan_releases(b, per_thread, out)


def _some_threads(e: ir.Expr, per_thread: set[str]) -> bool:
    """Whether `e` (a branch condition) tells the threads of a CTA apart (by thread, lane or
    warp index, or elect())."""
    return any(isinstance(x, ir.SReg) and x.name in _THREAD_REGS
               or isinstance(x, ir.Var) and x.name in per_thread
               or isinstance(x, ir.Call) and x.fn == "elect" for x in _exprs((e,)))


def _names(s: ir.Stmt) -> set[str]:
    """The variables and shared buffers a statement's own expressions read."""
    names = set(ir.free_names(s))
    names.update(n for e in _exprs(s) if isinstance(e, ir.Load)
                 and isinstance(e.ref.type, T.SharedRef) and (n := root(e.ref)) is not None)
    return names


def _publishing_spins(body: tuple[ir.Stmt, ...], rest: tuple[ir.Stmt, ...]
                      ) -> Iterator[tuple[str, ir.While]]:
    """(flag buffer, loop) of each `while` spinning on an ld_acquire() that memory reads
    follow (in its block or the blocks around it)."""
    for i, s in enumerate(body):
        after = body[i + 1:] + rest
        if isinstance(s, ir.While) and _reads_memory(after):
            for e in _exprs(s.cond):
                if isinstance(e, ir.AtomicLoad) and e.sem == "acquire" and \
                        (name := root(e.ref)) is not None:
                    yield name, s
        for b in ir.blocks(s):
            yield from _publishing_spins(b, after)


def _reads_memory(stmts: tuple[ir.Stmt, ...]) -> bool:
    for s in ir.walk(stmts):
        if effect(s).loads_global:
            return True  # a copy from global memory
        if any(isinstance(e, ir.Load) and isinstance(e.ref.type, T.GlobalRef)
               for e in _exprs(s)):
            return True
    return False


def _flips(s: ir.Stmt) -> Iterator[tuple[ir.Node, str]]:
    if isinstance(s, ir.Store) and isinstance(s.ref.type, T.GlobalRef) and \
            not (isinstance(s.value, ir.Const) and s.value.value == 0) and \
            (name := root(s.ref)) is not None:
        yield s, name
    for e in _exprs(s):
        if isinstance(e, ir.Atomic) and e.sem == "relaxed" and e.op in _FLIPS and \
                (name := root(e.ref)) is not None:
            yield e, name


def _exprs(x: object) -> Iterator[ir.Expr]:
    """Every expression in a node's own fields (nested statement blocks left out)."""
    stack: list[object] = [getattr(x, f) for f in ir.node_fields(x)] \
        if isinstance(x, ir.Node) else [x]
    while stack:
        y = stack.pop()
        if isinstance(y, tuple):
            stack.extend(y)
        elif isinstance(y, ir.Expr):
            yield y
            stack.extend(getattr(y, f) for f in ir.node_fields(y))
