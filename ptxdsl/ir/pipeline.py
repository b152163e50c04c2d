"""Pipelines and the operations on them (`pipeline NAME stages N {...}`, `acquire`,
`commit`, `wait`, `release`, stage buffers and barriers), register reallocation and the
role barrier: lowered to the statements of `core` by ptxdsl.lower.pipelines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .core import Expr, Op, SharedDecl, Stmt


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineDecl(Stmt):
    """N stages of shared buffers with a full and an empty mbarrier per stage. Arrival counts,
    expect_tx bytes, stage index and phase are derived by the compiler."""

    name: str
    stages: int
    buffers: tuple[SharedDecl, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineObj(Expr):
    """A declared pipeline (type PipelineRef)."""

    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StageBuf(Expr):
    """The current stage of a pipeline buffer for one side: "put" between acquire and
    commit, "get" between wait and release (the stage waited last, where a release lags)."""

    pipe: str
    buf: str
    side: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StageIndex(Expr):
    """The current stage index (u32) of a pipeline side (`ring.stage`)."""

    pipe: str
    side: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StageBarrier(Expr):
    """The full barrier of the producer's current stage: where stage copies complete."""

    pipe: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Acquire(Op):
    """Producer: wait until the current stage is empty (`mbarrier.try_wait.parity` on its
    empty barrier, phase derived)."""

    syntax: ClassVar[str] = "acquire"
    pipe: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class Commit(Op):
    """Producer: `mbarrier.arrive.expect_tx` on the stage's full barrier with the bytes of the
    copies issued since acquire; advance to the next stage."""

    syntax: ClassVar[str] = "commit"
    pipe: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class Wait(Op):
    """Consumer: wait until the next stage is full (it may still hold earlier ones)."""

    syntax: ClassVar[str] = "wait"
    pipe: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class Release(Op):
    """Consumer: `mbarrier.arrive` on the empty barrier of the oldest stage it holds (after
    this thread's bulk stores from the stage have been read); advance to the next stage."""

    syntax: ClassVar[str] = "release"
    pipe: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class RoleSync(Op):
    """`bar.sync id, nthreads` among the threads of the enclosing role (id allocated)."""

    syntax: ClassVar[str] = "role_sync"


@dataclass(frozen=True, slots=True, kw_only=True)
class SetMaxNReg(Stmt):
    """`setmaxnreg.{inc,dec}.sync.aligned.u32 regs` (sm_90a)."""

    regs: int
    inc: bool
