"""Lowering of cluster pipelines: pipelines whose stage copies are multicast to a group of
CTAs of the cluster (`tma_load_multicast` / `bulk_load_multicast` into a stage buffer).

Every CTA of a group issues its share of a stage to the whole group, so each CTA's stage
fills with what all G members deliver:
  - the full barrier's commit arms the bytes of the group, G x the CTA's own copies;
  - a stage may be refilled only when the consumers of every CTA that receives it are done:
    `release` arrives on the empty barrier of each CTA of the group (remote arrivals), whose
    count is G x the local releasing arrivals;
  - the barriers are published to the cluster (fence_mbarrier_init, then cluster_sync) before
    any peer may multicast into or arrive on them, and the kernel ends with cluster_sync, so no
    CTA leaves while its peers may still write its shared memory or arrive on its barriers.
Groups must partition the cluster symmetrically: the mask is cluster_mask(), a constant
naming every CTA, or a cluster_row_mask() / cluster_col_mask() group.
"""

from __future__ import annotations

from math import prod

from .. import ir
from .. import types as T


def group_size(mask: ir.Expr, cluster: tuple[int, int, int] | None) -> int | None:
    """How many CTAs each CTA of a symmetric group mask receives from; None if unknown."""
    n = prod(cluster or (1, 1, 1))
    if isinstance(mask, ir.Const) and isinstance(mask.value, int):
        return n if mask.value == (1 << n) - 1 else None
    if isinstance(mask, ir.Cast):
        mask = mask.x
    if isinstance(mask, ir.Binary) and mask.op == "shl" and isinstance(mask.a, ir.Const) \
            and _only_cluster_regs(mask.b):
        return bin(int(mask.a.value)).count("1")
    return None


def _only_cluster_regs(e: ir.Expr) -> bool:
    if isinstance(e, ir.Const):
        return True
    if isinstance(e, ir.SReg):
        return e.name.startswith("cluster_")
    if isinstance(e, (ir.Binary,)):
        return _only_cluster_regs(e.a) and _only_cluster_regs(e.b)
    if isinstance(e, ir.Cast):
        return _only_cluster_regs(e.x)
    return False


def remote_release(empty: ir.Expr, mask: ir.Expr, cluster: tuple[int, int, int] | None,
                   loc) -> ir.Stmt:
    """`mbarrier_arrive(peer(empty, r))` for every rank r of the mask."""
    n = prod(cluster or (1, 1, 1))
    r = ir.Var(name="mcast.rank", type=T.u32)
    arrive = ir.MBarrierArrive(bar=ir.Peer(ref=empty, rank=r, type=T.PeerBarrier(0)),
                               reads_only=True, loc=loc)
    if isinstance(mask, ir.Const):
        body: tuple[ir.Stmt, ...] = (arrive,)
    else:
        m32 = ir.Cast(x=mask, type=T.u32)
        bit = ir.Binary(op="and", a=ir.Binary(op="shr", a=m32, b=r, type=T.u32),
                        b=ir.Const(value=1, type=T.u32), type=T.u32)
        cond = ir.Compare(op="ne", a=bit, b=ir.Const(value=0, type=T.u32), type=T.pred)
        body = (ir.If(cond=cond, then=(arrive,), orelse=(), loc=loc),)
    return ir.For(var=r.name, var_type=T.u32, start=ir.Const(value=0, type=T.u32),
                  stop=ir.Const(value=n, type=T.u32), step=ir.Const(value=1, type=T.u32),
                  body=body, unroll=True, loc=loc)
