"""Thread-block clusters: cluster barriers, distributed shared memory (views of a peer CTA's
shared memory and mbarriers), remote completion and multicast copies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .core import Expr, Op

__all__ = [
    "BulkCopyCluster", "BulkLoadMulticast", "ClusterArrive", "ClusterArriveRelaxed",
    "ClusterSync", "ClusterWait", "Peer", "StAsync", "TensorLoadMulticast",
]  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class Peer(Expr):
    """The place `ref` (a shared element, view or mbarrier of this CTA) in the CTA of cluster
    rank `rank`: `mapa.shared::cluster.u32 %r, addr, rank` (type PeerShared / PeerBarrier)."""

    ref: Expr
    rank: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterArrive(Op):
    """`barrier.cluster.arrive.release`: this thread's arrival on the cluster barrier."""

    syntax: ClassVar[str] = "cluster_arrive"


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterArriveRelaxed(Op):
    """`barrier.cluster.arrive.relaxed`: an arrival that orders no memory accesses."""

    syntax: ClassVar[str] = "cluster_arrive_relaxed"


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterWait(Op):
    """`barrier.cluster.wait.acquire`: wait until every thread of the cluster has arrived."""

    syntax: ClassVar[str] = "cluster_wait"


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSync(Op):
    """`barrier.cluster.arrive.release` then `barrier.cluster.wait.acquire`."""

    syntax: ClassVar[str] = "cluster_sync"


@dataclass(frozen=True, slots=True, kw_only=True)
class StAsync(Op):
    """`st.async.shared::cluster.mbarrier::complete_tx::bytes.<type> [dst], value, [bar]`:
    a store into a peer's shared memory that completes its bytes on the peer's mbarrier."""

    syntax: ClassVar[str] = "st_async"
    dst: Expr
    value: Expr
    bar: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkCopyCluster(Op):
    """`cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [dst], [src],
    nbytes, [bar]`: this CTA's shared memory into a peer's, completing on the peer's mbarrier."""

    syntax: ClassVar[str] = "bulk_copy_cluster"
    dst: Expr
    src: Expr
    bar: Expr
    nbytes: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorLoadMulticast(Op):
    """`cp.async.bulk.tensor.Nd.shared::cluster.global.tile.mbarrier::complete_tx::bytes
    .multicast::cluster [dst], [tmap, {coords}], [bar], mask`: the tile lands at the same
    offset in every CTA of the 16-bit rank mask, completing on each one's own `bar`."""

    syntax: ClassVar[str] = "tma_load_multicast"
    dst: Expr
    tmap: Expr
    coords: tuple[Expr, ...]
    mask: Expr
    bar: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkLoadMulticast(Op):
    """`cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster
    [dst], [src], nbytes, [bar], mask`: a 1D bulk load delivered to every CTA of the mask."""

    syntax: ClassVar[str] = "bulk_load_multicast"
    dst: Expr
    src: Expr
    mask: Expr
    bar: Expr
    nbytes: Expr
