"""Lowering of one-shot asynchronous loads (`async name { copies }`, `await(name)`).

Derived exactly as a pipeline stage's full barrier is (see `ptxdsl.lower.pipelines`):
  - one mbarrier `name.bar`, expecting one arrival from each thread that runs the block;
  - each such thread arms it, before its copies, with `mbarrier.arrive.expect_tx` and the
    bytes those copies deliver;
  - it is initialised in the kernel prologue with the pipelines' barriers, fenced, and
    published with `bar.sync 0`;
  - `await(name)` waits on parity 0, the only phase it ever completes: the block may not run
    in a loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import ir
from .. import types as T
from ..errors import DiagnosticBag, Note, Span


@dataclass
class _Load:
    stmt: ir.AsyncLoad
    threads: int = 0
    nbytes: int = 0


@dataclass
class OneShots:
    """Facts about every one-shot load of a kernel, and their rewrites."""

    diags: DiagnosticBag
    loads: dict[str, _Load] = field(default_factory=dict)

    def analyse(self, stmts: tuple[ir.Stmt, ...], path: list, loop: ir.Stmt | None,
                role_cond: Callable[[ir.Role], ir.Expr],
                threads: Callable[[list, ir.Stmt], frozenset[int]],
                copy_bytes: Callable[[Any], int]) -> None:
        for s in stmts:
            if isinstance(s, ir.Role):
                self.analyse(s.body, path + [(role_cond(s), True)], loop, role_cond, threads,
                             copy_bytes)
            elif isinstance(s, ir.If):
                self.analyse(s.then, path + [(s.cond, True)], loop, role_cond, threads,
                             copy_bytes)
                self.analyse(s.orelse, path + [(s.cond, False)], loop, role_cond, threads,
                             copy_bytes)
            elif isinstance(s, (ir.For, ir.While)):
                self.analyse(s.body, path, s, role_cond, threads, copy_bytes)
            elif not isinstance(s, ir.AsyncLoad):
                for b in ir.blocks(s):
                    self.analyse(b, path, loop, role_cond, threads, copy_bytes)
            else:
                load = self.loads[s.name] = _Load(s)
                if loop is not None:
                    self.diags.error(f"async '{s.name}' is a one-shot load, but it is inside a "
                                     "loop: its barrier completes one phase only; use a "
                                     "pipeline to load in a loop", s.loc,
                                     Note("the loop", loop.loc))
                load.threads = len(threads(path, s))
                if load.threads == 0:
                    self.diags.error(f"no thread runs async '{s.name}', so await({s.name}) "
                                     "would wait forever", s.loc)
                self.count_bytes(load, s.body, copy_bytes, direct=True)

    def count_bytes(self, load: _Load, stmts: tuple[ir.Stmt, ...],
                    copy_bytes: Callable[[Any], int], direct: bool) -> None:
        for s in stmts:
            bar = getattr(s, "bar", None)
            if isinstance(bar, ir.AsyncBarrier):
                if not direct:
                    self.diags.error(f"a copy of async '{load.stmt.name}' must be a statement "
                                     "of the block itself (not inside an if or a loop), so the "
                                     "bytes it delivers can be derived", s.loc)
                else:
                    load.nbytes += copy_bytes(s)
            for b in ir.blocks(s):
                self.count_bytes(load, b, copy_bytes, direct=False)

    def bar(self, name: str) -> ir.Expr:
        return ir.BarrierObj(name=f"{name}.bar", type=T.BarrierRef(0))

    def decls(self) -> list[ir.Stmt]:
        return [ir.BarrierDecl(name=f"{n}.bar", n=0, count=max(1, x.threads), loc=x.stmt.loc)
                for n, x in self.loads.items()]

    def inits(self) -> list[ir.Stmt]:
        return [ir.MBarrierInit(bar=self.bar(n), loc=x.stmt.loc) for n, x in self.loads.items()]

    def expand(self, s: ir.AsyncLoad, lower_body: Callable[[tuple[ir.Stmt, ...]],
                                                          tuple[ir.Stmt, ...]]) -> list[ir.Stmt]:
        """The block: arm the barrier with the bytes of this thread's copies, then issue them."""
        nbytes = self.loads[s.name].nbytes
        arm = ir.MBarrierArriveExpectTx(bar=self.bar(s.name),
                                        nbytes=ir.Const(value=nbytes, type=T.u32), loc=s.loc)
        return [arm, *lower_body(s.body)]

    def wait(self, s: ir.AsyncAwait, role: str, loc: Span | None) -> ir.Stmt:
        return ir.MBarrierWait(bar=self.bar(s.load.name),  # type: ignore[attr-defined]
                               parity=ir.Const(value=0, type=T.u32), role=role, loc=loc)
