"""How many phases a barrier completes against how many its waiters wait for, when both are
expressions of the kernel's parameters that can be compared.

A barrier that copies complete on (a ring's "full" barriers, a one-shot load's barrier)
completes one phase per `count` arrivals; a thread that waits on it waits for one phase per
wait. Each side is a sum over its sites of the trip counts of the loops around the site. Trip
counts are evaluated in a few assignments of the parameters (and of `%ctaid`/`%nctaid`):
if the waiters wait for fewer phases in every one, the copies of the last iterations complete
while nobody waits, and the kernel may exit under them; if for more, the waiters hang. A
count that depends on the thread, on a `while` condition, or on a value the loop changes is
not compared.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import ir
from .. import types as T
from ..errors import Note
from .effects import bar, effect, issuers, op_name, val
from .facts import Facts, Report, text
from .threads import Visit
from .values import Evaluator, Val, const

PER_CTA = ("ctaid", "nctaid", "clusterid", "nclusterid", "cluster_ctaid", "cluster_nctaid",
           "cluster_ctarank", "cluster_nctarank")


@dataclass(frozen=True)
class Sample:
    """One assignment of the parameters and per-CTA registers."""

    params: dict[str, int]
    sregs: dict[str, int]


def samples_of(k: ir.Kernel) -> list[Sample]:
    """A few assignments of the integer parameters and the per-CTA registers."""
    out = []
    for base, gap, cta, ncta in ((7, 4, 0, 1), (29, 6, 3, 5), (1000, 13, 2, 7)):
        ints = [p.name for p in k.params if isinstance(p.type, T.Scalar) and
                not p.type.is_float and not p.type.is_pred]
        params = {name: base + gap * i for i, name in enumerate(ints)}
        sregs = {f"{r}.{a}": (cta if r.endswith("ctaid") or r.endswith("ctarank") else ncta)
                 for r in PER_CTA for a in ("x", "y", "z")} | {r: ncta for r in PER_CTA}
        sregs |= {f"ntid.{a}": n for a, n in zip("xyz", k.threads, strict=True)}
        out.append(Sample(params, sregs))
    return out


class Bounds:
    """Loop trip counts in each `Sample`: variables are replaced by their one definition (a
    `let` never assigned again); anything else makes a count unknown."""

    def __init__(self, k: ir.Kernel, samples: list[Sample]):
        self.defs: dict[str, ir.Expr | None] = {}
        assigned: set[str] = set()
        for s in ir.walk(k.body):
            if isinstance(s, ir.Let):
                self.defs[s.name] = None if s.name in self.defs else s.value
            elif isinstance(s, (ir.Assign, ir.SetElem)):
                assigned.add(s.name)
            elif isinstance(s, ir.Asm):
                assigned.update(s.outs)
            elif isinstance(s, ir.For):
                self.defs[s.var] = None  # a loop variable: not one value
        for name in assigned:
            self.defs[name] = None
        self.params = {p.name for p in k.params}
        self.samples = samples
        self.envs: list[dict[str, Val | None]] = [{} for _ in samples]
        self.evs = []
        for smp in samples:
            ev = Evaluator((1, 1, 1))
            ev.sregs.update({r: const(v) for r, v in smp.sregs.items()})
            self.evs.append(ev)
        self.one = np.ones(1, dtype=bool)
        self._trips: dict[tuple[int, int], int | None] = {}
        self._params: dict[str, frozenset[str]] = {}

    def var(self, name: str, si: int) -> Val | None:
        env = self.envs[si]
        if name in env:
            return env[name]
        env[name] = None  # a definition that refers to itself stays unknown
        v: Val | None = None
        if name in self.params:
            known = self.samples[si].params.get(name)
            v = None if known is None else const(known)
        elif (d := self.defs.get(name)) is not None:
            v = self.value(d, si)
        env[name] = v
        return v

    def value(self, e: ir.Expr, si: int) -> Val | None:
        if not _comparable(e):
            return None
        env: dict[str, Val] = {}
        for name in ir.free_names(e):
            v = self.var(name, si)
            if v is None:
                return None
            env[name] = v
        r = self.evs[si].ev(e, env, self.one, self.one)
        return r if isinstance(r.known, int) else None

    def params_of(self, e: ir.Expr) -> frozenset[str]:
        """The parameters an expression depends on, through the definitions it uses."""
        out: set[str] = set()
        for name in ir.free_names(e):
            if name in self.params:
                out.add(name)
                continue
            got = self._params.get(name)
            if got is None:
                self._params[name] = frozenset()
                d = self.defs.get(name)
                got = self._params[name] = self.params_of(d) if d is not None else frozenset()
            out |= got
        return frozenset(out)

    def trips(self, loop: ir.Stmt, si: int) -> int | None:
        key = (id(loop), si)
        if key in self._trips:
            return self._trips[key]
        n = None
        if isinstance(loop, ir.For):
            start, stop, step = (self.value(x, si) for x in (loop.start, loop.stop, loop.step))
            a, b, c = (None if x is None else x.known for x in (start, stop, step))
            if isinstance(a, int) and isinstance(b, int) and isinstance(c, int) and c:
                dist = b - a if c > 0 else a - b
                n = max(0, -(-dist // abs(c)))
        self._trips[key] = n
        return n

    def times(self, v: Visit, si: int) -> int | None:
        """How many times a site runs in one thread: the product of its loops' trips."""
        n = 1
        for loop in v.loops:
            t = self.trips(loop, si)
            if t is None:
                return None
            n *= t
        return n

    def used(self, visits: list[Visit]) -> set[str]:
        out: set[str] = set()
        for v in visits:
            for loop in v.loops:
                if isinstance(loop, ir.For):
                    for x in (loop.start, loop.stop, loop.step):
                        out |= self.params_of(x)
        return out


def _comparable(e: object) -> bool:
    """No thread-dependent register, load or call: the same value in every thread of a CTA."""
    if isinstance(e, ir.SReg):
        return e.name.split(".")[0] in PER_CTA or e.name.startswith("ntid")
    if isinstance(e, (ir.Load, ir.Call)):
        return False
    if isinstance(e, ir.Node):
        return all(_comparable(getattr(e, f)) for f in ir.node_fields(e))
    if isinstance(e, tuple):
        return all(_comparable(x) for x in e)
    return True


def _loop_text(loop: ir.Stmt) -> str:
    if not isinstance(loop, ir.For):
        return "its loop"
    step = "" if isinstance(loop.step, ir.Const) and loop.step.value == 1 else \
        f" step {text(loop.step)}"
    return f"'for {loop.var} in {text(loop.start)} .. {text(loop.stop)}{step}'"


def check_phase_counts(facts: Facts, out: Report) -> None:
    """Phases completed on a barrier that copies complete on, against the waits on it."""
    if facts.asm_barriers:
        return
    by_bar: dict[str, tuple[list[Visit], list[Visit], list[Visit]]] = {}
    for v in facts.trace.visits:
        if not v.counted:
            continue
        e = effect(v.stmt)
        for role, slot in ((e.arrive, 0), (e.wait, 1), (e.complete, 2)):
            b = bar(v, role)
            if b is not None:
                by_bar.setdefault(b.decl.name, ([], [], []))[slot].append(v)
    if not any(c for _, _, c in by_bar.values()):
        return
    samples = samples_of(facts.kernel)
    bounds = Bounds(facts.kernel, samples)
    decls = {d.name: d for d in facts.kernel.body if isinstance(d, ir.BarrierDecl)}
    for name, (arrives, waits, copies) in by_bar.items():
        d = decls.get(name)
        if d is None or not copies or not arrives or not waits:
            continue
        _compare(facts, d, arrives, waits, copies, bounds, samples, out)


def _compare(facts: Facts, d: ir.BarrierDecl, arrives: list[Visit], waits: list[Visit],
             copies: list[Visit], bounds: Bounds, samples: list[Sample], out: Report) -> None:
    if not all(v.certain for v in arrives + waits):
        return
    # Two waits for the same phase (the same barrier and parity expressions in the same
    # loops, or the same known parity outside loops) wait once.
    seen: set[tuple] = set()
    once: list[Visit] = []
    for v in waits:
        e = effect(v.stmt)
        par = val(v, e.parity)
        key = (tuple(id(x) for x in v.loops), getattr(v.stmt, e.wait or ""),
               getattr(v.stmt, e.parity or "") if v.loops or par is None or
               not isinstance(par.known, int) else par.known)
        if key not in seen:
            seen.add(key)
            once.append(v)
    waits = once
    produced: list[int] = []
    waited: list[int] = []
    for si in range(len(samples)):
        arrivals = 0
        for v in arrives:
            e = effect(v.stmt)
            c = val(v, e.count)
            per = 1 if c is None else c.known
            times = bounds.times(v, si)
            if not isinstance(per, int) or times is None:
                return
            arrivals += issuers(v) * per * times
        if d.count <= 0 or arrivals % d.count:
            return
        per_thread = np.zeros(facts.n, dtype=np.int64)
        for v in waits:
            times = bounds.times(v, si)
            if times is None:
                return
            per_thread[v.must] += times
        each = per_thread[per_thread > 0]
        if each.size == 0 or (each != each[0]).any():
            return
        produced.append(arrivals // d.count)
        waited.append(int(each[0]))
    p, w = produced[0], waited[0]
    used = bounds.used(arrives + waits)
    given = ", ".join(f"{n} = {samples[0].params[n]}" for n in sorted(used)
                      if n in samples[0].params)
    given = f"with {given}, " if given else ""
    if all(a > b for a, b in zip(produced, waited, strict=True)):
        site = max(copies, key=lambda v: len(v.loops))
        last = f"in the last iteration of {_loop_text(site.loops[-1])} " if site.loops else ""
        out.error(f"{op_name(site.stmt)} {last}completes on '{d.name}', but nobody waits for "
                  f"that phase before the kernel exits: {given}'{d.name}' completes {p} "
                  f"phase(s) and each thread that waits on it waits for {w}", site.stmt.loc,
                  _wait_note(waits[-1]))
    elif all(a < b for a, b in zip(produced, waited, strict=True)):
        site = max(waits, key=lambda v: len(v.loops))
        producer = max(arrives, key=lambda v: len(v.loops))
        out.error(f"mbarrier_wait on '{text(bar(site, 'bar').expr)}' waits for more phases "  # type: ignore[union-attr]
                  f"than '{d.name}' completes: {given}the waiting threads wait {w} times"
                  + (f" (in {_loop_text(site.loops[-1])})" if site.loops else "") + ", but "
                  f"'{d.name}' completes {p} phase(s); the role loops run different numbers of "
                  "iterations", site.stmt.loc,
                  Note(f"'{d.name}' completes its phases here"
                       + (f", in {_loop_text(producer.loops[-1])}" if producer.loops else ""),
                       producer.stmt.loc))


def _wait_note(v: Visit) -> Note:
    where = f", in {_loop_text(v.loops[-1])}" if v.loops else ""
    return Note(f"the waits on it are here{where}", v.stmt.loc)
