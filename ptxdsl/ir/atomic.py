"""Global-memory atomics and ordered accesses: the building blocks of grid-level
synchronisation (semaphores, counters, flags) between CTAs.

`atomic_<op>(place, ...)` and `ld_acquire(place)` are expressions (their value is the old
value, or the one loaded); `st_release(place, value)`, `fence_proxy_async_global()` and
`fence_cta()` are statements. The memory order and scope are written as bare words in the call
(`atomic_add(sem[t], 1, acq_rel, gpu)`); the tables below say which PTX accepts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .core import Expr, For, If, Node, Op, Role, Stmt, While

ORDERS = ("relaxed", "acquire", "release", "acq_rel")
SCOPES = ("cta", "cluster", "gpu", "sys")
LOAD_ORDERS = ("relaxed", "acquire")

# operation -> element type -> PTX type suffix (ptxas 13.0, sm_90: `atom.<sem>.<scope>.global`)
ATOMIC_TYPES: dict[str, dict[str, str]] = {
    "add": {"u32": "u32", "s32": "s32", "u64": "u64", "f32": "f32", "f64": "f64"},
    "min": {t: t for t in ("u32", "s32", "u64", "s64")},
    "max": {t: t for t in ("u32", "s32", "u64", "s64")},
    "inc": {"u32": "u32"},
    "dec": {"u32": "u32"},
    **{op: {t: f"b{t[1:]}" for t in ("u32", "s32", "b32", "u64", "s64", "b64")}
       for op in ("and", "or", "xor", "exch", "cas")},
}
ATOMIC_OPS = tuple(ATOMIC_TYPES)


@dataclass(frozen=True, slots=True, kw_only=True)
class Atomic(Expr):
    """`atom.<sem>.<scope>.global.<op>.<type> d, [ref], b{, c}`: an atomic read-modify-write
    of one global element; the value is the element's old value. `args` is (b,) or, for
    cas, (compare, new)."""

    op: str
    ref: Expr
    args: tuple[Expr, ...]
    sem: str = "relaxed"
    scope: str = "gpu"

    @property
    def syntax(self) -> str:
        return f"atomic_{self.op}"


@dataclass(frozen=True, slots=True, kw_only=True)
class AtomicLoad(Expr):
    """`ld.<sem>.<scope>.global.<type> d, [ref]` with sem acquire (`ld_acquire`) or relaxed
    (`ld_relaxed`): a load that takes part in the memory model's synchronisation."""

    ref: Expr
    sem: str = "acquire"
    scope: str = "gpu"

    @property
    def syntax(self) -> str:
        return f"ld_{self.sem}"


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreRelease(Op):
    """`st.release.<scope>.global.<type> [ref], value`: publish this thread's earlier writes
    (and what it acquired) to whoever acquires the value."""

    syntax: ClassVar[str] = "st_release"
    ref: Expr
    value: Expr
    scope: str = "gpu"


@dataclass(frozen=True, slots=True, kw_only=True)
class FenceProxyAsyncGlobal(Op):
    """`fence.proxy.async.global`: order generic-proxy accesses to global memory with
    async-proxy (TMA / bulk) accesses of this thread."""

    syntax: ClassVar[str] = "fence_proxy_async_global"


@dataclass(frozen=True, slots=True, kw_only=True)
class FenceCta(Op):
    """`fence.acq_rel.cta`: a CTA-scope fence. Besides ordering this thread's memory accesses,
    it pins the schedule: ptxas (13.0, as its SASS shows; PTX promises only the ordering)
    moves no `wgmma_wait` above it. Written just before a
    `wgmma_wait`, it keeps the work between the last issue and the wait overlapping the
    groups in flight; without it ptxas may hoist the wait above that work (to start
    instructions that follow the wait sooner), which then waits for the tensor cores."""

    syntax: ClassVar[str] = "fence_cta"


def releases(s: Stmt) -> list[Node]:
    """The release operations a statement performs itself (in its own expressions, not in
    nested bodies): `st_release` and atomics with release or acq_rel order."""
    if isinstance(s, StoreRelease):
        return [s]
    if isinstance(s, (If, While)):
        todo: list[Expr] = [s.cond]
    elif isinstance(s, (For, Role)):
        return []
    else:
        todo = [x for f in s.__dataclass_fields__ for x in _exprs(getattr(s, f))]
    out: list[Node] = []
    while todo:
        e = todo.pop()
        if isinstance(e, Atomic) and e.sem in ("release", "acq_rel"):
            out.append(e)
        todo.extend(x for f in e.__dataclass_fields__ for x in _exprs(getattr(e, f)))
    return out


def _exprs(v: object) -> list[Expr]:
    if isinstance(v, Expr):
        return [v]
    return [x for x in v if isinstance(x, Expr)] if isinstance(v, tuple) else []


ATOMIC_FUNCTIONS = frozenset({f"atomic_{op}" for op in ATOMIC_OPS} | {"ld_acquire", "ld_relaxed"})

__all__ = ["ATOMIC_FUNCTIONS", "ATOMIC_OPS", "ATOMIC_TYPES", "LOAD_ORDERS", "ORDERS", "SCOPES",
           "Atomic", "AtomicLoad", "FenceCta", "FenceProxyAsyncGlobal", "StoreRelease", "releases"]
