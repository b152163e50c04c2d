"""Ampere `cp.async` in the interpreter: per-thread copies, their commit groups, and the
arrive-on that `cp.async.mbarrier.arrive[.noinc]` triggers once a thread's copies are done.

A copy is in flight from its issue until it lands; reading or writing its destination in
between is a race. It lands either when its thread waits for it (`cp_async_wait(n)` /
`cp_async_wait_all()`: the bytes count as written by that thread, now) or, when an arrive-on
tracks it, at a moment the scheduler picks before that arrive-on happens (the bytes count as
delivered in the barrier's current phase, visible to whoever observes that phase complete).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import fail, note

if TYPE_CHECKING:
    from .cta import CTA, Thread
    from .mbarrier import MBarrier


class CpCopy:
    """One cp.async of 4, 8 or 16 bytes global -> shared."""

    __slots__ = ("id", "op", "node", "cta", "dst", "fetch", "landed", "tracker", "hint")

    def __init__(self, cta: CTA, node: Any, dst: slice, fetch: Callable[[], np.ndarray]):
        self.id = cta.new_copy_id()
        self.op = node.syntax
        self.node, self.cta, self.dst, self.fetch = node, cta, dst, fetch
        self.landed = False
        self.tracker: ArriveOn | None = None
        self.hint = ("cp_async_wait / cp_async_wait_all, or wait on the mbarrier a "
                     "cp_async_mbarrier_arrive of its thread completes")

    def land(self, agent: int, clock: int) -> None:
        smem = self.cta.smem
        smem.deliver(self, self.dst, self.fetch(), agent, clock)  # type: ignore[arg-type]
        smem.end_load(self)  # type: ignore[arg-type]
        self.landed = True


class CpState:
    """The cp.async of one thread: the open (uncommitted) ones, the committed groups."""

    __slots__ = ("open", "groups")

    def __init__(self) -> None:
        self.open: list[CpCopy] = []
        self.groups: list[list[CpCopy]] = []

    def pending(self) -> list[CpCopy]:
        return [c for g in self.groups for c in g if not c.landed] + \
            [c for c in self.open if not c.landed]


def state(th: Thread) -> CpState:
    table = th.cta.__dict__.setdefault("cp_async_state", {})
    s = table.get(th.tid)
    if s is None:
        s = table[th.tid] = CpState()
    return s


def issue(th: Thread, copy: CpCopy) -> None:
    vc = th.cta.clocks.release(th.tid)
    th.cta.smem.begin_load(th, copy, vc)  # type: ignore[arg-type]
    state(th).open.append(copy)


def commit(th: Thread) -> None:
    s = state(th)
    s.groups.append(s.open)
    s.open = []


def _land_waited(th: Thread, copies: list[CpCopy]) -> None:
    for c in copies:
        if c.landed:
            continue
        if c.tracker is not None:
            b = c.tracker.bar
            c.land(b.agent, b.delivery_clock())
        else:
            c.land(th.tid, int(th.cta.clocks.vc[th.tid, th.tid]))


def wait_group(th: Thread, n: int) -> None:
    s = state(th)
    k = max(len(s.groups) - n, 0)
    for g in s.groups[:k]:
        _land_waited(th, g)
    del s.groups[:k]


def wait_all(th: Thread) -> None:
    s = state(th)
    for g in s.groups:
        _land_waited(th, g)
    _land_waited(th, s.open)
    s.groups.clear()
    s.open = []


class ArriveOn:
    """The arrive-on of `cp.async.mbarrier.arrive[.noinc]`: lands the thread's prior copies,
    then arrives on the barrier with what the thread had published at the instruction."""

    __slots__ = ("id", "op", "node", "cta", "bar", "copies", "vc", "issuer")

    def __init__(self, th: Thread, node: Any, bar: MBarrier, noinc: bool):
        bar.check_use(th, node, "arrives on")
        if not noinc:
            bar.pending += 1  # the pending count is raised before the arrive-on
        self.id = th.cta.new_copy_id()
        self.op, self.node, self.cta, self.bar, self.issuer = node.syntax, node, th.cta, bar, th
        self.copies = state(th).pending()
        for c in self.copies:
            if c.tracker is None:
                c.tracker = self
        self.vc = th.cta.clocks.release(th.tid)
        bar.copies += 1
        th.cta.inflight.append(self)  # type: ignore[arg-type]

    def step(self) -> bool:
        while self.copies:
            c = self.copies.pop(self.cta.rng.randrange(len(self.copies)))
            if not c.landed:
                b = c.tracker.bar if c.tracker is not None else self.bar
                c.land(b.agent, b.delivery_clock())
                return False
        b = self.bar
        if b.pending < 1:
            fail("mbarrier", f"too many arrivals: the {self.op} of {self.issuer.name} arrives on "
                 f"{b.label}, but {b.label} is in {b.state()}", self.node,
                 note(f"'{b.label}' was initialised here", b.init_node))
        np.maximum(b.pending_vc, self.vc, out=b.pending_vc)
        b.pending -= 1
        b.copies -= 1
        b._advance()
        return True
