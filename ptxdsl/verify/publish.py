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
            for load in _loads(s):
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


def _loads(s: ir.Stmt) -> list[ir.Load]:
    out: list[ir.Load] = []
    stack: list[object] = [getattr(s, name) for name in ir.node_fields(s)]
    while stack:
        x = stack.pop()
        if isinstance(x, tuple):
            stack.extend(x)
        elif isinstance(x, ir.Load):
            out.append(x)
        elif isinstance(x, ir.Node):
            stack.extend(getattr(x, name) for name in ir.node_fields(x))
    return out
