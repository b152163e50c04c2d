"""Cluster rules: peer ranks and multicast masks inside the cluster, remote arrivals within
the barrier's count, mbarrier inits published to the cluster before a peer uses them, and
no CTA leaving while a peer may still reach its shared memory.

Barriers that peers reach (through `peer(bar, r)` or as the barrier of a multicast) are
checked here and hidden from the single-CTA barrier checks (`remote_barriers`), which
cannot see the arrivals and bytes that come from other CTAs.
"""

from __future__ import annotations

from math import prod

from .. import ir
from ..errors import Note
from .effects import effect, issuers
from .facts import Facts, Report
from .multicast import check_multicast_coverage
from .publish import check_cluster_publication, check_remote_handoffs
from .ranks import RankEval, holds
from .remote import peer_facts, peers_of, remote_barriers, remote_uses, root, touches_peers

# ----------------------------------------------------------------------------- ranks, masks


def check_ranks_and_masks(facts: Facts, out: Report) -> None:
    """Peer ranks and multicast masks name CTAs of the cluster, in every CTA of it that may
    run the statement (conditions on the cluster registers are followed)."""
    k = facts.kernel
    n = prod(k.cluster or (1, 1, 1))
    ev = RankEval(k)
    for s, path, _ in ir.sites(k.body):
        peers = peers_of(s)
        if not peers and not effect(s).multicast:
            continue
        ranks = [r for r in range(n)
                 if all(holds(ev, c, r) is not (not want) for c, want in path)]
        for p in peers:
            for r, v in ev.over_cluster(p.rank, ranks):
                if not 0 <= v < n:
                    out.error(f"peer rank {v} (in the CTA of cluster rank {r}) is outside the "
                              f"cluster of {n} CTA(s)", p.rank.loc or p.loc or s.loc)
                    break
        if effect(s).multicast:
            for r, v in ev.over_cluster(s.mask, ranks):  # type: ignore[attr-defined]
                if v == 0 or v >> n:
                    out.error(f"multicast mask {v:#06x} (in the CTA of cluster rank {r}) names "
                              f"CTAs outside the cluster of {n} (ranks 0..{n - 1})"
                              if v else "multicast mask 0 delivers to no CTA",
                              s.mask.loc or s.loc)  # type: ignore[attr-defined]
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
        s, e = v.stmt, effect(v.stmt)
        if e.arrive is None or not v.counted or not v.certain:
            continue
        where = getattr(s, e.arrive)
        name = root(where)
        if name not in decls or "." in name:  # pipeline barriers: counts derived by lowering
            continue
        cnt = getattr(s, e.count) if e.count else None
        per = 1 if cnt is None else (cnt.value if isinstance(cnt, ir.Const) else None)
        if per is None:
            return
        if isinstance(where, ir.Peer):
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


def check_cluster_init(facts: Facts, out: Report) -> set[int]:
    """mbarrier_init, fence_mbarrier_init() and a cluster barrier before a peer's first use;
    the ids of the statements reported."""
    reported: set[int] = set()
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
                     if effect(stmts[i]).cluster_wait), None) if fence else None
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
        reported.add(id(stmts[first]))
    return reported


# ----------------------------------------------------------------------------- start


# What every path so far has crossed, weakest first: nothing, an arrival without its wait, a
# cluster barrier unless a loop that holds it ran no iteration, a cluster barrier; or no path.
_NONE, _ARRIVED, _LOOPED, _SYNCED, _UNREACHED = range(5)


class _Started:
    """Whether every path from the kernel's entry to a statement crosses a whole cluster
    barrier: the CTAs of a cluster start in any order, and a peer's shared memory and
    mbarriers exist only once it runs, which only a cluster barrier that every thread of the
    cluster passed (arrive, then wait; relaxed arrivals count) tells."""

    def __init__(self, k: ir.Kernel):
        self.ev = RankEval(k)
        self.n = prod(k.cluster or (1, 1, 1))
        self.first: tuple[ir.Stmt, int] | None = None  # the first access, the state it saw

    def block(self, stmts: tuple[ir.Stmt, ...], state: int) -> int:
        for s in stmts:
            if state == _UNREACHED:
                break
            state = self.stmt(s, state)
        return state

    def stmt(self, s: ir.Stmt, state: int) -> int:
        barrier = effect(s).cluster_barrier
        if barrier == "sync":
            return _SYNCED
        if barrier == "arrive":
            return max(state, _ARRIVED)
        if barrier == "wait":
            return _SYNCED if state == _ARRIVED else state
        if isinstance(s, ir.Return):
            return _UNREACHED
        if isinstance(s, ir.If):
            return min(self.block(s.then, state), self.block(s.orelse, state))
        if isinstance(s, (ir.For, ir.While)):
            end = self.block(s.body, state)
            if end <= state or _runs(s):
                return end
            return min(end, _LOOPED)  # crossed unless the loop runs no iteration
        if isinstance(s, ir.Role):
            return self.block(s.body, state)
        if state != _SYNCED and self.first is None and self.remote(s):
            self.first = (s, state)
        return state

    def remote(self, s: ir.Stmt) -> bool:
        """Whether a statement may reach the shared memory or mbarriers of another CTA."""
        if effect(s).multicast:
            own = [(r, v) for r, v in self.ev.over_cluster(s.mask, list(range(self.n)))]  # type: ignore[attr-defined]
            return not own or any(v != 1 << r for r, v in own)
        for p in peers_of(s):
            ranks = self.ev.over_cluster(p.rank, list(range(self.n)))
            if not ranks or any(v != r for r, v in ranks):
                return True
        return False


def _runs(loop: ir.Stmt) -> bool:
    """Whether a loop certainly runs an iteration (constant bounds)."""
    if not isinstance(loop, ir.For):
        return False
    a, b = loop.start, loop.stop
    return isinstance(a, ir.Const) and isinstance(b, ir.Const) and \
        isinstance(loop.step, ir.Const) and int(b.value) > int(a.value)


def check_peers_started(facts: Facts, out: Report, reported: set[int]) -> None:
    """No access reaches a peer CTA before a cluster barrier on every path to it (a cluster
    pipeline's derived cluster_sync counts: it is in the lowered body)."""
    k = facts.kernel
    walk = _Started(k)
    # Unlowered, a cluster pipeline's derived init sync is not in the body yet; it comes first.
    derived = any(isinstance(s, ir.PipelineDecl) for s in k.body) and \
        any(effect(s).multicast for s in ir.walk(k.body))
    walk.block(k.body, _SYNCED if derived else _NONE)
    if walk.first is None or id(walk.first[0]) in reported:
        return
    s, state = walk.first
    stmts = facts.statements
    at = next(i for i, x in enumerate(stmts) if x is s)  # equal statements may repeat
    later = next((x for x in stmts[at:] if effect(x).cluster_wait), None)
    if state == _ARRIVED:
        why = "this thread has arrived on the cluster barrier but not waited (cluster_wait())"
    elif state == _LOOPED:
        why = "the cluster barriers before it are in a loop that may run no iteration"
    else:
        why = "no cluster barrier (cluster_sync(), or cluster_arrive() then cluster_wait()) " \
            "precedes it on every path"
    earlier = [x for x in stmts[:at] if effect(x).cluster_barrier]
    if earlier and state == _LOOPED:
        note = Note("this cluster barrier is in that loop", earlier[-1].loc)
    elif earlier and state == _NONE:
        note = Note("this cluster barrier is not on every path to the access", earlier[-1].loc)
    elif later is not None:
        note = Note("the first cluster barrier comes after the access, here", later.loc)
    else:
        note = Note(f"'{k.name}' runs in clusters of {walk.n} CTAs, which start in any order",
                    k.loc)
    what = getattr(s, "syntax", "") or ("this store" if isinstance(s, ir.Store) else "this load")
    message = (f"{what} reaches another CTA of the cluster before that CTA is known to have "
               f"started: {why}; its shared memory and mbarriers may not exist yet")
    if state == _LOOPED:  # wrong only when the loop runs no iteration: a run-time value
        out.warning(message, s.loc, note)
    else:
        out.error(message, s.loc, note)


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
    if any(effect(s).cluster_wait for s in body[last + 1 :]):
        return
    site = next(x for x in reversed(list(ir.walk((body[last],)))) if touches_peers(x))
    out.error("a CTA can exit while a peer may still access its shared memory or mbarriers: "
              "no cluster barrier follows this access before the kernel ends (end with "
              "cluster_sync())", site.loc)




def check_clusters(facts: Facts, out: Report) -> None:
    if not peer_facts(facts.kernel).touched and not any(
            effect(s).cluster_barrier for s in ir.walk(facts.kernel.body)):
        return
    check_ranks_and_masks(facts, out)
    check_remote_arrivals(facts, out)
    check_peers_started(facts, out, check_cluster_init(facts, out))
    check_cluster_exit(facts, out)
    check_cluster_publication(facts, out)
    check_remote_handoffs(facts, out)
    check_multicast_coverage(facts, out)

