"""mbarrier operations: init, arrive, expect_tx, wait, inval."""

from __future__ import annotations

from collections.abc import Callable, Generator

from .. import ir
from .. import types as T
from ..interp.cluster import remote_arrive, remote_expect_tx
from ..interp.cta import Thread
from ..interp.errors import fail
from ..interp.program import GEN, PLAIN, Program, Step
from ..opdef import Effect, ErrorFn, OpDef, const_int, register
from ..target import MBARRIER_MAX_COUNT


def _count(c: Program, e: ir.Expr | None, default: int) -> Callable[[Thread], int]:
    return c.expr(e) if e is not None else (lambda th: default)


def _check_count(n: ir.MBarrierInit | ir.MBarrierArrive, err: ErrorFn) -> None:
    c = const_int(n.count)
    if c is not None and not 1 <= c <= MBARRIER_MAX_COUNT:
        err(f"an mbarrier count must be in [1, {MBARRIER_MAX_COUNT}], got {c}",
            n.count.loc or n.loc)  # type: ignore[union-attr]


def _check_tx(n: ir.MBarrierArriveExpectTx | ir.MBarrierExpectTx, err: ErrorFn) -> None:
    size = const_int(n.nbytes)
    if size is not None and size > MBARRIER_MAX_COUNT:
        err(f"one mbarrier phase tracks at most {MBARRIER_MAX_COUNT} bytes, got {size}",
            n.nbytes.loc or n.loc)


def check_parity(n: ir.MBarrierWait | ir.MBarrierTestWait, err: ErrorFn) -> None:
    """A constant parity is 0 or 1 (ptxas rejects any other immediate)."""
    p = const_int(n.parity)
    if p is not None and p not in (0, 1):
        err(f"an mbarrier phase parity is 0 or 1, got {p}", n.parity.loc or n.loc)


@register
class MBarrierInit(OpDef):
    node = ir.MBarrierInit
    effect = Effect(init="bar", count="count", one_thread=True)
    sm80 = "keep_one"
    operands = (("bar", "bar", False), ("count", "u32", True))

    def check(self, n: ir.MBarrierInit, err: ErrorFn) -> None:
        _check_count(n, err)

    def emit(self, e, n: ir.MBarrierInit) -> None:
        count = e.ev(n.count) if n.count is not None else str(e.decl_count(n.bar))
        e.w.instr("mbarrier.init.shared::cta.b64", e.bar_addr(n.bar), count)

    def interp(self, c: Program, n: ir.MBarrierInit) -> Step:
        bar = c.barrier_place(n.bar)
        base = n.bar.base if isinstance(n.bar, ir.Index) else n.bar
        count = _count(c, n.count, c.decls[base.name].count)  # type: ignore[attr-defined,union-attr]
        return PLAIN, True, lambda th: bar(th).init(th, count(th), n)


def _remote(n: ir.Expr) -> bool:
    """A barrier of a peer CTA (`peer(bar, rank)`): the `.cluster` / `shared::cluster` forms."""
    return isinstance(n, ir.Peer)


@register
class MBarrierArrive(OpDef):
    node = ir.MBarrierArrive
    effect = Effect(arrive="bar", count="count", publishes=True)
    operands = (("bar", "rbar", False), ("count", "u32", True))

    def check(self, n: ir.MBarrierArrive, err: ErrorFn) -> None:
        if n.count is not None:
            _check_count(n, err)

    def emit(self, e, n: ir.MBarrierArrive) -> None:
        extra = [e.ev(n.count)] if n.count is not None else []
        if _remote(n.bar) and n.reads_only:
            # A pipeline's consumers hand a stage back to the CTAs that multicast into it.
            # They only read the stage, and a release at any scope completes those reads
            # before the arrive; no write of theirs needs publishing to the peer. The
            # cluster-scope release would cost a fence per warp and stage (the 2 x 1 cluster
            # GEMM ran at 0.57x of its speed with it; CUTLASS's consumer release is the
            # same .release.cta arrive on the peer's barrier).
            e.w.instr("mbarrier.arrive.release.cta.shared::cluster.b64", "_",
                      e.bar_addr(n.bar), *extra)
            return
        if _remote(n.bar):
            e.w.instr("mbarrier.arrive.release.cluster.shared::cluster.b64", "_",
                      e.bar_addr(n.bar), *extra)
            return
        e.w.instr("mbarrier.arrive.release.cta.shared::cta.b64", "_", e.bar_addr(n.bar), *extra)

    def interp(self, c: Program, n: ir.MBarrierArrive) -> Step:
        bar, count = c.barrier_place(n.bar), _count(c, n.count, 1)
        if _remote(n.bar):
            return PLAIN, True, lambda th: remote_arrive(th, bar(th), count(th), n)
        return PLAIN, True, lambda th: bar(th).arrive(th, count(th), n)


@register
class MBarrierArriveExpectTx(OpDef):
    node = ir.MBarrierArriveExpectTx
    effect = Effect(arrive="bar", expect="bar", size="nbytes", one_thread=True, publishes=True)
    operands = (("bar", "rbar", False), ("nbytes", "u32", False))

    def check(self, n: ir.MBarrierArriveExpectTx, err: ErrorFn) -> None:
        _check_tx(n, err)

    def emit(self, e, n: ir.MBarrierArriveExpectTx) -> None:
        if _remote(n.bar):
            e.w.instr("mbarrier.arrive.expect_tx.release.cluster.shared::cluster.b64", "_",
                      e.bar_addr(n.bar), e.ev(n.nbytes))
            return
        e.w.instr("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64", "_",
                  e.bar_addr(n.bar), e.ev(n.nbytes))

    def interp(self, c: Program, n: ir.MBarrierArriveExpectTx) -> Step:
        bar, nbytes = c.barrier_place(n.bar), c.expr(n.nbytes)
        if _remote(n.bar):

            def remote(th: Thread) -> None:
                b = bar(th)
                remote_expect_tx(th, b, nbytes(th), n)
                remote_arrive(th, b, 1, n)

            return PLAIN, True, remote

        def arrive(th: Thread) -> None:
            b = bar(th)
            b.expect_tx(th, nbytes(th), n)  # the expect-tx part happens before the arrive-on
            b.arrive(th, 1, n)

        return PLAIN, True, arrive


@register
class MBarrierExpectTx(OpDef):
    node = ir.MBarrierExpectTx
    effect = Effect(expect="bar", size="nbytes")
    operands = (("bar", "rbar", False), ("nbytes", "u32", False))

    def check(self, n: ir.MBarrierExpectTx, err: ErrorFn) -> None:
        _check_tx(n, err)

    def emit(self, e, n: ir.MBarrierExpectTx) -> None:
        if _remote(n.bar):
            e.w.instr("mbarrier.expect_tx.relaxed.cluster.shared::cluster.b64",
                      e.bar_addr(n.bar), e.ev(n.nbytes))
            return
        e.w.instr("mbarrier.expect_tx.relaxed.cta.shared::cta.b64", e.bar_addr(n.bar),
                  e.ev(n.nbytes))

    def interp(self, c: Program, n: ir.MBarrierExpectTx) -> Step:
        bar, nbytes = c.barrier_place(n.bar), c.expr(n.nbytes)
        if _remote(n.bar):
            return PLAIN, True, lambda th: remote_expect_tx(th, bar(th), nbytes(th), n)
        return PLAIN, True, lambda th: bar(th).expect_tx(th, nbytes(th), n)


def emit_poll_loop(e, n: ir.MBarrierWait | ir.MBarrierTestWait, poll: str,
                   backoff_ns: int = 0) -> None:
    """Loop on `poll` (try_wait, or sm_80's test_wait) for the phase of parity `n.parity`,
    sleeping `backoff_ns` between polls when given."""
    w = e.w
    a, parity = e.bar_addr(n.bar), e.ev(n.parity)
    p = w.reg(T.pred)
    top = w.label("wait")
    w.place_label(top)
    w.instr(poll, p, a, parity)
    if backoff_ns:
        done = w.label("waited")
        w.instr("bra", done, guard=p)
        w.instr("nanosleep.u32", str(backoff_ns))
        w.instr("bra.uni", top)
        w.place_label(done)
    else:
        w.instr("bra", top, guard=f"!{p}")


@register
class MBarrierWait(OpDef):
    node = ir.MBarrierWait
    effect = Effect(wait="bar", parity="parity")
    operands = (("bar", "bar", False), ("parity", "u32", False))

    def check(self, n: ir.MBarrierWait, err: ErrorFn) -> None:
        check_parity(n, err)

    def emit(self, e, n: ir.MBarrierWait) -> None:
        if e.watchdog_ns:
            e.bounded_wait(n)
            return
        emit_poll_loop(e, n, "mbarrier.try_wait.parity.shared::cta.b64")

    def interp(self, c: Program, n: ir.MBarrierWait) -> Step:
        bar, parity = c.barrier_place(n.bar), c.expr(n.parity)

        def wait(th: Thread) -> Generator:
            b, p = bar(th), parity(th)
            b.check_use(th, n, "waits on")
            if p not in (0, 1):
                fail("mbarrier", f"{th.name} waits on {b.label} for parity {p}; a parity is 0 "
                     "or 1", n)
            if not b.done(p):
                th.wait = (n, b, p)
                while not b.done(p):
                    yield b
            b.acquire(th)

        return GEN, True, wait


@register
class MBarrierInval(OpDef):
    node = ir.MBarrierInval
    effect = Effect(inval="bar")
    sm80 = "keep_one"
    operands = (("bar", "bar", False),)

    def emit(self, e, n: ir.MBarrierInval) -> None:
        e.w.instr("mbarrier.inval.shared::cta.b64", e.bar_addr(n.bar))

    def interp(self, c: Program, n: ir.MBarrierInval) -> Step:
        bar = c.barrier_place(n.bar)
        return PLAIN, True, lambda th: bar(th).inval(th, n)
