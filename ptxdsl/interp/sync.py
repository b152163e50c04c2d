"""Thread synchronisation inside a CTA: named barriers (`bar.sync` / `bar.arrive`) and the
warp-collective intrinsics (`shfl.sync`, `elect.sync`, full mask 0xffffffff).

A collective waits until every live (not exited) lane of the warp has reached the same
call site, then computes every lane's result at once. Lanes that never arrive (divergence)
leave the others blocked, which the deadlock report shows.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import Note
from .errors import fail, id_ranges, threads_phrase

if TYPE_CHECKING:
    from .state import CTAState, ThreadState


class NamedBarrier:
    """One of the 16 CTA barriers of `bar.sync id{, nthreads}`; counts arriving threads."""

    __slots__ = ("id", "expected", "arrived", "generation", "waiters", "vc", "released")

    def __init__(self, bid: int):
        self.id = bid
        self.expected = 0  # 0 while idle
        self.arrived: list[int] = []
        self.generation = 0
        self.waiters: list[ThreadState] = []
        self.vc: Any = None  # join of the clocks the arrivals of this generation published
        self.released: dict[int, Any] = {}  # generation -> what its completion published

    def arrive(self, th: ThreadState, count: int, node: Any) -> int:
        """Count `th`'s arrival; returns the generation it arrived in (the barrier completes,
        and the generation advances, when `count` threads have arrived)."""
        cta = th.cta
        if self.expected and self.expected != count:
            fail("barrier", f"{th.name} arrives at barrier {self.id} expecting {count} threads "
                 f"while it is in use with a count of {self.expected}", node)
        gen = self.generation
        self.expected = count
        self.arrived.append(th.tid)
        vc = cta.clocks.release(th.tid)
        self.vc = vc if self.vc is None else np.maximum(self.vc, vc, out=self.vc)
        if len(self.arrived) == count:
            self.released = {g: v for g, v in self.released.items() if g >= gen - 2}
            self.released[gen] = self.vc
            self.generation += 1
            self.expected = 0
            self.arrived = []
            self.vc = None
            if self.waiters:
                cta.wake(self)
        return gen

    def explain(self, cta: CTAState, tids: list[int], detail: Any) -> tuple[str, list[Note]]:
        """Why threads `tids` are stuck here (for the deadlock report)."""
        missing = [t.tid for t in cta.threads if t.tid not in self.arrived]
        exited = [t for t in missing if cta.threads[t].exited]
        text = (f"{threads_phrase(tids, 'wait')} at barrier {self.id} for {self.expected} threads, "
                f"but only {len(self.arrived)} arrived")
        if self.expected == cta.nthreads and exited:
            text += f"; threads {id_ranges(exited)} have exited"
        return text, []


class Gather:
    """One execution of a warp-collective call site by the lanes of a warp."""

    __slots__ = ("fn", "node", "args", "results", "waiters")

    def __init__(self, fn: str, node: Any):
        self.fn = fn
        self.node = node
        self.args: dict[int, tuple[Any, ...]] = {}
        self.results: dict[int, Any] | None = None
        self.waiters: list[ThreadState] = []

    def explain(self, cta: CTAState, tids: list[int], detail: Any) -> tuple[str, list[Note]]:
        """Why lanes `tids` are stuck here (for the deadlock report)."""
        lanes = cta.threads[tids[0]].warp_threads
        absent = [t.tid for t in lanes if not t.exited and t.lane not in self.args]
        return (f"{threads_phrase(tids, 'wait')} in {self.fn}() for the rest of their warp, but "
                f"threads {id_ranges(absent)} never reach it (a warp collective needs every "
                "live lane of the warp)", [])


def collective(th: ThreadState, site: int, fn: str, args: tuple[Any, ...],
               node: Any) -> Generator[Any, None, Any]:
    """The value of a warp collective for `th`, once all live lanes have arrived."""
    gathers = th.warp_gathers
    g = gathers.get(site)
    if g is None:
        g = gathers[site] = Gather(fn, node)
    g.args[th.lane] = args
    finish(th.cta, th.warp_threads, gathers)
    if g.results is None:
        th.wait = (node, g, None)
        while g.results is None:
            yield g
    return g.results[th.lane]


def finish(cta: CTAState, lanes: Sequence[ThreadState], gathers: dict[int, Gather]) -> None:
    """Complete every gather of a warp that all live lanes have reached (also called when a
    lane exits)."""
    live = [t.lane for t in lanes if not t.exited]
    for site, g in list(gathers.items()):
        # (with fewer arrivals than live lanes, one is surely missing)
        if len(g.args) >= len(live) and all(lane in g.args for lane in live):
            g.results = _compute(g, lanes)
            cta.clocks.sync([lanes[lane].tid for lane in g.args])  # the warp has converged
            del gathers[site]
            if g.waiters:
                cta.wake(g)


def _compute(g: Gather, lanes: Sequence[ThreadState]) -> dict[int, Any]:
    args = g.args
    if g.fn == "elect":
        leader = min(args)
        return {lane: lane == leader for lane in args}
    if g.fn == "gather":  # every lane sees every lane's value (wgmma's A fragments)
        everyone = {lane: v[0] for lane, v in args.items()}
        return {lane: everyone for lane in args}
    out = {}
    for lane, (v, b) in args.items():
        if g.fn == "shfl_idx":
            src = b & 31
        elif g.fn == "shfl_xor":
            src = lane ^ b
        elif g.fn == "shfl_down":
            src = lane + b
        else:
            src = lane - b
        if not 0 <= src < 32:  # out of the segment: shfl.sync returns the lane's own value
            out[lane] = v
        elif src in args:
            out[lane] = args[src][0]
        else:
            fail("warp", f"{lanes[lane].name} reads lane {src} with {g.fn}(), but that lane has "
                 "exited or does not exist", g.node)
    return out
