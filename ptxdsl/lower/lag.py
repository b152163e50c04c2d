"""Lagging releases: how many stages of a pipeline a consumer holds at each wait.

A consumer that keeps a wgmma group in flight waits on the next stage before it releases the
one the previous group read: `wait(ring)` takes the next full stage and `release(ring)` hands
back the oldest stage it holds (first in, first out). The builder closes every region in the
block that opens it (each block releases as many stages as it waits on), so the number held
at a statement is a constant of the program text: the waits minus the releases of the
enclosing blocks before it, the same on every path and in every iteration.

`lagging_pipes` finds the pipelines where some wait runs while a stage is still held; such a
pipeline keeps a separate release cursor (see pipelines.py). It reports a wait while every
stage is held: the producer can fill no stage until one is released, and the consumer
releases only after its wait, so both would wait forever.
"""

from __future__ import annotations

from .. import ir
from ..errors import DiagnosticBag, Note, Span


class _Held:
    def __init__(self, stages: dict[str, int], diags: DiagnosticBag):
        self.stages = stages
        self.diags = diags
        self.lagging: set[str] = set()

    def block(self, stmts: tuple[ir.Stmt, ...], held: dict[str, list[Span | None]]) -> None:
        held = {name: list(locs) for name, locs in held.items()}
        for s in stmts:
            if isinstance(s, ir.Wait):
                self.wait(s, held.setdefault(s.pipe.name, []))  # type: ignore[attr-defined]
            elif isinstance(s, ir.Release):
                held[s.pipe.name].pop(0)  # type: ignore[attr-defined]
            else:
                for b in ir.blocks(s):
                    self.block(b, held)

    def wait(self, s: ir.Wait, locs: list[Span | None]) -> None:
        name = s.pipe.name  # type: ignore[attr-defined]
        if locs:
            self.lagging.add(name)
        n = self.stages[name]
        if len(locs) >= n:
            self.diags.error(f"wait({name}) while this role holds all {n} stage(s) of '{name}': "
                             "the producer cannot fill another stage until one is released, so "
                             "this wait never completes; release a stage before it or give "
                             f"'{name}' more stages", s.loc,
                             *[Note(f"stage held since this wait({name})", w) for w in locs])
        locs.append(s.loc)


def lagging_pipes(body: tuple[ir.Stmt, ...], stages: dict[str, int],
                  diags: DiagnosticBag) -> set[str]:
    """The pipelines some role waits on again while it holds a stage of; a wait that can
    never complete goes to `diags`."""
    held = _Held(stages, diags)
    held.block(body, {})
    return held.lagging
