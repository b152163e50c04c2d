"""One CTA at run time: its threads, shared memory, barriers and copies, and the scheduler
that interleaves them.

Every thread runs the compiled kernel body as a Python generator that yields at points
where another thread or a copy may act: `PREEMPT` (still runnable) or a waitable object it
blocks on (an mbarrier, a named barrier, a warp gather, its bulk groups). A waitable keeps
its `waiters`; `wake` makes them runnable again and they re-check their condition. The
scheduler picks the next thread, or lets an in-flight copy make progress, from a seeded
random stream, so a seed fixes the schedule. When no thread can run and no copy is in
flight, the live threads are deadlocked.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from ..errors import Diagnostic
from .copies import AsyncLoad, AsyncStore, BulkGroups
from .dsmem import Publication, Writers
from .errors import InterpError, fail, note, threads_phrase
from .hb import Clocks
from .mbarrier import MBarrier
from .memory import GlobalMemory, SharedMemory
from .sync import Gather, NamedBarrier, finish

if TYPE_CHECKING:
    from .state import KernelCode

PREEMPT = object()  # yielded by a thread that may continue but lets others run first

# A copy advances about once per COPY_DELAY rounds of all runnable threads (a round being
# one step of each), so copies complete late relative to the threads that issued them, as a
# microsecond-scale copy does next to nanosecond-scale instructions. Each CTA draws its delay
# from the seed, so different seeds explore both slow and quicker copies.
COPY_DELAYS = (1, 4, 16, 64)


class ThreadExit(Exception):  # noqa: N818 - control flow, not an error
    """`return` in the kernel: unwinds the thread's generators."""

    def __init__(self, node: Any):
        self.node = node


class Thread:
    """One thread of a CTA: registers, special registers and synchronisation bookkeeping."""

    __slots__ = ("cta", "tid", "lane", "name", "regs", "sregs", "gen", "wait", "exited",
                 "bulk", "unfenced", "inits", "loops", "warp_threads", "warp_gathers",
                 "cluster_gen", "wgmma")

    def __init__(self, cta: CTA, tid: int, sregs: dict[str, int], regs: list[Any]):
        self.cta = cta
        self.tid = tid
        self.lane = tid & 31
        self.name = f"thread {tid}{cta.suffix}"
        self.sregs = sregs
        self.regs = regs
        self.wait: tuple[Any, Any, Any] | None = None  # (site, waitable, detail) when blocked
        self.exited = False
        self.bulk = BulkGroups()
        self.unfenced: list[list[Any]] = []  # [start, end, site]: writes since the last fence
        self.inits: list[MBarrier] = []  # barriers initialised since the last fence
        self.loops: list[Any] = []  # the loops being executed, innermost last
        self.warp_threads: list[Thread] = []
        self.warp_gathers: dict[int, Gather] = {}
        self.gen: Any = None
        self.cluster_gen = -1  # the cluster-barrier generation of its pending arrival
        self.wgmma: Any = None  # interp.wgmma.WgmmaState once the thread fences or issues

    def fence_inits(self) -> None:
        """A fence after mbarrier_init: the async proxy may now use those barriers."""
        for b in self.inits:
            b.fenced = True
        self.inits.clear()


class CTA:
    """The state of one CTA and the scheduler that runs it to completion."""

    def __init__(self, prog: KernelCode, ctaid: tuple[int, int, int], grid: tuple[int, int, int],
                 gmem: GlobalMemory, params: list[Any], seed: int, max_steps: int,
                 warned: set[int], cluster: tuple[int, int, int] = (1, 1, 1),
                 index: int | None = None):
        k = prog.kernel
        self.gmem = gmem
        self.nthreads = k.nthreads
        linear = ctaid[0] + grid[0] * (ctaid[1] + grid[1] * ctaid[2])
        # its column in gmem.order (gorder.py) and its name in gmem.writes (gwrites.py): the
        # linear id, or past other ranks' CTAs
        self.index = linear if index is None else index
        cid = tuple(c % n for c, n in zip(ctaid, cluster, strict=True))
        self.rank = cid[0] + cluster[0] * (cid[1] + cluster[1] * cid[2])
        self.cluster: Any = None  # the Cluster running this CTA with its peers, if any
        self.cluster_fenced: set[tuple[int, int]] = set()  # (id(mbarrier), init generation)
        self.label = str(ctaid[0]) if grid[1:] == (1, 1) else str(ctaid)
        if cluster != (1, 1, 1):
            self.label += f" (cluster rank {self.rank})"
        self.suffix = f" of CTA {self.label}" if grid != (1, 1, 1) else ""
        self.rng = random.Random(seed * 1_000_003 + linear)
        self.max_steps = max_steps
        self.steps = 0
        self.copy_ids = 0
        nbarriers = sum(max(n, 1) for _, n in prog.barriers)
        self.clocks = Clocks(self.nthreads, nbarriers, gmem.order.ncta if gmem.order else 0)
        garbage = self.rng.randbytes(max(prog.layout.size, 16))
        self.smem = SharedMemory(prog.layout, garbage, self.clocks, prog.track_proxy, warned)
        # cross-CTA ordering of shared memory, tracked in a cluster (dsmem.py)
        self.publication = Publication()
        if cluster != (1, 1, 1):
            self.smem.writers = Writers(len(garbage))
        self.barriers: dict[str, list[MBarrier]] = {}
        for name, n in prog.barriers:
            bars = self.barriers[name] = []
            for i in range(max(n, 1)):
                label = name if n == 0 else f"{name}[{i}]"
                bars.append(MBarrier(label, self, self.nthreads + len(self.smem.agents)))
                self.smem.agents.append(label)
        self.named = [NamedBarrier(i) for i in range(16)]
        self.inflight: list[AsyncLoad | AsyncStore] = []
        self.threads: list[Thread] = []
        nx, ny, _ = k.threads
        base = {"ntid.x": nx, "ntid.y": ny, "ntid.z": k.threads[2],
                "ctaid.x": ctaid[0], "ctaid.y": ctaid[1], "ctaid.z": ctaid[2],
                "nctaid.x": grid[0], "nctaid.y": grid[1], "nctaid.z": grid[2],
                "clusterid.x": ctaid[0] // cluster[0], "clusterid.y": ctaid[1] // cluster[1],
                "clusterid.z": ctaid[2] // cluster[2],
                "nclusterid.x": grid[0] // cluster[0], "nclusterid.y": grid[1] // cluster[1],
                "nclusterid.z": grid[2] // cluster[2],
                "cluster_ctaid.x": cid[0], "cluster_ctaid.y": cid[1], "cluster_ctaid.z": cid[2],
                "cluster_nctaid.x": cluster[0], "cluster_nctaid.y": cluster[1],
                "cluster_nctaid.z": cluster[2],
                "cluster_ctarank": self.rank,
                "cluster_nctarank": cluster[0] * cluster[1] * cluster[2],
                "dynamic_smem_size": prog.layout.request_bytes}  # fmt: skip
        for tid in range(self.nthreads):
            sregs = dict(base, **{"tid.x": tid % nx, "tid.y": tid // nx % ny,
                                  "tid.z": tid // (nx * ny), "laneid": tid & 31,
                                  "warp": tid >> 5})
            self.threads.append(Thread(self, tid, sregs, list(params) + prog.scratch()))
        for w in range(0, self.nthreads, 32):
            lanes = self.threads[w : w + 32]
            gathers: dict[int, Gather] = {}
            for t in lanes:
                t.warp_threads, t.warp_gathers = lanes, gathers
        for t in self.threads:
            t.gen = prog.body(t)
        self.runnable = list(self.threads)
        self.live = self.nthreads
        self.delay = self.rng.choice(COPY_DELAYS)

    def new_copy_id(self) -> int:
        self.copy_ids += 1
        return self.copy_ids

    def issue(self, th: Thread, copy: AsyncLoad | AsyncStore) -> None:
        copy.start(th)
        self.inflight.append(copy)

    def wake(self, obj: Any) -> None:
        self.runnable.extend(obj.waiters)
        obj.waiters.clear()

    # ------------------------------------------------------------------ scheduler

    def advance(self) -> bool:
        """Run until every thread has exited (True) or the live ones all wait with at least
        one spinning on global memory, which only another CTA can change (False)."""
        while self.step():
            pass
        if not self.live:
            return True
        if any(t.wait is not None and t.wait[1] is self.gmem.watch for t in self.threads
               if not t.exited):
            return False
        raise self.deadlock()

    def step(self) -> bool:
        """One scheduling event: a copy advances or a thread runs to its next switch point;
        False when nothing can run."""
        rng, runnable, inflight = self.rng, self.runnable, self.inflight
        if inflight and (not runnable or rng.random() * self.delay * len(runnable) < 1.0):
            i = rng.randrange(len(inflight))
            if inflight[i].step():
                inflight[i] = inflight[-1]
                inflight.pop()
            return True
        if not runnable:
            return False
        i = rng.randrange(len(runnable))
        th = runnable[i]
        runnable[i] = runnable[-1]
        runnable.pop()
        self.tick(th)
        try:
            y = th.gen.send(None)
        except StopIteration:
            self.exit(th, None)
            return True
        except ThreadExit as e:
            self.exit(th, e.node)
            return True
        if y is PREEMPT:
            runnable.append(th)
        else:
            y.waiters.append(th)
        return True

    def tick(self, th: Thread) -> None:
        """Count one unit of work; past `max_steps` the kernel is taken to loop forever."""
        self.steps += 1
        if self.steps > self.max_steps:
            where = th.loops[-1] if th.loops else (th.wait[0] if th.wait else None)
            fail("step-limit", f"step limit reached: CTA {self.label} ran {self.max_steps} "
                 f"steps without finishing; {th.name} is still running "
                 f"{'this loop' if th.loops else 'here'} (an infinite loop? If not, allow "
                 "more with `ptxdsl interp --max-steps N` (max_steps= in Python), or give the "
                 "twin a SMALL dict of smaller example() sizes)", where)

    def exit(self, th: Thread, node: Any) -> None:
        th.exited = True
        self.live -= 1
        for store in th.bulk.unwaited():
            how = ("never committed with bulk_commit()" if store in th.bulk.open
                   else "not waited for with bulk_wait_read()/bulk_wait()")
            fail("unwaited-store", f"{th.name} exits while this {store.op} is {how}: its "
                 "shared-memory source may be released before the copy has read it",
                 store.node, *([note("the thread exits here", node)] if node else []))
        finish(self, th.warp_threads, th.warp_gathers)
        if self.cluster is not None:
            self.cluster.exited(th, node)
        if not self.live:
            self.check_warpgroups()
            loads = [c for c in self.inflight if isinstance(c, AsyncLoad)]
            if loads:
                fail("copy", f"every thread of CTA {self.label} has exited while this "
                     f"{loads[0].op} into shared memory is still in flight", loads[0].node)

    def check_warpgroups(self) -> None:
        """wgmma is warpgroup-collective: each wgmma statement was issued as many times by
        every thread of a warpgroup (the hardware runs it once for the 128 of them)."""
        for g in range(0, len(self.threads), 128):
            group = self.threads[g:g + 128]
            sites: dict[int, tuple[Any, dict[int, int]]] = {}
            for t in group:
                for key, (node, n) in (t.wgmma.issued.items() if t.wgmma else ()):
                    sites.setdefault(key, (node, {}))[1][t.tid] = n
            for node, counts in sites.values():
                most = max(counts.values())
                fewer = [t.tid for t in group if counts.get(t.tid, 0) < most]
                if fewer:
                    fail("wgmma", f"CTA {self.label}: wgmma is warpgroup-collective, but "
                         f"{threads_phrase(fewer)} of warpgroup {g // 128} issued it here "
                         f"fewer times than the others ({most}): the 128 threads of a "
                         "warpgroup must issue it together", node)

    # ------------------------------------------------------------------ deadlock report

    def deadlock(self) -> InterpError:
        """One diagnostic per group of threads blocked at the same site on the same object
        in the same way."""
        # Only mbarriers, named barriers and warp gathers can block for good: a thread waiting
        # for its bulk groups waits on copies, and copies always finish.
        groups: dict[tuple[int, int, Any], list[Thread]] = {}
        for t in self.threads:
            if not t.exited and t.wait is not None:
                site, obj, detail = t.wait
                groups.setdefault((id(site), id(obj), detail), []).append(t)
        diags: list[Diagnostic] = []
        for members in sorted(groups.values(), key=lambda g: g[0].tid):
            site, obj, detail = members[0].wait  # type: ignore[misc]
            text, notes = obj.explain(self, [t.tid for t in members], detail)
            diags.append(Diagnostic(f"deadlock in CTA {self.label}: {text}",
                                    getattr(site, "loc", None), tuple(notes)))
        return InterpError("deadlock", diags)

