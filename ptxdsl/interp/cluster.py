"""A thread-block cluster at run time: its CTAs run together, interleaved, and reach each
other's shared memory and mbarriers.

The CTAs start one after another, in an order drawn from the seed (rank order for seed 0),
each some scheduling steps after the one before (or as soon as every started CTA waits), so
a CTA may run a long way before its peers exist. The scheduler then picks a started CTA with
work from a seeded stream and lets it take one scheduling step (a thread step or a copy
event), so the CTAs' threads and copies interleave. Reaching a peer that has not started, or
has exited, is an error that names both sites. The
cluster barrier (`barrier.cluster.arrive/wait`) completes when every thread of the cluster
has arrived or exited. Happens-before is tracked inside each CTA (`hb.py`); accesses that
cross CTAs (DSMEM loads and stores, remote arrivals, multicast and peer copies) are checked
for what the hardware requires of them instead: the peer CTA must still be running, its
mbarrier must be initialised, fenced with fence_mbarrier_init() and published by a cluster
barrier before a peer uses it, and a remote arrival must fit in the barrier's count.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import ir
from ..errors import Diagnostic, Note
from .copies import AsyncLoad
from .dsmem import publish
from .errors import InterpError, fail, id_ranges, note, threads_phrase

if TYPE_CHECKING:
    from .cta import CTA, Thread
    from .mbarrier import MBarrier
    from .state import ThreadState


class ClusterBarrier:
    """`barrier.cluster`: one arrival per thread per generation; a wait returns once the
    generation of the thread's arrival has completed."""

    __slots__ = ("cluster", "generation", "arrived", "exited", "total", "vcs", "released",
                 "waiters", "pubs", "published")

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.generation = 0
        self.arrived: set[tuple[int, int]] = set()  # (rank, tid) arrived in this generation
        self.exited: set[tuple[int, int]] = set()  # (rank, tid) of the threads that exited
        self.total = sum(c.nthreads for c in cluster.ctas)
        self.vcs: dict[int, np.ndarray] = {}  # rank -> what that CTA's release arrivals published
        self.released: dict[int, dict[int, np.ndarray]] = {}  # generation -> vcs
        self.waiters: list[Thread] = []
        self.pubs: dict[int, int] = {}  # rank -> epoch its release arrivals published
        self.published: dict[int, dict[int, int]] = {}  # generation -> pubs

    def arrive(self, th: Thread, release: bool, node: Any) -> None:
        key = (th.cta.rank, th.tid)
        if key in self.arrived:
            fail("barrier", f"{th.name} arrives on the cluster barrier twice without waiting "
                 "in between (cluster_wait)", node)
        self.arrived.add(key)
        th.cluster_gen = self.generation
        if release:
            vc = th.cta.clocks.release(th.tid)
            old = self.vcs.get(th.cta.rank)
            self.vcs[th.cta.rank] = vc if old is None else np.maximum(old, vc)
            publish(self.pubs, th.cta.rank, th.cta.publication.release())
        self.check()

    def check(self) -> None:
        """Complete the generation once every live thread of the cluster has arrived."""
        if not self.arrived or \
                len(self.arrived) + len(self.exited - self.arrived) < self.total:
            return
        self.released = {g: v for g, v in self.released.items() if g >= self.generation - 2}
        self.released[self.generation] = self.vcs
        self.published = {g: v for g, v in self.published.items() if g >= self.generation - 2}
        self.published[self.generation] = self.pubs
        self.generation += 1
        self.arrived = set()
        self.vcs = {}
        self.pubs = {}
        self.cluster.publish_inits()
        waiters, self.waiters = self.waiters, []
        for t in waiters:
            t.cta.runnable.append(t)

    def done(self, th: Thread) -> bool:
        return th.cluster_gen < self.generation

    def acquire(self, th: Thread) -> None:
        vc = self.released.get(th.cluster_gen, {}).get(th.cta.rank)
        if vc is not None:
            th.cta.clocks.acquire(th.tid, vc)
        th.cta.publication.acquire(self.published.get(th.cluster_gen, {}))
        th.cluster_gen = -1

    def explain(self, cta: CTA, tids: list[int], detail: Any) -> tuple[str, list[Note]]:
        missing = []
        for c in self.cluster.ctas:
            absent = [t.tid for t in c.threads if not t.exited
                      and (c.rank, t.tid) not in self.arrived]
            if absent:
                missing.append(f"threads {id_ranges(absent)} of cluster rank {c.rank}")
        return (f"{threads_phrase(tids, 'wait')} on the cluster barrier, but "
                f"{'; '.join(missing) or 'no thread'} never arrive", [])


class Cluster:
    """The CTAs of one cluster and the scheduler that starts and interleaves them."""

    def __init__(self, ctas: list[CTA], seed: int, first: int, kernel: ir.Kernel | None = None):
        self.ctas = ctas
        self.kernel = kernel
        self.rng = random.Random(seed * 7_919 + first)
        self.barrier = ClusterBarrier(self)
        self.published: set[tuple[int, int]] = set()  # (id(mbarrier), init generation)
        for c in ctas:
            c.cluster = self
            self.barrier.exited.update((c.rank, t.tid) for t in c.threads if t.exited)
        # The start order and the gaps between starts: seed 0 starts the ranks in order, each
        # after the one before has run a while; other seeds shuffle both.
        self.unstarted = list(ctas)
        if seed:
            self.rng.shuffle(self.unstarted)
        n = ctas[0].nthreads if ctas else 0
        self.gaps = [2 * n if not seed else self.rng.randrange(4 * n + 1) for _ in ctas]
        self.started: list[CTA] = []
        self.steps, self.start_at = 0, 0  # scheduling events so far; when the next starts
        self.exits: dict[int, Any] = {}  # rank -> where its last thread exited

    def publish_inits(self) -> None:
        """A completed cluster barrier makes every fenced mbarrier init visible to peers."""
        for c in self.ctas:
            for bars in c.barriers.values():
                for b in bars:
                    if b.initialised and (id(b), b.base) in c.cluster_fenced:
                        self.published.add((id(b), b.base))

    def peer(self, th: Thread, rank: int, node: Any) -> CTA:
        """The CTA of cluster rank `rank`, which must still be running."""
        if not 0 <= rank < len(self.ctas):
            fail("cluster", f"{th.name} names cluster rank {rank}, but the cluster has "
                 f"{len(self.ctas)} CTA(s)", node)
        p = self.ctas[rank]
        if p is not th.cta and p in self.unstarted:
            assert self.kernel is not None  # a cluster of several CTAs runs a kernel
            sync = next((s for s in ir.walk(self.kernel.body) if s.loc is not None
                         and isinstance(s, (ir.ClusterSync, ir.ClusterWait))), None)
            fail("cluster", f"{th.name} reaches the shared memory or mbarriers of cluster rank "
                 f"{rank} (CTA {p.label}), which has not started yet: the CTAs of a cluster "
                 "start in any order, and only a cluster barrier (cluster_sync(), or "
                 "cluster_arrive() then cluster_wait()) tells that they all run", node,
                 note("the first cluster barrier, which every CTA passes only once all have "
                      "started, is here" if sync is not None else
                      f"kernel '{self.kernel.name}' has no cluster barrier; its CTAs start "
                      "here, in any order", sync if sync is not None else self.kernel))
        if p is not th.cta and not p.live:
            fail("cluster", f"{th.name} accesses the shared memory of cluster rank {rank}, "
                 f"which has exited (CTA {p.label}): a CTA must not exit while peers may "
                 "still access its shared memory or mbarriers (end it with cluster_sync())",
                 node, self.exit_note(p))
        return p

    def exit_note(self, cta: CTA) -> Note:
        assert self.kernel is not None
        site = self.exits.get(cta.rank)
        return note(f"the last thread of cluster rank {cta.rank} exits here", site) \
            if site is not None else \
            note(f"the threads of cluster rank {cta.rank} ran to the end of kernel "
                 f"'{self.kernel.name}'", self.kernel)

    @property
    def runnable(self) -> bool:
        """Whether a thread of a started CTA can run (or a CTA is still to start)."""
        return bool(self.unstarted) or any(c.runnable for c in self.started)

    @property
    def inflight(self) -> bool:
        return any(c.inflight for c in self.started)

    def advance(self) -> bool:
        """Start and interleave the CTAs until every thread has exited (True) or the live ones
        all wait with at least one spinning on global memory, which only another cluster can
        change (False: `run_parked` sets the cluster aside until a write wakes it)."""
        while True:
            busy = [c for c in self.started if c.runnable or c.inflight]
            if self.unstarted and (self.steps >= self.start_at or not busy):
                c = self.unstarted.pop(0)
                self.started.append(c)
                self.start_at = self.steps + self.gaps[len(self.started) - 1]
                continue
            if not busy:
                break
            self.rng.choice(busy).step()
            self.steps += 1
        if not any(c.live for c in self.ctas):
            return True
        if any(t.wait is not None and t.wait[1] is c.gmem.watch for c in self.ctas
               for t in c.threads if not t.exited):
            return False
        raise self.deadlock()

    def run(self) -> None:
        if not self.advance():
            raise self.deadlock()

    def deadlock(self) -> InterpError:
        diags: list[Diagnostic] = []
        for c in self.ctas:
            if c.live:
                diags.extend(c.deadlock().diagnostics)
        return InterpError("deadlock", diags)

    def exited(self, th: Thread, node: Any) -> None:
        """Thread `th` exited (at `node`, or at the end of the kernel): it no longer holds up
        the cluster barrier; when it was the last of its CTA, no copy may still be reading
        that CTA's shared memory."""
        cta = th.cta
        self.barrier.exited.add((cta.rank, th.tid))
        self.barrier.check()
        if cta.live:
            return
        self.exits[cta.rank] = node
        for other in self.ctas:
            for copy in other.inflight:
                if isinstance(copy, PeerLoad) and copy.source is cta:
                    fail("cluster", f"CTA {cta.label} has exited while this {copy.op} it "
                         f"issued into cluster rank {other.rank} still reads its shared "
                         "memory: end the kernel with cluster_sync()", copy.node,
                         self.exit_note(cta))


# ----------------------------------------------------------------------------- remote use


def check_remote_barrier(th: Thread, b: MBarrier, node: Any, verb: str) -> None:
    """A thread of another CTA (or the copy engine on its behalf) uses mbarrier `b`: its
    init must be fenced at cluster scope and published by a cluster barrier."""
    if not b.initialised:
        fail("mbarrier", f"{th.name} {verb} mbarrier {b.label} of cluster rank {b.cta.rank}, "
             "which is not initialised", node)
    cluster = b.cta.cluster
    if cluster is not None and (id(b), b.base) not in cluster.published:
        why = ("its initialising thread never ran fence_mbarrier_init()"
               if (id(b), b.base) not in b.cta.cluster_fenced
               else "no cluster barrier (cluster_sync) has passed since")
        fail("mbarrier", f"{th.name} {verb} mbarrier {b.label} of cluster rank {b.cta.rank} "
             f"before its initialisation is visible to the cluster: {why}; initialise, "
             "fence_mbarrier_init(), then cluster_sync() before peers use it", node,
             note(f"'{b.label}' was initialised here", b.init_node))


def remote_arrive(th: Thread, b: MBarrier, count: int, node: Any) -> None:
    """`mbarrier.arrive.release.cluster` on a peer's barrier (or, through the CTA's own rank,
    on its own: then it orders like a local arrive)."""
    if b.cta is th.cta:
        b.arrive(th, count, node)
        return
    check_remote_barrier(th, b, node, "arrives on")
    if count < 1 or count > b.pending:
        fail("mbarrier", f"too many arrivals: {th.name} arrives remotely on {b.label} of "
             f"cluster rank {b.cta.rank} with count {count}, but {b.label} is in {b.state()} "
             "(does its count include the peers' arrivals?)", node,
             note(f"'{b.label}' was initialised here", b.init_node))
    publish(b.published, th.cta.rank, th.cta.publication.release())
    b.pending -= count
    b._advance()


def remote_expect_tx(th: Thread, b: MBarrier, nbytes: int, node: Any) -> None:
    if b.cta is th.cta:
        b.expect_tx(th, nbytes, node)
        return
    check_remote_barrier(th, b, node, "sets expect_tx on")
    b._add_tx(nbytes, node)
    b._advance()


class PeerLoad(AsyncLoad):
    """A copy into another CTA's shared memory (multicast, st.async, peer bulk copy),
    completing on that CTA's mbarrier. Its order relative to the destination's threads is
    checked through the barrier protocol, not through happens-before."""

    __slots__ = ("source",)

    def start(self, th: ThreadState) -> None:
        self.source = th.cta if self.op == "bulk_copy_cluster" else None
        smem, sel = self.cta.smem, self.dst
        self.vc = self.cta.clocks.zeros()
        busy = smem.loading[sel]
        if busy.any():
            other = smem.loads[int(busy[np.argmax(busy != 0)])]
            fail("race", f"race: a {self.op} from {th.name} writes into cluster rank "
                 f"{self.cta.rank} while another {other.op} into the same bytes is in flight",
                 self.node, note(f"the other {other.op} was issued here", other.node))
        smem.loading[sel] = self.id
        smem.loads[self.id] = self
        self.bar.copies += 1


def issue_remote(th: Thread, dst: CTA, node: Any, bar: MBarrier, sel: Any, nbytes: int,
                 fetch: Any) -> None:
    """A copy issued by `th` that lands in CTA `dst` (its own CTA included)."""
    if dst is th.cta:
        bar.check_async_use(th, node)
        dst.issue(th, AsyncLoad(dst, node, bar, sel, nbytes, fetch))
    else:
        check_remote_barrier(th, bar, node, f"issues a {node.syntax} completing on")
        dst.issue(th, PeerLoad(dst, node, bar, sel, nbytes, fetch))


def remote_write(th: Thread, cta: CTA, off: int, n: int, write: Any, value: Any,
                 node: Any) -> None:
    """`st.shared::cluster` into a peer's shared memory."""
    smem, sel = cta.smem, slice(off, off + n)
    smem._check_in_flight(th, sel, node, "writes")
    write(smem.buf, off, value)
    smem.version += 1
    smem.written[sel] = True
    if smem.writers is not None:
        smem.writers.wrote(sel, th.cta)
    smem.w_agent[sel] = -1  # ordered through the cluster barrier protocol, not tracked here
    smem.r_agent[sel] = -1
    smem.gw_owner[sel] = 0
