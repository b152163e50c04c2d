"""One-shot asynchronous loads: `async name { copies }` and `await(name)`.

The block's copies complete on one mbarrier that lowering derives (`ptxdsl.lower.oneshot`):
its arrival count from the threads that run the block, its transaction bytes from the
copies, its init and fence in the kernel prologue, and the parity (0) that `await` waits on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .core import Expr, Op, Stmt

__all__ = ["AsyncAwait", "AsyncBarrier", "AsyncLoad", "AsyncObj"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AsyncLoad(Stmt):
    """`async name { ... }`: the copies in `body` that name no barrier complete on the load's
    derived mbarrier, armed with `mbarrier.arrive.expect_tx` and their byte total."""

    name: str
    body: tuple[Stmt, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class AsyncObj(Expr):
    """A declared one-shot load (type AsyncRef), the operand of `await`."""

    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class AsyncBarrier(Expr):
    """The derived mbarrier of one-shot load `name`: where the copies of its block complete."""

    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class AsyncAwait(Op):
    """`await(name)`: wait until every copy of the one-shot load has landed
    (`mbarrier.try_wait.parity` on its barrier, parity 0)."""

    syntax: ClassVar[str] = "await"
    load: Expr
