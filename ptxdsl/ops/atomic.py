"""Global atomics and ordered accesses (`atom`, `ld.acquire`, `st.release`) and the global
proxy fence: what grid-level synchronisation (a split-K semaphore, a flag, a counter) is
built from.

The interpreter runs the atomics one at a time, so every one sees the latest value; their
orders decide which plain stores of other CTAs a thread may then read (`interp.gorder`). A
spin loop on global memory waits for another CTA's write instead of burning steps (see
`interp.program._while` and `interp.run.run_grid`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import ir
from .. import types as T
from ..interp import scalar
from ..interp.cta import Thread
from ..interp.program import PLAIN, Program, Step
from ..opdef import ErrorFn, ExprDef, OpDef, register, register_expr


def _ptx_type(e: ir.Atomic) -> str:
    return ir.ATOMIC_TYPES[e.op][e.type.name]  # type: ignore[attr-defined]


def _update(op: str, t: T.Scalar) -> Callable[..., Any]:
    """old, *operands -> the value an atomic leaves behind."""
    wrap = scalar.normaliser(t)
    rules: dict[str, Callable[..., Any]] = {
        "add": lambda old, b: wrap(old + b),
        "min": min,
        "max": max,
        "inc": lambda old, b: 0 if old >= b else wrap(old + 1),
        "dec": lambda old, b: b if old == 0 or old > b else old - 1,
        "and": lambda old, b: old & b,
        "or": lambda old, b: old | b,
        "xor": lambda old, b: wrap(old ^ b),
        "exch": lambda old, b: b,
        "cas": lambda old, cmp, new: new if old == cmp else old,
    }
    return rules[op]


@register_expr
class AtomicDef(ExprDef):
    node = ir.Atomic

    def emit(self, e: Any, n: ir.Atomic) -> str:
        _, a = e.addr(n.ref)
        args = [e.ev(x) for x in n.args]
        r = e.w.reg(n.type)
        e.w.instr(f"atom.{n.sem}.{n.scope}.global.{n.op}.{_ptx_type(n)}", r, a, *args)
        return r

    def interp(self, c: Program, n: ir.Atomic) -> Callable[[Thread], Any]:
        t = n.type
        assert isinstance(t, T.Scalar)
        read, write = scalar.codec(t)
        addr, esize = c.global_place(n.ref)
        args = [c.expr(x) for x in n.args]
        update = _update(n.op, t)

        def atomic(th: Thread) -> Any:
            a = addr(th)
            mv, o = th.cta.gmem.locate(th, a, t.nbytes, esize, n, n.syntax)
            th.cta.gmem.strong(th, a, t.nbytes, n.sem, n.scope)
            old = read(mv, o)
            new = update(old, *(f(th) for f in args))
            if new != old:
                write(mv, o, new)
                th.cta.gmem.bump()
            return old

        return atomic


@register_expr
class AtomicLoadDef(ExprDef):
    node = ir.AtomicLoad

    def emit(self, e: Any, n: ir.AtomicLoad) -> str:
        _, a = e.addr(n.ref)
        r = e.w.reg(n.type)
        e.w.instr(f"ld.{n.sem}.{n.scope}.global.{n.type}", r, a)
        return r

    def interp(self, c: Program, n: ir.AtomicLoad) -> Callable[[Thread], Any]:
        t = n.type
        read, _ = scalar.codec(t)
        addr, esize = c.global_place(n.ref)

        def load(th: Thread) -> Any:
            a = addr(th)
            mv, o = th.cta.gmem.locate(th, a, t.nbytes, esize, n, n.syntax)  # type: ignore[attr-defined]
            if n.sem == "acquire" and th.cta.gmem.order is not None:
                th.cta.gmem.order.ordered(th, n.sem, n.scope, a)
            return read(mv, o)

        return load


@register
class StoreRelease(OpDef):
    node = ir.StoreRelease
    sm80 = "keep_one"
    operands = (("ref", "gref", False), ("value", "val", False), ("scope", "scope", True))

    def derive(self, values: dict[str, Any], loc: Any) -> str | None:
        if values["scope"] is None:
            values["scope"] = "gpu"
        v, elem = values["value"], values["ref"].type.elem
        if isinstance(v, ir.Const) and isinstance(v.value, int) and elem.is_int:
            values["value"] = ir.Const(value=v.value, type=elem, loc=v.loc)  # a literal: typed
        return None                                                          # by the place

    def omitted(self, n: ir.StoreRelease, name: str) -> bool:
        return n.scope == "gpu"

    def check(self, n: ir.StoreRelease, err: ErrorFn) -> None:
        elem, t = n.ref.type.elem, n.value.type  # type: ignore[attr-defined]
        if not isinstance(t, T.Scalar) or t.nbytes not in (4, 8) or t.is_pred:
            err(f"st_release stores 32- or 64-bit scalars, got {t}", n.value.loc or n.loc)
        elif t != elem and not (t.nbytes == elem.nbytes and t.is_int and elem.is_int):
            err(f"st_release stores {t} into {elem} memory; the types must match",
                n.value.loc or n.loc)

    def emit(self, e: Any, n: ir.StoreRelease) -> None:
        _, a = e.addr(n.ref)
        t = n.ref.type.elem  # type: ignore[attr-defined]
        e.w.instr(f"st.release.{n.scope}.global.{t}", a, e.ev_reg(n.value))

    def interp(self, c: Program, n: ir.StoreRelease) -> Step:
        t = n.ref.type.elem  # type: ignore[attr-defined]
        _, write = scalar.codec(t)
        addr, esize = c.global_place(n.ref)
        v = c.expr(n.value)

        def store(th: Thread) -> None:
            a = addr(th)
            mv, o = th.cta.gmem.locate(th, a, t.nbytes, esize, n, n.syntax)
            th.cta.gmem.strong(th, a, t.nbytes, "release", n.scope)
            write(mv, o, v(th))
            th.cta.gmem.bump()

        return PLAIN, True, store


@register
class FenceProxyAsyncGlobal(OpDef):
    node = ir.FenceProxyAsyncGlobal
    sm80 = "drop"

    def emit(self, e: Any, n: ir.FenceProxyAsyncGlobal) -> None:
        e.w.instr("fence.proxy.async.global")

    def interp(self, c: Program, n: ir.FenceProxyAsyncGlobal) -> Step:
        # global memory is not modelled per proxy: the fence orders nothing the interpreter
        # could observe out of order
        return PLAIN, False, lambda th: None


@register
class FenceCta(OpDef):
    node = ir.FenceCta
    sm80 = "keep"

    def emit(self, e: Any, n: ir.FenceCta) -> None:
        e.w.instr("fence.acq_rel.cta")

    def interp(self, c: Program, n: ir.FenceCta) -> Step:
        # the interpreter runs each thread's accesses in program order: nothing to order
        return PLAIN, False, lambda th: None
