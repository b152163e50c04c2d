"""Which barriers and statements of a kernel reach other CTAs of its cluster (shared by the
thread trace, which leaves such barriers to the cluster checks, and by those checks)."""

from __future__ import annotations

from dataclasses import dataclass

from .. import ir
from .. import types as T
from ..opdef import effect


def root(e: ir.Expr) -> str | None:
    """The declared name under a place (`bars[i]` -> "bars")."""
    while isinstance(e, (ir.Index, ir.Peer)):
        e = e.base if isinstance(e, ir.Index) else e.ref
    return getattr(e, "name", None)


def _peers(x: object, out: list[ir.Peer]) -> None:
    if isinstance(x, tuple):
        for y in x:
            _peers(y, out)
        return
    if isinstance(x, ir.Peer):
        out.append(x)
    if isinstance(x, ir.Node):
        for name in ir.node_fields(x):
            v = getattr(x, name)
            if isinstance(v, (ir.Node, tuple)):
                _peers(v, out)


def peers_of(s: ir.Stmt) -> list[ir.Peer]:
    """The peer() places in a statement's operands (nested bodies left out)."""
    out: list[ir.Peer] = []
    _peers(s, out)
    return out


def remote_uses(s: ir.Stmt, peers: list[ir.Peer] | None = None) -> list[str]:
    """Barriers of peer CTAs that statement `s` uses (a multicast completes on the barrier
    of the same name in every CTA of its mask); `peers`: its peer() places, if known."""
    if peers is None:
        peers = peers_of(s)
    out = [n for p in peers if isinstance(p.type, T.PeerBarrier) and
           (n := root(p.ref)) is not None]
    if effect(s).multicast and (n := root(s.bar)) is not None:  # type: ignore[attr-defined]
        out.append(n)
    return out


@dataclass(frozen=True)
class PeerFacts:
    barriers: frozenset[str]  # mbarriers that other CTAs arrive on or complete bytes on
    touched: bool  # some statement reaches another CTA's shared memory or barriers


_SCANNED: dict[int, tuple[ir.Kernel, PeerFacts]] = {}


def peer_facts(k: ir.Kernel) -> PeerFacts:
    """One walk over the kernel's expressions, remembered by identity (hashing a kernel
    walks all of it too)."""
    hit = _SCANNED.get(id(k))
    if hit is not None and hit[0] is k:
        return hit[1]
    names: set[str] = set()
    touched = False
    for s in ir.walk(k.body):
        peers = peers_of(s)
        names.update(remote_uses(s, peers))
        touched = touched or bool(peers) or effect(s).peer
    facts = PeerFacts(frozenset(names), touched)
    if len(_SCANNED) > 64:
        _SCANNED.clear()
    _SCANNED[id(k)] = (k, facts)
    return facts


def remote_barriers(k: ir.Kernel) -> frozenset[str]:
    """Names of the mbarriers that other CTAs of the cluster arrive on or complete bytes on."""
    return peer_facts(k).barriers


def touches_peers(s: ir.Stmt) -> bool:
    return effect(s).peer or ir.has_expr(s, ir.Peer)
