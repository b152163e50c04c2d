"""Which threads of the CTA execute each statement: a small abstract interpreter.

The kernel body is run once for all threads at a time, with one value per thread (see
`values`). A branch whose condition is known per thread splits the threads; one it cannot
decide makes everything under it "may execute". A loop body is run twice: as its first
iteration (loop variable = start, variables as before the loop) and as a generic iteration
(loop variable and the variables the body changes unknown). The generic run stands for one
iteration of many: all threads that run it together run one iteration together when the
loop bounds are the same in every thread, which is what "arrivals per phase" means.

Every statement reached is recorded, in program order, as a `Visit`: the threads that must
and may execute it and its operands resolved to barriers, shared and global places.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from .. import ir
from .. import types as T
from . import absint
from .remote import remote_barriers
from .values import Evaluator, Val, const, join, top
from .warpgroup import UNIFORM, verdict

# Each loop level runs its body up to 2 + FIXPOINT_ROUNDS times; below MAX_LOOP_DEPTH only
# twice (no first iteration, one widening pass), which bounds the work on deep nests.
MAX_LOOP_DEPTH = 4
FIXPOINT_ROUNDS = 3


@dataclass(frozen=True, eq=False)
class BarRef:
    """One mbarrier, or one element of an array with the element index per thread."""

    decl: ir.BarrierDecl
    index: Val | None
    expr: ir.Expr

    def elements(self, mask: np.ndarray) -> set[int] | None:
        """The elements the threads of `mask` use; None when that cannot be told."""
        if self.index is None:
            return {0}
        vals = self.index.values(mask)
        if vals is None:
            return None
        return {int(v) for v in np.unique(vals)}

    def per_thread(self, n: int) -> np.ndarray | None:
        if self.index is None:
            return np.zeros(n, dtype=np.int64)
        k = self.index.known
        if k is None:
            return None
        return np.broadcast_to(np.asarray(k, dtype=np.int64), (n,))


@dataclass(frozen=True, eq=False)
class SmemRef:
    """A shared-memory place or view: `offset` bytes into buffer `decl`, `shape` elements."""

    decl: ir.SharedDecl
    offset: Val
    shape: tuple[int, ...]
    expr: ir.Expr
    indices: tuple[Val, ...]  # outermost first

    @property
    def nbytes(self) -> int:
        n = self.decl.elem.nbytes
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True, eq=False)
class GmemRef:
    """A global-memory place: `offset` bytes from its (16-byte aligned) pointer parameter."""

    offset: Val
    expr: ir.Expr


@dataclass(eq=False)
class Visit:
    """One statement reached by some threads, with its operands resolved."""

    stmt: ir.Stmt
    must: np.ndarray  # threads that certainly execute it (in one loop iteration)
    may: np.ndarray
    args: dict[str, object]
    first: bool  # in the first iteration of every enclosing loop
    counted: bool  # the visit that stands for one iteration (one per statement and context)
    loops: tuple[ir.Stmt, ...]
    guards: tuple[ir.Expr, ...]  # conditions of the enclosing branches
    index: int
    # in a kernel with wgmma: the enclosing conditions that split a warpgroup (or may), each
    # with its verdict (verify/warpgroup.py)
    splits: tuple[tuple[ir.Expr, str], ...] = ()

    @property
    def certain(self) -> bool:
        return bool(np.array_equal(self.must, self.may))


@dataclass
class Trace:
    visits: list[Visit]
    end_may: np.ndarray  # threads that may reach the end of the kernel body
    interp: Interpreter  # re-runs loop bodies iteration by iteration (verify/unroll.py)

    def of(self, *classes: type) -> list[Visit]:
        return [v for v in self.visits if isinstance(v.stmt, classes)]


@dataclass
class Entry:
    """The state in which a loop is first reached (its first pass through the kernel)."""

    flow: _Flow
    mode: _Mode


@dataclass
class _Flow:
    """Threads that must / may reach the current point, supposing the enclosing undecided
    branches are taken, and the value of every variable."""

    must: np.ndarray
    may: np.ndarray
    env: dict[str, Val]
    live: dict[str, np.ndarray]  # threads that declared each variable

    def fork(self, must: np.ndarray, may: np.ndarray, share: bool = False) -> _Flow:
        if share:
            return _Flow(must, may, self.env, self.live)
        return _Flow(must, may, dict(self.env), dict(self.live))


@dataclass(frozen=True)
class _Mode:
    """How statements of the current block are recorded."""

    certain: bool = True  # False under a branch that cannot be decided: no "must" threads
    first: bool = True
    counted: bool = True
    record: bool = True  # False while widening loop variables
    loops: tuple[ir.Stmt, ...] = ()
    guards: tuple[ir.Expr, ...] = ()
    splits: tuple[tuple[ir.Expr, str], ...] = ()

    def but(self, **kw) -> _Mode:
        return _Mode(**{**self.__dict__, **kw})


_OP_FIELDS: dict[type, tuple[str, ...]] = {}


def _op_fields(s: ir.Stmt) -> tuple[str, ...]:
    names = _OP_FIELDS.get(type(s))
    if names is None:
        names = _OP_FIELDS[type(s)] = tuple(f.name for f in fields(s) if f.name != "loc")
    return names


def _assigned(stmts: tuple[ir.Stmt, ...]) -> set[str]:
    names: set[str] = set()
    for s in ir.walk(stmts):
        if isinstance(s, (ir.Assign, ir.SetElem)):
            names.add(s.name)
        elif isinstance(s, ir.Asm):
            names.update(s.outs)
    return names


class Interpreter:
    def __init__(self, k: ir.Kernel):
        self.k = k
        self.ev = Evaluator(k.threads)
        self.n = self.ev.n
        self.shared = {s.name: s for s in k.body if isinstance(s, ir.SharedDecl)}
        # the release operations of each statement (st_release, atomics with release order),
        # found once: the trace visits a loop body many times
        self.releases = {id(s): r for s in ir.walk(k.body) if (r := ir.releases(s))}
        hidden = remote_barriers(k)  # checked by verify/cluster.py
        self.barriers = {s.name: s for s in k.body
                         if isinstance(s, ir.BarrierDecl) and s.name not in hidden}
        self.visits: list[Visit] = []
        self.entries: dict[int, Entry] = {}  # by id of the loop statement
        self.strides: dict[str, list[int]] = {}  # of each shared buffer, bytes per dimension
        self._assigned: dict[int, set[str]] = {}
        self._recordable: dict[int, bool] = {}
        self.none = np.zeros(self.n, dtype=bool)
        self.all = np.ones(self.n, dtype=bool)
        self.wgmma = any(isinstance(s, ir.Wgmma) for s in ir.walk(k.body))

    def run(self) -> Trace:
        env: dict[str, Val] = {}
        for p in self.k.params:
            # A pointer is tracked as a byte offset from itself (the allocation is aligned).
            env[p.name] = const(0) if isinstance(p.type, T.Ptr) else \
                top(uniform=True, rng=absint.of_type(p.type))
        f = _Flow(self.all, self.all, env, {name: self.all for name in env})
        self.block(self.k.body, f, _Mode())
        return Trace(self.visits, f.may, self)

    # ------------------------------------------------------------------ values

    def value(self, e: ir.Expr, f: _Flow) -> Val:
        return self.ev.ev(e, f.env, f.must, f.may)

    def assign(self, f: _Flow, name: str, new: Val) -> Val:
        old, live = f.env.get(name), f.live.get(name)
        if old is None or live is None:
            return new
        keep = live & ~f.may
        unsure = live & f.may & ~f.must
        if not keep.any() and not unsure.any():
            return new
        if old.known is not None and new.known is not None:
            a = np.broadcast_to(np.asarray(old.known, dtype=np.int64), (self.n,))
            b = np.broadcast_to(np.asarray(new.known, dtype=np.int64), (self.n,))
            if not (unsure & (a != b)).any():
                return Val(np.where(f.must, b, a), varies=old.varies or new.varies)
        return top(align=min(old.alignment(), new.alignment()), varies=old.varies or new.varies,
                   rng=lambda: absint.join(old.range, new.range))

    def resolve(self, v: object, f: _Flow) -> object:
        if v is None:
            return None
        if isinstance(v, tuple):
            return tuple(self.resolve(x, f) for x in v)
        if not isinstance(v, ir.Expr):
            return v
        t = v.type
        if isinstance(t, (T.BarrierRef, T.SharedRef, T.GlobalRef)):
            return self.place(v, f)
        if isinstance(t, T.Scalar):
            return self.value(v, f)
        return v

    def place(self, e: ir.Expr, f: _Flow) -> BarRef | SmemRef | GmemRef | None:
        if isinstance(e.type, T.GlobalRef):
            if not isinstance(e, ir.Index) or not isinstance(e.base.type, T.Ptr):
                return None
            base = self.value(e.base, f)
            idx = self.ev.offset(self.value(e.indices[0], f), e.base.type.elem.nbytes)
            return GmemRef(self.ev.add(base, idx), e)
        indices: list[ir.Expr] = []
        ref = e
        while isinstance(ref, ir.Index):
            indices = list(ref.indices) + indices
            ref = ref.base
        if isinstance(ref, ir.BarrierObj) and ref.name in self.barriers:
            return BarRef(self.barriers[ref.name],
                          self.value(indices[0], f) if indices else None, e)
        if isinstance(ref, ir.SharedBuf) and ref.name in self.shared:
            decl = self.shared[ref.name]
            strides = self.strides.get(ref.name)
            if strides is None:
                strides, acc = [], decl.elem.nbytes
                for d in reversed(decl.shape):
                    strides.append(acc)
                    acc *= d
                strides.reverse()
                self.strides[ref.name] = strides
            off = const(0)
            vals = tuple(self.value(idx, f) for idx in indices)
            for idx, stride in zip(vals, strides, strict=False):
                off = self.ev.add(off, self.ev.offset(idx, stride))
            shape = e.type.shape if isinstance(e.type, T.SharedRef) else ()
            return SmemRef(decl, off, shape, e, vals)
        return None  # pipeline stages and newer places: derived by the compiler

    # ------------------------------------------------------------------ statements

    def record(self, s: ir.Stmt, f: _Flow, m: _Mode, args: dict[str, object]) -> None:
        if not m.record or not f.may.any():
            return
        must = f.must if m.certain else self.none
        self.visits.append(Visit(s, must, f.may, args, m.first, m.counted, m.loops, m.guards,
                                 len(self.visits), m.splits))

    def block(self, stmts: tuple[ir.Stmt, ...], f: _Flow, m: _Mode) -> None:
        seen = None  # masks are replaced, never changed in place: test each new one once
        for s in stmts:
            if f.may is not seen:
                if not f.may.any():
                    return
                seen = f.may
            self.stmt(s, f, m)

    def stmt(self, s: ir.Stmt, f: _Flow, m: _Mode) -> None:
        if id(s) in self.releases and not isinstance(s, (ir.Op, ir.Store)):
            self.record(s, f, m, {})  # a semaphore release inside an expression
        if isinstance(s, ir.Let):
            f.env[s.name] = self.value(s.value, f) if s.value is not None else top()
            f.live[s.name] = f.may
        elif isinstance(s, ir.Assign):
            f.env[s.name] = self.assign(f, s.name, self.value(s.value, f))
        elif isinstance(s, ir.SetElem):
            f.env[s.name] = self.assign(f, s.name, top())
        elif isinstance(s, ir.Store):
            if m.record:  # operands only matter to a recorded visit (they change nothing)
                self.record(s, f, m, {"ref": self.place(s.ref, f)})
        elif isinstance(s, ir.If):
            self.branch(s.cond, self.value(s.cond, f), s.then, s.orelse, f, m)
        elif isinstance(s, ir.Role):
            warp = self.ev.linear >> 5
            inside = (warp >= s.warp_start) & (warp < s.warp_stop)
            self.branch(None, Val(inside.astype(np.int64)), s.body, (), f, m)
        elif isinstance(s, (ir.For, ir.While)):
            self.loop(s, f, m)
        elif isinstance(s, ir.Return):
            self.record(s, f, m, {})
            f.must, f.may = self.none, self.none
        elif isinstance(s, ir.Asm):
            for name in s.outs:
                f.env[name] = self.assign(f, name, top())
            self.record(s, f, m, {})
        elif isinstance(s, ir.Op):
            if m.record:
                args = {name: self.resolve(getattr(s, name), f) for name in _op_fields(s)}
                self.record(s, f, m, args)

    def branch(self, cond: ir.Expr | None, c: Val, then: tuple[ir.Stmt, ...],
               orelse: tuple[ir.Stmt, ...], f: _Flow, m: _Mode) -> None:
        guards = m.guards + ((cond,) if cond is not None else ())
        if cond is not None and self.wgmma and \
                (v := verdict(self.ev, cond, f.env, f.must, f.may)) != UNIFORM:
            m = m.but(splits=m.splits + ((cond, v),))
        if c.known is not None:
            ck = np.broadcast_to(np.asarray(c.known) != 0, (self.n,))
            t = f.fork(f.must & ck, f.may & ck, share=True)
            self.block(then, t, m.but(guards=guards))
            e = f.fork(f.must & ~ck, f.may & ~ck, share=True)
            self.block(orelse, e, m.but(guards=guards))
            f.must, f.may = t.must | e.must, t.may | e.may
            return
        t, e = f.fork(f.must, f.may), f.fork(f.must, f.may)
        self.block(then, t, m.but(certain=False, guards=guards))
        self.block(orelse, e, m.but(certain=False, guards=guards))
        for name in f.env:
            f.env[name] = join(t.env.get(name, f.env[name]), e.env.get(name, f.env[name]),
                               c.is_uniform, c.varies)
        f.must, f.may = t.must & e.must, t.may | e.may

    def loop(self, s: ir.For | ir.While, f: _Flow, m: _Mode) -> None:
        deep = len(m.loops) >= MAX_LOOP_DEPTH
        if m.record and id(s) not in self.entries:
            self.entries[id(s)] = Entry(f.fork(f.must, f.may), m)
        var_first: Val | None = None
        var_any: Val | None = None
        trips: np.ndarray | None = None
        if isinstance(s, ir.For):
            start, stop, step = (self.value(x, f) for x in (s.start, s.stop, s.step))
            uniform = start.is_uniform and stop.is_uniform and step.is_uniform
            trips = _trips(start, stop, step, self.n)
            var_first = start
            var_any = top(uniform=start.is_uniform and step.is_uniform,
                          align=min(start.alignment(), step.alignment()), varies=True,
                          rng=lambda: absint.loop_var(start.range, stop.range, step.range))
            enter = self.all if trips is None else trips >= 1
            sure = uniform or trips is not None
        else:
            c = self.value(s.cond, f)
            enter = self.all if c.known is None else np.broadcast_to(c.known != 0, (self.n,))
            sure = c.is_uniform or c.known is not None
        again = trips is None or bool((trips[f.may] >= 2).any())
        body_mode = m.but(loops=m.loops + (s,))
        # A body with no operation, store or return records nothing: only its variables
        # matter, and the widening below gives them.
        quiet = not self.recordable(s.body)

        # First iteration.
        exits = self.none
        if not deep and not quiet:
            first = f.fork(f.must & enter, f.may & enter)
            if var_first is not None:
                first.env[s.var], first.live[s.var] = var_first, first.may  # type: ignore[union-attr]
            self.block(s.body, first, body_mode.but(certain=m.certain and sure,
                                                    counted=m.counted and not again))
            exits = (f.may & enter) & ~first.must
            if not again:
                everyone = not (f.may & ~enter).any()
                for name in f.env:
                    after = first.env.get(name, f.env[name])
                    f.env[name] = after if everyone else join(f.env[name], after)
                f.must = f.must & ~exits
                return

        # Generic iteration: the variables the body assigns, widened until they settle.
        env_in = dict(f.env)
        changing = []
        for x in self.assigned(s.body):
            v = env_in.get(x)
            if v is None:
                continue
            if v.known is None and not v.uniform and v.align == 1:
                env_in[x] = top(varies=True)  # nothing is known that an iteration could lose
            else:
                changing.append(x)
        for _ in range(1 if deep else FIXPOINT_ROUNDS):
            if not changing:
                break
            g = self.generic_flow(s, f, env_in, var_any, trips, body_mode)
            self.block(s.body, g, body_mode.but(record=False))
            changing = [x for x in changing if not _settled(env_in[x], g.env.get(x, env_in[x]))]
            for x in changing:
                # Ranges of values carried across iterations are not widened to a fixpoint:
                # they are dropped (the unrolled iterations of verify/unroll.py know them).
                env_in[x] = _rangeless(join(env_in[x], g.env.get(x, env_in[x]), varies=True))
        for x in changing:
            env_in[x] = top(varies=True)
        if quiet:
            for name in f.env:
                f.env[name] = env_in[name]
            return
        g = self.generic_flow(s, f, env_in, var_any, trips, body_mode)
        if trips is not None:
            sure = len(np.unique(trips[f.may])) <= 1
        elif isinstance(s, ir.While):
            c = self.value(s.cond, g)
            sure = c.is_uniform or c.known is not None
        g_in = g.may
        self.block(s.body, g, body_mode.but(certain=m.certain and sure, first=False))
        exits = exits | (g_in & ~g.must)
        for name in f.env:
            f.env[name] = join(env_in[name], g.env.get(name, env_in[name]))
        f.must = f.must & ~exits

    def assigned(self, body: tuple[ir.Stmt, ...]) -> set[str]:
        key = id(body)
        if key not in self._assigned:
            self._assigned[key] = _assigned(body)
        return self._assigned[key]

    def recordable(self, body: tuple[ir.Stmt, ...]) -> bool:
        key = id(body)
        if key not in self._recordable:
            self._recordable[key] = any(isinstance(x, (ir.Op, ir.Store, ir.Return, ir.Asm))
                                        for x in ir.walk(body))
        return self._recordable[key]

    def generic_flow(self, s: ir.For | ir.While, f: _Flow, env_in: dict[str, Val],
                     var_any: Val | None, trips: np.ndarray | None, m: _Mode) -> _Flow:
        if trips is not None:
            enter = trips >= 2
        elif isinstance(s, ir.While):
            c = self.ev.ev(s.cond, env_in, f.must, f.may)
            enter = self.all if c.known is None else np.broadcast_to(c.known != 0, (self.n,))
        else:
            enter = self.all
        g = _Flow(f.must & enter, f.may & enter, dict(env_in), dict(f.live))
        if var_any is not None:
            g.env[s.var], g.live[s.var] = var_any, g.may  # type: ignore[union-attr]
        return g


def _settled(old: Val, new: Val) -> bool:
    """`new` adds nothing to `old` (a value without a range admits any range)."""
    if not old.same_as(new, ranges=False):
        return False
    return old.known is not None or old.rng is None or old.range == new.range


def _rangeless(v: Val) -> Val:
    return v if v.known is not None or v.rng is None else \
        Val(None, v.uniform, v.align, v.varies, None)


def _trips(start: Val, stop: Val, step: Val, n: int) -> np.ndarray | None:
    """Iterations of `for i in start .. stop step step` per thread, when known."""
    if start.known is None or stop.known is None or step.known is None:
        return None
    a, b, c = start.known, stop.known, step.known
    if isinstance(a, int) and isinstance(b, int) and isinstance(c, int):
        span = b - a if c > 0 else a - b
        return np.full(n, max(0, -(-span // max(abs(c), 1))), dtype=np.int64)
    st, sp, sc = (np.broadcast_to(np.asarray(v.known, dtype=np.int64), (n,))
                  for v in (start, stop, step))
    up = sc > 0
    stride = np.where(sc == 0, 1, np.abs(sc))
    dist = np.where(up, sp - st, st - sp)
    return np.maximum(0, -(-dist // stride))


def interpret(k: ir.Kernel) -> Trace:
    """The visits of every statement of `k` reached by some thread, in program order."""
    return Interpreter(k).run()
