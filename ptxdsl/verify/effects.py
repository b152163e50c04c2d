"""What each intrinsic does to barriers and shared memory, as the checks see it.

A new operation (TMA reduce, multicast, ...) is checked by adding its row here: the checks
read operand roles from this table, never from the operation classes themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import ir
from .threads import BarRef, SmemRef, Visit
from .values import Known, Val


@dataclass(frozen=True)
class Effect:
    """Operand roles of one operation; each names a field of the IR node (or is None)."""

    arrive: str | None = None  # arrives on this barrier (once, or `count` times)
    count: str | None = None  # arrivals per thread for `arrive`, expected ones for `init`
    expect: str | None = None  # raises this barrier's tx count by `size` bytes
    complete: str | None = None  # the copy completes its bytes on this barrier
    wait: str | None = None
    parity: str | None = None
    init: str | None = None
    inval: str | None = None
    async_read: str | None = None  # shared operand read by the async proxy (bulk group)
    async_write: str | None = None  # shared operand written by the async proxy
    global_operand: str | None = None
    size: str | None = None  # byte count; a copy without one moves its whole shared view
    tma: bool = False  # tensor copy: 128-byte aligned shared operand, box limits
    one_thread: bool = False  # meant to be issued by one thread

    @property
    def barrier_fields(self) -> tuple[str, ...]:
        return tuple(f for f in (self.arrive, self.expect, self.complete, self.wait, self.init,
                                 self.inval) if f is not None)

    @property
    def shared_operand(self) -> str | None:
        return self.async_read or self.async_write


EFFECTS: dict[type[ir.Stmt], Effect] = {
    ir.MBarrierInit: Effect(init="bar", count="count", one_thread=True),
    ir.MBarrierArrive: Effect(arrive="bar", count="count"),
    ir.MBarrierArriveExpectTx: Effect(arrive="bar", expect="bar", size="nbytes",
                                      one_thread=True),
    ir.MBarrierExpectTx: Effect(expect="bar", size="nbytes"),
    ir.MBarrierWait: Effect(wait="bar", parity="parity"),
    ir.MBarrierInval: Effect(inval="bar"),
    ir.BulkLoad: Effect(complete="bar", async_write="dst", global_operand="src", size="nbytes",
                        one_thread=True),
    ir.BulkStore: Effect(async_read="src", global_operand="dst", size="nbytes",
                         one_thread=True),
    ir.TensorLoad: Effect(complete="bar", async_write="dst", tma=True, one_thread=True),
    ir.TensorStore: Effect(async_read="src", tma=True, one_thread=True),
}
# TMA reductions are stores (bulk groups, proxy fences, buffer lifetimes); the peer-shared
# form completes on an mbarrier like a load into its destination.
for _node in ir.VARIANTS.values():
    if issubclass(_node, ir.BulkReduce):
        EFFECTS[_node] = EFFECTS[ir.BulkStore]
    elif issubclass(_node, ir.TensorReduce):
        EFFECTS[_node] = EFFECTS[ir.TensorStore]
    else:
        EFFECTS[_node] = Effect(complete="bar", async_write="dst", size="nbytes", one_thread=True)

NO_EFFECT = Effect()


def effect(s: ir.Stmt) -> Effect:
    return EFFECTS.get(type(s), NO_EFFECT)


def bar(v: Visit, role: str | None) -> BarRef | None:
    """The barrier operand named by an effect role (None if absent or not a declared one)."""
    if role is None:
        return None
    b = v.args.get(role)
    return b if isinstance(b, BarRef) else None


def smem(v: Visit, role: str | None) -> SmemRef | None:
    if role is None:
        return None
    s = v.args.get(role)
    return s if isinstance(s, SmemRef) else None


def val(v: Visit, role: str | None) -> Val | None:
    """A scalar operand named by an effect role."""
    if role is None:
        return None
    x = v.args.get(role)
    return x if isinstance(x, Val) else None


def op_name(s: ir.Stmt) -> str:
    return getattr(s, "syntax", "") or type(s).__name__.lower()


def issuers(v: Visit) -> int:
    return int(v.must.sum())


def duplicated(v: Visit, n: int) -> bool:
    """Whether two threads that certainly execute `v` use the same barrier and shared
    operands (global operands and coordinates are rarely known, and a shared destination
    written twice is the problem anyway). A place the verifier does not model (a pipeline
    stage before lowering: each thread may fill its own part) proves nothing."""
    e = effect(v.stmt)
    if e.shared_operand and e.shared_operand in v.args and v.args[e.shared_operand] is None:
        return False
    keys = []
    for arg in v.args.values():
        k: Known | None
        if isinstance(arg, BarRef):
            k, same = arg.per_thread(n), arg.index is None or arg.index.is_uniform
        elif isinstance(arg, SmemRef):
            k, same = arg.offset.known, arg.offset.is_uniform
        else:
            continue
        if k is None:
            if not same:
                return False
            k = 0  # unknown, but the same in every thread
        keys.append(np.broadcast_to(np.asarray(k, dtype=np.int64), (n,))[v.must])
    if not keys:
        return issuers(v) > 1
    rows = np.stack(keys, axis=1)
    return len(np.unique(rows, axis=0)) < rows.shape[0]
