"""Fences and named barriers: fence.proxy.async, fence.mbarrier_init, bar.sync, bar.arrive;
and grid dependency control (griddepcontrol.wait / .launch_dependents)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from .. import ir
from ..interp.cta import Thread
from ..interp.errors import fail
from ..interp.program import GEN, PLAIN, Program, Step
from ..opdef import Effect, ErrorFn, OpDef, const_int, register


@register
class FenceProxyAsync(OpDef):
    node = ir.FenceProxyAsync
    sm80 = "drop"

    def emit(self, e, n: ir.FenceProxyAsync) -> None:
        e.w.instr("fence.proxy.async.shared::cta")

    def interp(self, c: Program, n: ir.FenceProxyAsync) -> Step:
        def fence(th: Thread) -> None:  # a full proxy fence also covers barrier inits
            th.fence_inits()
            if c.track_proxy:
                th.cta.smem.fence(th)

        return PLAIN, False, fence


@register
class FenceMBarrierInit(OpDef):
    node = ir.FenceMBarrierInit
    sm80 = "drop"

    def emit(self, e, n: ir.FenceMBarrierInit) -> None:
        e.w.instr("fence.mbarrier_init.release.cluster")

    def interp(self, c: Program, n: ir.FenceMBarrierInit) -> Step:
        # Publication to other threads is modelled by the barrier that must follow the fence;
        # to peer CTAs, by the cluster barrier that must follow it (interp/cluster.py).
        def fence(th: Thread) -> None:
            th.fence_inits()
            for bars in th.cta.barriers.values():
                for b in bars:
                    if b.initialised and b.init_tid == th.tid:
                        th.cta.cluster_fenced.add((id(b), b.base))

        return PLAIN, False, fence


def _check_named(n: ir.BarSync | ir.BarArrive, err: ErrorFn) -> None:
    i = const_int(n.id)
    if i is not None and not 0 <= i <= 15:
        err(f"a named barrier id must be in [0, 15], got {i}", n.id.loc or n.loc)
    c = const_int(n.nthreads) if n.nthreads is not None else None
    if c is not None and (c <= 0 or c % 32):
        err(f"a barrier thread count must be a positive multiple of 32, got {c}",
            n.nthreads.loc or n.loc)  # type: ignore[union-attr]


def _bar_count(th: Thread, count: int, node: Any) -> int:
    if count <= 0 or count % 32 or count > th.cta.nthreads:
        fail("barrier", f"{th.name}: a barrier thread count must be a positive multiple of 32 "
             f"no larger than the CTA ({th.cta.nthreads} threads), got {count}", node)
    return count


def _named(th: Thread, bid: int, node: Any) -> Any:
    if not 0 <= bid <= 15:
        fail("barrier", f"{th.name}: a named barrier id must be in [0, 15], got {bid}", node)
    return th.cta.named[bid]


@register
class BarSync(OpDef):
    node = ir.BarSync
    effect = Effect(named_barrier="id", publishes=True)
    sm80 = "keep"
    operands = (("id", "u32", False), ("nthreads", "u32", True))

    def check(self, n: ir.BarSync, err: ErrorFn) -> None:
        _check_named(n, err)

    def emit(self, e, n: ir.BarSync) -> None:
        extra = [e.ev(n.nthreads)] if n.nthreads is not None else []
        e.w.instr("bar.sync", e.ev(n.id), *extra)

    def interp(self, c: Program, n: ir.BarSync) -> Step:
        bid = c.expr(n.id)
        count = c.expr(n.nthreads) if n.nthreads is not None else None

        def sync(th: Thread) -> Generator:
            nb = _named(th, bid(th), n)
            gen = nb.arrive(th, _bar_count(th, count(th), n) if count is not None
                            else th.cta.nthreads, n)
            if nb.generation == gen:
                th.wait = (n, nb, None)
                while nb.generation == gen:
                    yield nb
            th.cta.clocks.acquire(th.tid, nb.released[gen])

        return GEN, True, sync


@register
class BarArrive(OpDef):
    node = ir.BarArrive
    effect = Effect(named_barrier="id", publishes=True)
    sm80 = "keep_one"
    operands = (("id", "u32", False), ("nthreads", "u32", False))

    def check(self, n: ir.BarArrive, err: ErrorFn) -> None:
        _check_named(n, err)

    def emit(self, e, n: ir.BarArrive) -> None:
        e.w.instr("bar.arrive", e.ev(n.id), e.ev(n.nthreads))

    def interp(self, c: Program, n: ir.BarArrive) -> Step:
        bid, count = c.expr(n.id), c.expr(n.nthreads)

        def arrive(th: Thread) -> None:
            _named(th, bid(th), n).arrive(th, _bar_count(th, count(th), n), n)

        return PLAIN, True, arrive


@register
class GridDepWait(OpDef):
    node = ir.GridDepWait
    sm80 = "drop"

    def emit(self, e, n: ir.GridDepWait) -> None:
        e.w.instr("griddepcontrol.wait")

    def interp(self, c: Program, n: ir.GridDepWait) -> Step:
        # the interpreter runs launches one after another: the earlier grid is complete
        return PLAIN, False, lambda th: None


@register
class GridDepLaunch(OpDef):
    node = ir.GridDepLaunch
    sm80 = "drop"

    def emit(self, e, n: ir.GridDepLaunch) -> None:
        e.w.instr("griddepcontrol.launch_dependents")

    def interp(self, c: Program, n: ir.GridDepLaunch) -> Step:
        return PLAIN, False, lambda th: None
