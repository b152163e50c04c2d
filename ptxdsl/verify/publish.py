"""Shared-memory data a CTA's peers read after a cluster barrier is published by that
barrier only if its arrival released it: `cluster_arrive_relaxed()` orders no memory, so a
write before it (to this CTA's shared memory, which peers then read, or to a peer's, which
that peer then reads) is not visible to the other CTA after the wait.

The walk follows the body in source order: writes since the last releasing arrival are
pending; a relaxed arrival leaves them unpublished, and the wait that completes it exposes
them to cross-CTA reads until a releasing barrier (cluster_arrive(), cluster_sync())."""

from __future__ import annotations

from .. import ir
from ..errors import Note
from .effects import effect
from .facts import Facts, Report, text
from .ranks import RankEval
from .remote import root

Write = tuple[str, bool]  # (buffer, through peer())


def check_cluster_publication(facts: Facts, out: Report) -> None:
    shared = {d.name for d in facts.kernel.body if isinstance(d, ir.SharedDecl)}
    pending: dict[Write, ir.Stmt] = {}  # written since this thread's last releasing arrival
    unpublished: dict[Write, ir.Stmt] = {}  # pending at a relaxed arrival
    relaxed: ir.Stmt | None = None
    exposed: dict[Write, ir.Stmt] = {}  # unpublished, and the wait has returned
    for s in facts.statements:
        barrier = effect(s).cluster_barrier
        if barrier == "sync" or (barrier == "arrive" and not
                                 isinstance(s, ir.ClusterArriveRelaxed)):
            pending, unpublished, relaxed, exposed = {}, {}, None, {}
            continue
        if barrier == "arrive":
            unpublished, relaxed = dict(pending), s
            continue
        if barrier == "wait":
            exposed = unpublished
            continue
        if exposed and relaxed is not None:
            for load in ir.exprs_of(s, ir.Load):
                name = root(load.ref) or ""
                peer = ir.has_expr(load.ref, ir.Peer)
                # a peer reads what its owner wrote, or what anyone wrote into it remotely;
                # a CTA reads locally what a peer wrote into it
                hit = exposed.get((name, True)) if not peer else \
                    exposed.get((name, False)) or exposed.get((name, True))
                if hit is not None:
                    out.error(f"'{text(load)}' reads what another CTA wrote to '{name}' "
                              "before its cluster_arrive_relaxed(), which orders no memory: "
                              "the cluster wait does not make that write visible here (arrive "
                              "with cluster_arrive(), which releases, or cluster_sync())",
                              load.loc or s.loc,
                              Note(f"'{name}' is written here, before the arrival",
                                   hit.loc),
                              Note("the relaxed arrival is here", relaxed.loc))
                    exposed = {}
                    break
        if isinstance(s, ir.Store) and (written := root(s.ref) or "") in shared:
            pending[(written, ir.has_expr(s.ref, ir.Peer))] = s


def check_remote_handoffs(facts: Facts, out: Report) -> None:
    """A remote arrival hands the data stored before it into a peer's shared memory to that
    peer: it must go to the CTA the stores went to. Stores through `peer(buf, a)` since the
    last arrival or cluster barrier, then `mbarrier_arrive(peer(bar, b))` with `b` a
    different rank than every such `a` in some CTA of the cluster: the stores' owner is told
    by nobody, and the barrier's owner reads data that was not handed to it (the counts may
    balance all the same)."""
    ev = RankEval(facts.kernel)
    ranks = list(range(ev.shape[0] * ev.shape[1] * ev.shape[2]))
    pending: list[tuple[ir.Stmt, ir.Expr]] = []  # peer stores, with their rank
    for s in facts.statements:
        if effect(s).cluster_barrier:
            pending = []
            continue
        if isinstance(s, ir.Store) and isinstance(peer := _peer(s.ref), ir.Peer):
            pending.append((s, peer.rank))
            continue
        bar = getattr(s, effect(s).arrive or "", None)
        if not pending or not isinstance(bar, ir.Peer):
            continue
        to = dict(ev.over_cluster(bar.rank, ranks))
        stores = [(st, dict(ev.over_cluster(rank, ranks))) for st, rank in pending]
        if not to or any(not where or where == to for _, where in stores):
            pending = [(st, rank) for (st, rank), (_, where) in zip(pending, stores, strict=True)
                       if where != to]  # handed over (or undecided): told
            continue
        st, where = stores[0]
        r = next(r for r in ranks if where[r] != to[r])
        out.error(f"this arrival tells the CTA of cluster rank {to[r]} (in the CTA of rank "
                  f"{r}), but the stores before it went to rank {where[r]}: the CTA that reads "
                  "them is not told, and the one told reads data not handed to it",
                  s.loc, Note("the store into the peer is here", st.loc))
        pending = []


def _peer(ref: ir.Expr) -> ir.Peer | None:
    while isinstance(ref, ir.Index):
        ref = ref.base
    return ref if isinstance(ref, ir.Peer) else None
