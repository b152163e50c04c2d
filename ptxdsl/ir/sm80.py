"""Ampere (sm_80) asynchronous copies: `cp.async`, its groups, its mbarrier arrivals, and the
mbarrier wait that exists on sm_80 (`test_wait`).

Kernels may write them by hand; `ptxdsl.lower.sm80` also produces them when it lowers the
Hopper bulk and tensor copies of a kernel compiled for `--arch sm_80`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .core import Expr, Op

__all__ = ["CpAsync", "CpAsyncCg", "CpAsyncCommit", "CpAsyncWait", "CpAsyncWaitAll",
           "CpAsyncArrive", "CpAsyncArriveNoinc", "MBarrierTestWait", "TensorDescFields"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CpAsync(Op):
    """`cp.async.ca.shared.global [dst], [src], nbytes{, src_bytes}`: copy 4, 8 or 16 bytes
    global -> shared, asynchronously; only `src_bytes` are read, the rest is zero-filled."""

    syntax: ClassVar[str] = "cp_async"
    cache: ClassVar[str] = "ca"
    dst: Expr
    src: Expr
    nbytes: Expr | None = None
    src_bytes: Expr | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CpAsyncCg(Op):
    """`cp.async.cg.shared.global [dst], [src], 16{, src_bytes}`: a 16-byte copy that bypasses
    L1 (cached in L2 only)."""

    syntax: ClassVar[str] = "cp_async_cg"
    cache: ClassVar[str] = "cg"
    dst: Expr
    src: Expr
    nbytes: Expr | None = None
    src_bytes: Expr | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CpAsyncCommit(Op):
    """`cp.async.commit_group`: this thread's cp.async since the last commit form a group."""

    syntax: ClassVar[str] = "cp_async_commit"


@dataclass(frozen=True, slots=True, kw_only=True)
class CpAsyncWait(Op):
    """`cp.async.wait_group n`: at most the newest n groups of this thread still pending."""

    syntax: ClassVar[str] = "cp_async_wait"
    n: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class CpAsyncWaitAll(Op):
    """`cp.async.wait_all`: every cp.async of this thread (committed or not) has completed."""

    syntax: ClassVar[str] = "cp_async_wait_all"


@dataclass(frozen=True, slots=True, kw_only=True)
class CpAsyncArrive(Op):
    """`cp.async.mbarrier.arrive.shared::cta.b64 [bar]`: one arrive-on `bar` once this thread's
    prior cp.async have completed; the pending count is raised by one first, so the barrier's
    expected count is unchanged."""

    syntax: ClassVar[str] = "cp_async_mbarrier_arrive"
    bar: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class CpAsyncArriveNoinc(Op):
    """`cp.async.mbarrier.arrive.noinc.shared::cta.b64 [bar]`: one arrive-on `bar` once this
    thread's prior cp.async have completed, counted in the barrier's expected arrivals."""

    syntax: ClassVar[str] = "cp_async_mbarrier_arrive_noinc"
    bar: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class MBarrierTestWait(Op):
    """A loop on `mbarrier.test_wait.parity.shared::cta.b64` (sm_80; try_wait is sm_90)
    until the phase of parity `parity` has completed."""

    syntax: ClassVar[str] = "mbarrier_test_wait"
    bar: Expr
    parity: Expr
    role: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorDescFields(Op):
    """sm_80 stand-in for a tensor map (made by lowering only): load the fields of the
    tensor descriptor passed in the tensor-map parameter `tmap` into registers named
    `prefix.base` (ptr), `prefix.dim<i>`, `prefix.stride<i>` (elements, u64; i innermost
    first) and `prefix.swizzle` (u32 mask of the 16-byte-chunk swizzle)."""

    syntax: ClassVar[str] = "__tensor_desc_fields"
    tmap: Expr
    prefix: str = ""
