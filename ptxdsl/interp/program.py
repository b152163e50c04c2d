"""A kernel compiled for the interpreter: statements become closures, compiled once.

A compiled statement is a Step `(mode, preempt, fn)`: `fn(thread)` runs it, directly when
`mode` is PLAIN or as a generator (`yield from`) when it is GEN because it may block;
`preempt` asks the scheduler for a switch point before it (statements that touch shared
memory and the intrinsic ops), so other threads and copies can interleave there. Blocks of
plain statements stay plain, so straight-line code costs no generator switches.

Registers are a flat list per thread: the builder forbids shadowing a visible name, so one
slot per name is enough even when sibling scopes reuse it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from .. import ir
from .. import types as T
from ..codegen.layout import layout_kernel
from ..opdef import definition
from . import scalar
from .cluster import remote_write
from .cta import PREEMPT, Thread, ThreadExit
from .errors import fail
from .exprs import (
    COLLECTIVES,
    barrier_place,
    check_aligned,
    compile_expr,
    global_place,
    peer_place,
    shared_place,
    subexprs,
)
from .sync import collective

PLAIN, GEN = 0, 1
Step = tuple[int, bool, Callable[[Thread], Any]]


def as_gen(mode: int, fn: Callable[[Thread], Any]) -> Callable[[Thread], Generator]:
    if mode == GEN:
        return fn

    def gen(th: Thread) -> Generator:
        fn(th)
        yield from ()

    return gen


class Program:
    """The compiled form of one ir.Kernel; `body(thread)` is a thread's generator."""

    def __init__(self, kernel: ir.Kernel):
        self.kernel = kernel
        self.layout = layout_kernel(kernel)
        self.decls = {d.name: d for d in kernel.body
                      if isinstance(d, (ir.SharedDecl, ir.BarrierDecl))}
        self.barriers = [(d.name, d.n) for d in self.decls.values()
                         if isinstance(d, ir.BarrierDecl)]
        self.slots = {p.name: i for i, p in enumerate(kernel.params)}
        self.nparams = len(kernel.params)
        self.hoisted: dict[int, int] = {}  # id(collective Call) -> its register slot
        self.sites = 0
        self.track_proxy = any(isinstance(s, ir.Op) and definition(s).async_reads
                               for s in ir.walk(kernel.body))
        self.reg_arrays = {s.name for s in ir.walk(kernel.body)
                           if isinstance(s, ir.Let) and isinstance(s.var_type, T.RegArray)}
        self.body = as_gen(*self.block(kernel.body))

    def scratch(self) -> list[Any]:
        """Fresh registers after the parameters."""
        return [None] * (len(self.slots) - self.nparams)

    def slot(self, name: str) -> int:
        return self.slots.setdefault(name, len(self.slots))

    @staticmethod
    def written(th: Thread, name: str, node: ir.Stmt) -> None:
        """A register array was written: a wgmma reading it needs a wgmma_fence first."""
        if th.wgmma is not None:
            th.wgmma.dirty[name] = node

    expr = compile_expr
    shared_place = shared_place
    global_place = global_place
    barrier_place = barrier_place

    # ------------------------------------------------------------------ statements

    def block(self, stmts: tuple[ir.Stmt, ...]) -> tuple[int, Callable[[Thread], Any]]:
        steps = [st for st in map(self.stmt, stmts) if st is not None]
        if all(mode == PLAIN and not pre for mode, pre, _ in steps):
            fns = tuple(f for _, _, f in steps)

            def plain(th: Thread) -> None:
                for f in fns:
                    f(th)

            return PLAIN, plain
        items = tuple(steps)

        def gen(th: Thread) -> Generator:
            for mode, pre, f in items:
                if pre:
                    yield PREEMPT
                if mode:
                    yield from f(th)
                else:
                    f(th)

        return GEN, gen

    def stmt(self, s: ir.Stmt) -> Step | None:
        if isinstance(s, (ir.SharedDecl, ir.BarrierDecl)):
            return None
        handler = _STMT.get(type(s))
        if handler is None:
            if not isinstance(s, ir.Op):
                raise TypeError(f"the interpreter has no rule for {type(s).__name__}")
            handler = definition(s).interp
        exprs = _direct_exprs(s)
        pre = self.prelude(exprs)
        mode, preempt, fn = handler(self, s)
        preempt = preempt or any(_touches_smem(e) for e in exprs)
        if pre is None:
            return mode, preempt, fn
        body = as_gen(mode, fn)

        def with_prelude(th: Thread) -> Generator:
            yield from pre(th)  # type: ignore[misc]
            yield from body(th)

        return GEN, preempt, with_prelude

    def prelude(self, exprs: list[ir.Expr]) -> Callable[[Thread], Generator] | None:
        """A generator that evaluates the warp collectives inside `exprs` (innermost first)
        into their register slots, or None if there are none."""
        calls: list[ir.Call] = []
        for e in exprs:
            _collectives(e, calls)
        if not calls:
            return None
        items = []
        for call in calls:
            if id(call) not in self.hoisted:
                self.hoisted[id(call)] = self.slot(f"%collective{len(self.hoisted)}")
            slot = self.hoisted[id(call)]
            self.sites += 1
            args = tuple(self.expr(a) for a in call.args)
            items.append((self.sites, call.fn, slot, args, call))

        def pre(th: Thread) -> Generator:
            for site, fn, slot, args, node in items:
                vals = tuple(f(th) for f in args)
                th.regs[slot] = yield from collective(th, site, fn, vals, node)

        return pre


# ----------------------------------------------------------------------------- helpers


def _direct_exprs(s: ir.Stmt) -> list[ir.Expr]:
    """The expressions a statement evaluates before anything else it does (a While's
    condition is evaluated per iteration, by the loop itself)."""
    if isinstance(s, ir.If):
        return [s.cond]
    if isinstance(s, ir.For):
        return [s.start, s.stop, s.step]
    if isinstance(s, ir.While):
        return []
    return subexprs(s)  # type: ignore[arg-type]


def _collectives(e: ir.Expr, out: list[ir.Call]) -> None:
    for x in subexprs(e):
        _collectives(x, out)
    if isinstance(e, ir.Call) and e.fn in COLLECTIVES and all(c is not e for c in out):
        out.append(e)


def _touches_smem(e: ir.Expr) -> bool:
    return isinstance(e.type, T.SharedRef) or any(_touches_smem(x) for x in subexprs(e))


def _let(c: Program, s: ir.Let) -> Step:
    slot = c.slot(s.name)
    if isinstance(s.var_type, T.RegArray):  # a list, updated in place element by element
        n = s.var_type.n
        if s.value is None:
            fill = scalar.zero(s.var_type.elem)
            return PLAIN, False, lambda th: th.regs.__setitem__(slot, [fill] * n)
        fill = c.expr(s.value)(None)  # type: ignore[arg-type]

        def init(th: Thread) -> None:
            th.regs[slot] = [fill] * n
            c.written(th, s.name, s)

        return PLAIN, False, init
    if s.value is None:
        z = scalar.zero(s.var_type)
        return PLAIN, False, lambda th: th.regs.__setitem__(slot, z)
    v = c.expr(s.value)
    return PLAIN, False, lambda th: th.regs.__setitem__(slot, v(th))


def _assign(c: Program, s: ir.Assign) -> Step:
    slot, v = c.slots[s.name], c.expr(s.value)
    return PLAIN, False, lambda th: th.regs.__setitem__(slot, v(th))


def _set_elem(c: Program, s: ir.SetElem) -> Step:
    slot, i, v = c.slots[s.name], c.expr(s.index), c.expr(s.value)
    if s.name in c.reg_arrays:
        def set_array(th: Thread) -> None:
            arr = th.regs[slot]
            if not isinstance(arr, list):
                arr.touched(th, s)  # an accumulator that a wgmma still owns
            arr[i(th)] = v(th)
            c.written(th, s.name, s)

        return PLAIN, False, set_array

    def set_elem(th: Thread) -> None:
        vec = list(th.regs[slot])
        vec[i(th)] = v(th)
        th.regs[slot] = tuple(vec)

    return PLAIN, False, set_elem


def _store(c: Program, s: ir.Store) -> Step:
    t = s.value.type
    _, write = scalar.codec(t)
    n, v = t.nbytes, c.expr(s.value)  # type: ignore[attr-defined]
    if isinstance(s.ref, ir.Peer):
        where, _ = peer_place(c, s.ref)

        def peer_store(th: Thread) -> None:
            cta, o = where(th)
            if isinstance(t, T.Vector):
                check_aligned(th, o, n, s)
            if cta is th.cta:
                th.cta.smem.write(th, o, n, write, v(th), s)
            else:
                remote_write(th, cta, o, n, write, v(th), s)

        return PLAIN, True, peer_store
    if isinstance(s.ref.type, T.SharedRef):
        off, _ = c.shared_place(s.ref)
        vec = isinstance(t, T.Vector)

        def sstore(th: Thread) -> None:
            o = off(th)
            if vec:
                check_aligned(th, o, n, s)
            th.cta.smem.write(th, o, n, write, v(th), s)

        return PLAIN, True, sstore
    addr, esize = c.global_place(s.ref)

    def gstore(th: Thread) -> None:
        mv, o = th.cta.gmem.locate(th, addr(th), n, esize, s, "store", align=n)
        write(mv, o, v(th))
        th.cta.gmem.bump()

    return PLAIN, False, gstore


def _if(c: Program, s: ir.If) -> Step:
    cond = c.expr(s.cond)
    (tm, then), (em, orelse) = c.block(s.then), c.block(s.orelse)
    if tm == em == PLAIN:
        return PLAIN, False, lambda th: then(th) if cond(th) else orelse(th)
    tg, eg = as_gen(tm, then), as_gen(em, orelse)

    def branch(th: Thread) -> Generator:
        yield from (tg(th) if cond(th) else eg(th))

    return GEN, False, branch


def _for(c: Program, s: ir.For) -> Step:
    """`for` as the emitter writes it: bounds evaluated once, exit when i >= stop (i <= stop
    for a negative constant step), i += step wrapping at the type width."""
    start, stop, step = c.expr(s.start), c.expr(s.stop), c.expr(s.step)
    slot, wrap = c.slot(s.var), scalar.wrapper(s.var_type)
    down = isinstance(s.step, ir.Const) and s.step.value < 0
    mode, body = c.block(s.body)

    def plain(th: Thread) -> None:
        i, hi, inc = start(th), stop(th), step(th)
        regs, tick = th.regs, th.cta.tick
        th.loops.append(s)
        while not (i <= hi if down else i >= hi):
            tick(th)
            regs[slot] = i
            body(th)
            i = wrap(i + inc)
        th.loops.pop()

    if mode == PLAIN:
        return PLAIN, False, plain

    def gen(th: Thread) -> Generator:
        i, hi, inc = start(th), stop(th), step(th)
        th.loops.append(s)
        while not (i <= hi if down else i >= hi):
            th.cta.tick(th)
            th.regs[slot] = i
            yield from body(th)
            i = wrap(i + inc)
        th.loops.pop()

    return GEN, False, gen


def _while(c: Program, s: ir.While) -> Step:
    pre = c.prelude([s.cond])
    cond = c.expr(s.cond)
    body = as_gen(*c.block(s.body))
    spin = _is_spin(s)

    def loop(th: Thread) -> Generator:
        th.loops.append(s)
        gmem = th.cta.gmem
        while True:
            th.cta.tick(th)
            yield PREEMPT  # a spinning loop must let the threads it waits for run
            if pre is not None:
                yield from pre(th)
            epoch = gmem.epoch
            if not cond(th):
                break
            if spin and gmem.epoch == epoch:
                # nothing was written since the condition read global memory: it would read
                # the same again, so wait for a write (by any CTA) instead of spinning
                th.wait = (s, gmem.watch, None)
                while gmem.epoch == epoch:
                    yield gmem.watch
                th.wait = None
            yield from body(th)
        th.loops.pop()

    return GEN, False, loop


def _is_spin(s: ir.While) -> bool:
    """A loop with an empty body whose condition reads global memory and nothing else that
    changes on its own (shared memory, clocks): it can only end after a global write."""
    if s.body:
        return False
    found = False
    todo = [s.cond]
    while todo:
        e = todo.pop()
        if isinstance(e, (ir.Atomic, ir.AtomicLoad)) or (
                isinstance(e, ir.Load) and isinstance(e.ref.type, T.GlobalRef)):
            found = True
        changing = isinstance(e.type, T.SharedRef) or \
            isinstance(e, ir.SReg) and e.name in ("clock", "clock64", "globaltimer") or \
            isinstance(e, ir.Call) and e.fn in COLLECTIVES
        if changing:
            return False
        todo.extend(subexprs(e))
    return found


def _return(c: Program, s: ir.Return) -> Step:
    def ret(th: Thread) -> None:
        raise ThreadExit(s)

    return PLAIN, False, ret


def _setmaxnreg(c: Program, s: ir.SetMaxNReg) -> Step:
    return PLAIN, False, lambda th: None  # registers are not a resource here


def _asm(c: Program, s: ir.Asm) -> Step:
    def asm(th: Thread) -> None:
        fail("unsupported", "the interpreter cannot run asm blocks", s)

    return PLAIN, False, asm


_STMT: dict[type, Callable[[Program, Any], Step]] = {
    ir.Let: _let, ir.Assign: _assign, ir.SetElem: _set_elem, ir.Store: _store, ir.If: _if,
    ir.For: _for, ir.While: _while, ir.Return: _return, ir.SetMaxNReg: _setmaxnreg,
    ir.Asm: _asm,
}  # fmt: skip
