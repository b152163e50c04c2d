"""Cluster rules: peer ranks and multicast masks inside the cluster, remote arrivals within
the barrier's count, mbarrier inits published to the cluster before a peer uses them, and
no CTA leaving while a peer may still reach its shared memory.

Barriers that peers reach (through `peer(bar, r)` or as the barrier of a multicast) are
checked here and hidden from the single-CTA barrier checks (`remote_barriers`), which
cannot see the arrivals and bytes that come from other CTAs.
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod

from .. import ir
from ..errors import Note
from .effects import issuers
from .facts import Facts, Report
from .remote import MULTICAST as _MULTICAST
from .remote import peer_facts, peers_of, remote_barriers, remote_uses, root, touches_peers

_ARRIVES = (ir.MBarrierArrive, ir.MBarrierArriveExpectTx)
_CLUSTER_BARRIERS = (ir.ClusterSync, ir.ClusterWait)


# ----------------------------------------------------------------------------- ranks, masks


class _Unknown(Exception):
    pass


_OPS: dict[str, Callable[[int, int], int]] = {
        "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
        "div": lambda a, b: a // b, "rem": lambda a, b: a % b, "and": lambda a, b: a & b,
        "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b, "shl": lambda a, b: a << b,
        "shr": lambda a, b: a >> b, "min": min, "max": max}


class _RankEval:
    """Values of expressions that depend only on the CTA's place in its cluster."""

    def __init__(self, k: ir.Kernel):
        self.shape = k.cluster or (1, 1, 1)
        assigned = {s.name for s in ir.walk(k.body) if isinstance(s, ir.Assign)}
        self.env = {s.name: s.value for s in ir.walk(k.body)
                    if isinstance(s, ir.Let) and s.value is not None and s.name not in assigned}

    def value(self, e: ir.Expr, rank: int) -> int:
        nx, ny, nz = self.shape
        if isinstance(e, ir.Const) and isinstance(e.value, int):
            return int(e.value)
        if isinstance(e, ir.SReg):
            table = {"cluster_ctarank": rank, "cluster_nctarank": nx * ny * nz,
                     "cluster_ctaid.x": rank % nx, "cluster_ctaid.y": rank // nx % ny,
                     "cluster_ctaid.z": rank // (nx * ny), "cluster_nctaid.x": nx,
                     "cluster_nctaid.y": ny, "cluster_nctaid.z": nz}
            if e.name in table:
                return table[e.name]
        elif isinstance(e, ir.Var) and e.name in self.env:
            return self.value(self.env[e.name], rank)
        elif isinstance(e, ir.Cast):
            return self.value(e.x, rank) & ((1 << (e.type.nbytes * 8)) - 1)  # type: ignore[attr-defined]
        elif isinstance(e, ir.Binary) and e.op in _OPS:
            return _OPS[e.op](self.value(e.a, rank), self.value(e.b, rank))
        raise _Unknown

    def over_cluster(self, e: ir.Expr, ranks: list[int]) -> list[tuple[int, int]]:
        """(rank, value) for each of `ranks`; none if the value depends on more."""
        try:
            return [(r, self.value(e, r)) for r in ranks]
        except (_Unknown, ZeroDivisionError):
            return []


def _guarded(stmts: tuple[ir.Stmt, ...], path: tuple = ()):
    """Every statement with the (condition, polarity) pairs of the ifs around it."""
    for s in stmts:
        yield s, path
        if isinstance(s, ir.If):
            yield from _guarded(s.then, (*path, (s.cond, True)))
            yield from _guarded(s.orelse, (*path, (s.cond, False)))
        elif isinstance(s, (ir.For, ir.While, ir.Role)):
            yield from _guarded(s.body, path)


_COMPARE = {"eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
            "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b}


def _holds(ev: _RankEval, e: ir.Expr, rank: int) -> bool | None:
    """Whether condition `e` holds in the CTA of `rank`; None when that depends on more."""
    if isinstance(e, ir.Compare):
        try:
            return bool(_COMPARE[e.op](ev.value(e.a, rank), ev.value(e.b, rank)))
        except (_Unknown, ZeroDivisionError):
            return None
    if isinstance(e, ir.Unary) and e.op == "not":
        x = _holds(ev, e.x, rank)
        return None if x is None else not x
    if isinstance(e, ir.Binary) and e.op in ("and", "or"):
        a, b = _holds(ev, e.a, rank), _holds(ev, e.b, rank)
        if e.op == "and":
            return False if False in (a, b) else (None if None in (a, b) else True)
        return True if True in (a, b) else (None if None in (a, b) else False)
    if isinstance(e, ir.Var) and e.name in ev.env:
        return _holds(ev, ev.env[e.name], rank)
    return None


def check_ranks_and_masks(facts: Facts, out: Report) -> None:
    """Peer ranks and multicast masks name CTAs of the cluster, in every CTA of it that may
    run the statement (conditions on the cluster registers are followed)."""
    k = facts.kernel
    n = prod(k.cluster or (1, 1, 1))
    ev = _RankEval(k)
    for s, path in _guarded(k.body):
        peers = peers_of(s)
        if not peers and not isinstance(s, _MULTICAST):
            continue
        ranks = [r for r in range(n)
                 if all(_holds(ev, c, r) is not (not want) for c, want in path)]
        for p in peers:
            for r, v in ev.over_cluster(p.rank, ranks):
                if not 0 <= v < n:
                    out.error(f"peer rank {v} (in the CTA of cluster rank {r}) is outside the "
                              f"cluster of {n} CTA(s)", p.rank.loc or p.loc or s.loc)
                    break
        if isinstance(s, _MULTICAST):
            for r, v in ev.over_cluster(s.mask, ranks):
                if v == 0 or v >> n:
                    out.error(f"multicast mask {v:#06x} (in the CTA of cluster rank {r}) names "
                              f"CTAs outside the cluster of {n} (ranks 0..{n - 1})"
                              if v else "multicast mask 0 delivers to no CTA",
                              s.mask.loc or s.loc)
                    break


# ----------------------------------------------------------------------------- arrivals


def check_remote_arrivals(facts: Facts, out: Report) -> None:
    """Arrivals per phase on a barrier that peers arrive on must fit in its count: the
    count covers the local arrivals and those from every peer CTA."""
    k = facts.kernel
    decls = {s.name: s for s in k.body if isinstance(s, ir.BarrierDecl)}
    local: dict[str, int] = {}
    remote: dict[str, list[tuple[ir.Stmt, int]]] = {}
    for v in facts.trace.visits:
        s = v.stmt
        if not isinstance(s, _ARRIVES) or not v.counted or not v.certain:
            continue
        name = root(s.bar)
        if name not in decls or "." in name:  # pipeline barriers: counts derived by lowering
            continue
        cnt = getattr(s, "count", None)
        per = 1 if cnt is None else (cnt.value if isinstance(cnt, ir.Const) else None)
        if per is None:
            return
        if isinstance(s.bar, ir.Peer):
            remote.setdefault(name, []).append((s, issuers(v) * int(per)))
        else:
            local[name] = local.get(name, 0) + issuers(v) * int(per)
    for name, sites in remote.items():
        want, mine = decls[name].count, local.get(name, 0)
        theirs = sum(n for _, n in sites)
        if mine + theirs > want:
            s, n = sites[0]
            out.error(f"{n} arrival(s) per phase come to '{name}' of a peer CTA from here, but "
                      f"its count {want} does not include them ({mine} local arrival(s) and "
                      f"{theirs} remote ones per phase)", s.loc,
                      Note(f"'{name}' is declared here with count {want}", decls[name].loc))


# ----------------------------------------------------------------------------- init, exit


def check_cluster_init(facts: Facts, out: Report) -> None:
    """mbarrier_init, fence_mbarrier_init() and a cluster barrier before a peer's first use."""
    stmts = list(ir.walk(facts.kernel.body))
    for name in sorted(remote_barriers(facts.kernel)):
        inits = [i for i, s in enumerate(stmts)
                 if isinstance(s, ir.MBarrierInit) and root(s.bar) == name]
        uses = [i for i, s in enumerate(stmts) if name in remote_uses(s)]
        if not inits or not uses:
            continue
        init = inits[0]
        fence = next((i for i in range(init, len(stmts))
                      if isinstance(stmts[i], ir.FenceMBarrierInit)), None)
        sync = next((i for i in range(fence, len(stmts))
                     if isinstance(stmts[i], _CLUSTER_BARRIERS)), None) if fence else None
        first = uses[0]
        if fence is None or fence > first:
            why = "no fence_mbarrier_init() publishes its initialisation at cluster scope"
        elif sync is None or sync > first:
            why = ("no cluster barrier (cluster_sync()) after fence_mbarrier_init() makes its "
                   "initialisation visible to the peers")
        else:
            continue
        out.error(f"mbarrier '{name}' is used by a peer CTA here, but {why}",
                  stmts[first].loc, Note(f"'{name}' is initialised here", stmts[init].loc))


def check_cluster_exit(facts: Facts, out: Report) -> None:
    """After the last access that reaches another CTA (or that another CTA's copy may still
    read), the kernel ends with a cluster barrier, so no CTA exits while a peer may still
    access its shared memory or arrive on its barriers."""
    body = facts.kernel.body
    if any(isinstance(s, ir.PipelineDecl) for s in body):
        return  # lowering ends a cluster pipeline's kernel with cluster_sync()
    last = None
    for i, s in enumerate(body):
        if any(touches_peers(x) for x in ir.walk((s,))):
            last = i
    if last is None:
        return
    if any(isinstance(s, _CLUSTER_BARRIERS) for s in body[last + 1 :]):
        return
    site = next(x for x in reversed(list(ir.walk((body[last],)))) if touches_peers(x))
    out.error("a CTA can exit while a peer may still access its shared memory or mbarriers: "
              "no cluster barrier follows this access before the kernel ends (end with "
              "cluster_sync())", site.loc)


CLUSTER_CHECKS = (check_ranks_and_masks, check_remote_arrivals, check_cluster_init,
                  check_cluster_exit)


def check_clusters(facts: Facts, out: Report) -> None:
    if not peer_facts(facts.kernel).touched and not any(
            isinstance(s, (*_CLUSTER_BARRIERS, ir.ClusterArrive))
            for s in ir.walk(facts.kernel.body)):
        return
    for check in CLUSTER_CHECKS:
        check(facts, out)

