"""TMA reductions: `cp.reduce.async.bulk[.tensor]` combine a shared-memory tile into global
memory (or a peer CTA's shared memory) element by element as they store it.

One node class per (form, operation): `bulk_reduce_add`, `tma_reduce_max`, ... The operation
is the class's `op`; the element type comes from the shared-memory operand (or the tensor
map), so the PTX type suffix, including `.noftz` for f16/bf16 add, is derived.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .core import Expr, Op

REDUCE_OPS = ("add", "min", "max", "inc", "dec", "and", "or", "xor")


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkReduce(Op):
    """`cp.reduce.async.bulk.global.shared::cta.bulk_group.<op>.<type> [dst], [src], nbytes`:
    global[dst ..] op= shared[src ..], completing in the thread's bulk async-group."""

    op: ClassVar[str] = ""
    dst: Expr
    src: Expr
    nbytes: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorReduce(Op):
    """`cp.reduce.async.bulk.tensor.Nd.global.shared::cta.<op>.tile.bulk_group [tmap,
    {coords}], [src]`: the box at coords op= the shared tile (out-of-bounds parts dropped)."""

    op: ClassVar[str] = ""
    tmap: Expr
    coords: tuple[Expr, ...]
    src: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterReduce(Op):
    """`cp.reduce.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes.<op>.
    <type> [dst], [src], nbytes, [bar]`: `dst` (a `peer(place, rank)` view) op= shared[src ..],
    completing (complete_tx) on that CTA's mbarrier `bar` (`peer(bar, rank)`)."""

    op: ClassVar[str] = ""
    dst: Expr
    src: Expr
    bar: Expr
    nbytes: Expr


def _variant(base: type[Op], prefix: str, op: str) -> type[Op]:
    name = f"{base.__name__}{op.capitalize()}"
    cls = type(name, (base,), {"__doc__": f"{base.__doc__} (`.{op}`)", "__module__": __name__,
                               "__qualname__": name, "syntax": f"{prefix}_{op}", "op": op})
    return dataclass(frozen=True, slots=True, kw_only=True)(cls)


# bulk_reduce_add, ..., tma_reduce_add, ..., cluster_reduce_add, ...
VARIANTS: dict[str, type[Op]] = {}
for _base, _prefix in ((BulkReduce, "bulk_reduce"), (TensorReduce, "tma_reduce"),
                       (ClusterReduce, "cluster_reduce")):
    for _op in REDUCE_OPS:
        _cls = _variant(_base, _prefix, _op)
        VARIANTS[_cls.syntax] = _cls
        globals()[_cls.__name__] = _cls

__all__ = ["REDUCE_OPS", "VARIANTS", "BulkReduce", "ClusterReduce", "TensorReduce",
           *(c.__name__ for c in VARIANTS.values())]
