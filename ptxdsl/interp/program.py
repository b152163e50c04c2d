"""A kernel compiled for the interpreter, once: Python source for the whole body.

A thread runs the kernel as one generator function (`Code`): the IR statements are written
out as Python statements, their expressions inline (`exprs.render`), so straight-line code
and loops cost no calls per node. The function yields `PREEMPT` where the scheduler may switch
to other threads and copies (before statements that touch shared memory, and before the ops
that ask for it), and yields from an op's generator where the op may block.

An intrinsic op compiles to a Step `(mode, preempt, fn)` (`OpDef.interp`): `fn(thread)` runs
it, directly when `mode` is PLAIN or as a generator (`yield from`) when it is GEN because it
may block; `preempt` asks for a switch point before it. The body calls it.

Registers are a flat list per thread: the builder forbids shadowing a visible name, so one
slot per name is enough even when sibling scopes reuse it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, NoReturn

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
    aligned,
    barrier_place,
    check_aligned,
    compile_expr,
    element_index,
    global_address,
    global_place,
    peer_place,
    render,
    shared_offset,
    shared_place,
    subexprs,
    touched,
    wrapped,
)
from .source import Source
from .sync import collective

PLAIN, GEN = 0, 1
Step = tuple[int, bool, Callable[[Thread], Any]]

# Nested blocks past this depth become functions of their own: Python allows 20 nested
# loops in one function, and its parser only so many levels of indentation.
MAX_DEPTH = 8


def as_gen(mode: int, fn: Callable[[Thread], Any]) -> Callable[[Thread], Generator]:
    """`fn` as a generator function, whatever its mode."""
    if mode == GEN:
        return fn

    def gen(th: Thread) -> Generator:
        fn(th)
        yield from ()

    return gen


class Code:
    """The lines of one generated function, and whether it yields (a generator)."""

    def __init__(self) -> None:
        self.src = Source()
        self.src.regs = "regs"  # a thread keeps its register list: a local of the function
        self.lines = ["regs = th.regs"]
        self.depth = 0
        self.yields = False

    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def preempt(self) -> None:
        """A switch point: other threads and copies may act here."""
        self.line(f"yield {self.src.bind(PREEMPT)}")
        self.yields = True

    def block(self, emit: Callable[[], None]) -> None:
        """The lines `emit` writes, one level deeper (`pass` if none)."""
        self.depth += 1
        n = len(self.lines)
        emit()
        if len(self.lines) == n:
            self.line("pass")
        self.depth -= 1


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
        self.nelems = {s.name: s.var_type.n for s in ir.walk(kernel.body) if isinstance(s, ir.Let)
                       and isinstance(s.var_type, (T.RegArray, T.Vector))}
        self.body = as_gen(*self.function(kernel.body))

    def scratch(self) -> list[Any]:
        """Fresh registers after the parameters."""
        return [None] * (len(self.slots) - self.nparams)

    def slot(self, name: str) -> int:
        return self.slots.setdefault(name, len(self.slots))

    expr = compile_expr
    shared_place = shared_place
    global_place = global_place
    barrier_place = barrier_place

    # ------------------------------------------------------------------ statements

    def function(self, stmts: tuple[ir.Stmt, ...]) -> tuple[int, Callable[[Thread], Any]]:
        """(GEN or PLAIN, fn): `fn(thread)` runs `stmts`, a generator when they may block or
        let others run."""
        code = Code()
        self.block(code, stmts)
        return (GEN if code.yields else PLAIN), code.src.function(code.lines)

    def block(self, code: Code, stmts: tuple[ir.Stmt, ...]) -> None:
        """Write `stmts` into `code` at its depth; past MAX_DEPTH, as a call of a function of
        their own."""
        if code.depth < MAX_DEPTH:
            self.stmts(code, stmts)
            return
        mode, fn = self.function(stmts)
        self.call(code, mode, fn)

    def stmts(self, code: Code, stmts: tuple[ir.Stmt, ...]) -> None:
        for s in stmts:
            if not isinstance(s, (ir.SharedDecl, ir.BarrierDecl)):
                self.stmt(code, s)

    def call(self, code: Code, mode: int, fn: Callable[[Thread], Any]) -> None:
        if mode == GEN:
            code.line(f"yield from {code.src.bind(fn)}(th)")
            code.yields = True
        else:
            code.line(f"{code.src.bind(fn)}(th)")

    def stmt(self, code: Code, s: ir.Stmt) -> None:
        """A switch point first if the statement touches shared memory (or is an op that
        asks for one), then its warp collectives, then the statement."""
        rule = _STMT.get(type(s))
        if rule is None and not isinstance(s, ir.Op):
            raise TypeError(f"the interpreter has no rule for {type(s).__name__}")
        exprs = _direct_exprs(s)
        pre = self.prelude(exprs)  # before the expressions that read the collectives' slots
        if rule is None:
            mode, preempt, fn = definition(s).interp(self, s)  # type: ignore[arg-type]
        else:
            preempt = _preempts(s)
        if preempt or any(_touches_smem(e) for e in exprs):
            code.preempt()
        self.collectives(code, pre)
        if rule is None:
            self.call(code, mode, fn)
        else:
            rule(self, code, s)

    def prelude(self, exprs: list[ir.Expr]) -> list[tuple[int, ir.Call, int]]:
        """The warp collectives inside `exprs` (innermost first), each with its site and the
        register slot its value goes to; compiled before the expressions that read them."""
        calls: list[ir.Call] = []
        for e in exprs:
            _collectives(e, calls)
        items = []
        for call in calls:
            if id(call) not in self.hoisted:
                self.hoisted[id(call)] = self.slot(f"%collective{len(self.hoisted)}")
            self.sites += 1
            items.append((self.sites, call, self.hoisted[id(call)]))
        return items

    def collectives(self, code: Code, items: list[tuple[int, ir.Call, int]]) -> None:
        """Evaluate the collectives of `prelude` into their slots, waiting for the warp."""
        src = code.src
        for site, call, slot in items:
            args = "".join(render(self, src, a) + ", " for a in call.args)
            code.line(f"regs[{slot}] = yield from {src.bind(collective)}(th, {site}, "
                      f"{call.fn!r}, ({args}), {src.bind(call)})")
            code.yields = True


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


def _preempts(s: ir.Stmt) -> bool:
    """Whether a statement other than an op is a switch point of its own: a store to shared
    memory, this CTA's or a peer's."""
    return isinstance(s, ir.Store) and (isinstance(s.ref, ir.Peer)
                                        or isinstance(s.ref.type, T.SharedRef))


def _written(code: Code, name: str, node: ir.Stmt) -> None:
    """A register array was written: a wgmma reading it needs a wgmma_fence first."""
    code.line(f"if th.wgmma is not None: th.wgmma.dirty[{name!r}] = {code.src.bind(node)}")


def _let(c: Program, code: Code, s: ir.Let) -> None:
    slot, src = c.slot(s.name), code.src
    if isinstance(s.var_type, T.RegArray):  # a list, updated in place element by element
        n = s.var_type.n
        if s.value is None:
            code.line(f"regs[{slot}] = [{src.bind(scalar.zero(s.var_type.elem))}] * {n}")
            return
        fill = c.expr(s.value)(None)  # type: ignore[arg-type]
        code.line(f"regs[{slot}] = [{src.bind(fill)}] * {n}")
        _written(code, s.name, s)
        return
    if s.value is None:
        code.line(f"regs[{slot}] = {src.bind(scalar.zero(s.var_type))}")
        return
    code.line(f"regs[{slot}] = {render(c, src, s.value)}")


def _assign(c: Program, code: Code, s: ir.Assign) -> None:
    code.line(f"regs[{c.slots[s.name]}] = {render(c, code.src, s.value)}")


def _set_elem(c: Program, code: Code, s: ir.SetElem) -> None:
    slot, src = c.slots[s.name], code.src
    # an accumulator that a wgmma still owns is reported before the value and then the
    # index (Python's order for `a[i] = v`) are evaluated
    i = element_index(c, src, s.index, c.nelems[s.name], s)
    v = render(c, src, s.value)
    t = src.temp()
    if s.name in c.reg_arrays:
        code.line(f"{t} = regs[{slot}]")
        code.line(f"if {t}.__class__ is not list: {src.bind(touched)}({t}, th, {src.bind(s)})")
        code.line(f"{t}[{i}] = {v}")
        _written(code, s.name, s)
        return
    code.line(f"{t} = list(regs[{slot}])")
    code.line(f"{t}[{i}] = {v}")
    code.line(f"regs[{slot}] = tuple({t})")


def _store(c: Program, code: Code, s: ir.Store) -> None:
    t, src = s.value.type, code.src
    _, write = scalar.codec(t)
    n, node, wr = t.nbytes, src.bind(s), src.bind(write)  # type: ignore[attr-defined]
    if isinstance(s.ref, ir.Peer):
        where, _ = peer_place(c, s.ref)
        v = c.expr(s.value)

        def peer_store(th: Thread) -> None:
            cta, o = where(th)
            if isinstance(t, T.Vector):
                check_aligned(th, o, n, s)
            if cta is th.cta:
                th.cta.smem.write(th, o, n, write, v(th), s)
            else:
                remote_write(th, cta, o, n, write, v(th), s)

        code.line(f"{src.bind(peer_store)}(th)")
        return
    if isinstance(s.ref.type, T.SharedRef):
        off, _ = shared_offset(c, src, s.ref)
        if isinstance(t, T.Vector):
            off = f"{src.bind(aligned)}(th, {off}, {n}, {node})"
        code.line(f"th.cta.smem.write(th, {off}, {n}, {wr}, {render(c, src, s.value)}, {node})")
        return
    addr, esize = global_address(c, src, s.ref)
    code.line(f"{wr}(*th.cta.gmem.locate(th, {addr}, {n}, {esize}, {node}, 'store', {n}, 'write'), "
              f"{render(c, src, s.value)})")
    code.line("th.cta.gmem.bump()")


def _if(c: Program, code: Code, s: ir.If) -> None:
    code.line(f"if {render(c, code.src, s.cond)}:")
    code.block(lambda: c.block(code, s.then))
    if s.orelse:
        code.line("else:")
        code.block(lambda: c.block(code, s.orelse))


def _for(c: Program, code: Code, s: ir.For) -> None:
    """`for` as the emitter writes it: bounds evaluated once, exit when i >= stop (i <= stop
    for a negative constant step), i += step wrapping at the type width."""
    src = code.src
    i, hi, inc = src.temp(), src.temp(), src.temp()
    code.line(f"{i}, {hi}, {inc} = {render(c, src, s.start)}, {render(c, src, s.stop)}, "
              f"{render(c, src, s.step)}")
    slot = c.slot(s.var)
    down = isinstance(s.step, ir.Const) and s.step.value < 0
    code.line(f"th.loops.append({src.bind(s)})")
    code.line(f"while not ({i} {'<=' if down else '>='} {hi}):")

    def body() -> None:
        code.line("th.cta.tick(th)")
        code.line(f"regs[{slot}] = {i}")
        c.block(code, s.body)
        code.line(f"{i} = {wrapped(f'({i} + {inc})', s.var_type)}")

    code.block(body)
    code.line("th.loops.pop()")


def _while(c: Program, code: Code, s: ir.While) -> None:
    src = code.src
    pre = c.prelude([s.cond])
    gmem, epoch, node = src.temp(), src.temp(), src.bind(s)
    code.line(f"th.loops.append({node})")
    code.line(f"{gmem} = th.cta.gmem")
    code.line("while True:")

    def body() -> None:
        code.line("th.cta.tick(th)")
        code.preempt()  # a spinning loop must let the threads it waits for run
        c.collectives(code, pre)
        code.line(f"{epoch} = {gmem}.epoch")
        code.line(f"if not {render(c, src, s.cond)}:")
        code.line("    break")
        if _is_spin(s):
            # nothing was written since the condition read global memory: it would read the
            # same again, so wait for a write (by any CTA) instead of spinning
            code.line(f"if {gmem}.epoch == {epoch}:")
            code.line(f"    th.wait = ({node}, {gmem}.watch, None)")
            code.line(f"    while {gmem}.epoch == {epoch}:")
            code.line(f"        yield {gmem}.watch")
            code.line("    th.wait = None")
            code.yields = True
        c.block(code, s.body)

    code.block(body)
    code.line("th.loops.pop()")


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


def _return(c: Program, code: Code, s: ir.Return) -> None:
    code.line(f"raise {code.src.bind(ThreadExit)}({code.src.bind(s)})")


def _setmaxnreg(c: Program, code: Code, s: ir.SetMaxNReg) -> None:
    pass  # registers are not a resource here


def _asm(c: Program, code: Code, s: ir.Asm) -> None:
    code.line(f"{code.src.bind(_unsupported)}({code.src.bind(s)})")


def _unsupported(s: ir.Asm) -> NoReturn:
    fail("unsupported", "the interpreter cannot run asm blocks", s)


_STMT: dict[type, Callable[[Program, Code, Any], None]] = {
    ir.Let: _let, ir.Assign: _assign, ir.SetElem: _set_elem, ir.Store: _store, ir.If: _if,
    ir.For: _for, ir.While: _while, ir.Return: _return, ir.SetMaxNReg: _setmaxnreg,
    ir.Asm: _asm,
}  # fmt: skip
