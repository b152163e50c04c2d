"""Ordering of global memory across the CTAs of a grid that communicate through it (atomics,
flags, semaphores): the weak part of the memory model that `hb.py`'s vector clocks (one CTA's
threads and barriers) do not reach.

Each CTA counts its gpu-scope releases (`st_release`, an atomic with release or acq_rel
order). Every thread's vector clock has one extra column per CTA of the grid: how many of
that CTA's releases it has acquired. A release by a thread publishes, at the released
address, its knowledge of the other CTAs and the number of its own CTA's release; the CTA
keeps what the releasing thread knew of its own CTA then (joined with its earlier releases).
An acquire (`ld_acquire`, an atomic with acquire or acq_rel order) of that address joins the
published columns into the thread's, and CTA barriers carry them on to the CTA's other
threads as they carry everything else. Successive releases to one address accumulate (a
release sequence of read-modify-writes), so the last of several CTAs bumping a counter
acquires all of them.

Under `run_ranks` the CTAs of every rank's launch take part, numbered rank after rank, so
the same holds across ranks (a peer's flag and the symmetric buffer it publishes).

A plain global store remembers, per byte, its CTA, thread and that thread's clock. A plain
load or store of a byte that another CTA stored is ordered after that store only if the
accessing thread acquired a release of the writer's CTA that the writer's store happened
before; otherwise it is a race, whatever the schedule. Atomics and `st_release` are strong
accesses, which order themselves: they clear the record. A cta-scope order publishes
nothing across CTAs; cluster scope is taken as gpu scope."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import ir
from .errors import fail, note

SYNCING = ("acquire", "release", "acq_rel")


def communicates(k: ir.Kernel) -> bool:
    """Whether the CTAs of `k` may talk through global memory: it has global atomics,
    ordered loads or release stores."""
    return any(isinstance(s, ir.StoreRelease) or ir.has_expr(s, (ir.Atomic, ir.AtomicLoad))
               for s in ir.walk(k.body))


class Stores:
    """Per byte of one argument array: the CTA (-1: none, or a strong access) and thread
    whose plain store wrote it last, that thread's clock then and the store's site."""

    __slots__ = ("cta", "tid", "clock", "site")

    def __init__(self, size: int):
        self.cta = np.full(size, -1, np.int32)
        self.tid = np.zeros(size, np.int32)
        self.clock = np.zeros(size, np.int64)
        self.site = np.zeros(size, np.int32)


class GridOrder:
    """The releases of a grid's CTAs and the plain global stores they must order."""

    def __init__(self, ncta: int, local: int, per_rank: int = 0):
        self.ncta = ncta
        self.per_rank = per_rank  # the CTAs of one rank's launch under run_ranks (0: one launch)
        self.names = [""] * ncta  # each CTA's label, set as it starts
        self.local = local  # the columns of one CTA's own agents (hb.Clocks)
        self.known: list[list[np.ndarray]] = [[] for _ in range(ncta)]  # per CTA and release
        self.published: dict[int, np.ndarray] = {}  # address -> columns released there
        self.stores: dict[int, Stores] = {}  # region -> its stores
        self.sites: list[Any] = [None]
        self.site_ids: dict[int, int] = {}

    def _columns(self, vc: np.ndarray) -> np.ndarray:
        return vc[self.local:self.local + self.ncta]

    def ordered(self, th: Any, sem: str, scope: str, addr: int) -> None:
        """`th` ran an access with order `sem` at `scope` to global address `addr`."""
        if scope == "cta" or sem not in SYNCING:
            return
        cta, clocks = th.cta, th.cta.clocks
        if sem != "acquire":
            snap = clocks.release(th.tid)
            seq = self.known[cta.index]
            own = snap[:self.local]
            seq.append(own if not seq else np.maximum(seq[-1], own))
            cols = self._columns(snap).copy()
            cols[cta.index] = len(seq)
            old = self.published.get(addr)
            self.published[addr] = cols if old is None else np.maximum(old, cols)
        if sem != "release":
            pub = self.published.get(addr)
            if pub is not None:
                mine = self._columns(clocks.vc[th.tid])
                np.maximum(mine, pub, out=mine)

    def strong(self, region: int, off: int, n: int) -> None:
        """An atomic or release store wrote these bytes: it orders itself."""
        st = self.stores.get(region)
        if st is not None:
            st.cta[off:off + n] = -1

    def access(self, th: Any, region: int, name: str, off: int, n: int, esize: int, node: Any,
               write: bool) -> None:
        """A plain load (or store, `write`) of `n` bytes at `off` of argument `name`."""
        st = self.stores.get(region)
        if st is None:
            if not write:
                return
            st = self.stores[region] = Stores(len(th.cta.gmem.regions[region][1]))
        sel = slice(off, off + n)
        me = th.cta.index
        writers = st.cta[sel]
        if np.count_nonzero((writers >= 0) & (writers != me)):
            self._check(th, st, off, n, name, esize, node, write)
        if write:
            st.cta[sel] = me
            st.tid[sel] = th.tid
            st.clock[sel] = th.cta.clocks.vc[th.tid, th.tid]
            i = self.site_ids.get(id(node))
            if i is None:
                i = self.site_ids[id(node)] = len(self.sites)
                self.sites.append(node)
            st.site[sel] = i

    def _check(self, th: Any, st: Stores, off: int, n: int, name: str, esize: int, node: Any,
               write: bool) -> None:
        vc = th.cta.clocks.vc[th.tid]
        for b in range(off, off + n):
            a = int(st.cta[b])
            if a < 0 or a == th.cta.index:
                continue
            k = int(vc[self.local + a])
            if k and self.known[a][k - 1][int(st.tid[b])] >= st.clock[b]:
                continue
            writer = f"thread {int(st.tid[b])} of {self.label(a)}"
            site = self.sites[int(st.site[b])]
            fail("race", f"race: {th.name} {'writes' if write else 'reads'} element {b // esize} "
                 f"of '{name}', which {writer} stored, and no release of that CTA after the "
                 f"store was acquired by this thread: another CTA's plain store is visible "
                 "only through a release (st_release, or an atomic with release or acq_rel "
                 "order, after a CTA barrier when other threads stored) that this thread's "
                 "acquire (ld_acquire, or an atomic with acquire or acq_rel order, then a CTA "
                 "barrier) observes", node, note(f"{writer} stored it here", site))

    def label(self, index: int) -> str:
        """CTA `index` as messages name it."""
        rank = f" of rank {index // self.per_rank}" if self.per_rank else ""
        return f"CTA {self.names[index]}{rank}"
