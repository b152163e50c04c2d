"""Reading an operation's effect (`OpDef.effect`, see `ptxdsl.opdef`): its operands by role,
as the checks see them."""

from __future__ import annotations

import numpy as np

from .. import ir
from ..opdef import effect
from .threads import BarRef, SmemRef, Visit
from .values import Known, Val


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
