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

Plain global loads are checked against the record of the launch's stores (`gwrites.py`,
which checks the stores themselves): a load of a byte that another CTA stored is ordered
after that store only if the loading thread acquired a release of the writer's CTA that the
writer's store happened before; otherwise it is a race, whatever the schedule. A cta-scope
order publishes nothing across CTAs; cluster scope is taken as gpu scope."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import ir
from .errors import fail, note
from .gwrites import Written

SYNCING = ("acquire", "release", "acq_rel")


def communicates(k: ir.Kernel) -> bool:
    """Whether the CTAs of `k` may talk through global memory: it has global atomics,
    ordered loads or release stores."""
    return any(isinstance(s, ir.StoreRelease) or ir.has_expr(s, (ir.Atomic, ir.AtomicLoad))
               for s in ir.walk(k.body))


class GridOrder:
    """The releases of a grid's CTAs, which order its plain global accesses."""

    def __init__(self, ncta: int, local: int):
        self.ncta = ncta
        self.local = local  # the columns of one CTA's own agents (hb.Clocks)
        self.known: list[list[np.ndarray]] = [[] for _ in range(ncta)]  # per CTA and release
        self.published: dict[int, np.ndarray] = {}  # address -> columns released there

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

    def covers(self, th: Any, cta: int, tid: int, clock: int) -> bool:
        """Whether `th` acquired a release of CTA `cta` that the access of its thread `tid`
        at `clock` happened before."""
        k = int(th.cta.clocks.vc[th.tid, self.local + cta])
        return bool(k and self.known[cta][k - 1][tid] >= clock)

    def read(self, th: Any, w: Written | None, name: str, off: int, n: int, esize: int,
             node: Any) -> None:
        """A plain load of `n` bytes at `off` of argument `name`, whose stores `w` records."""
        if w is None:
            return
        writers = w.cta[off:off + n]
        me = th.cta.index
        if not np.count_nonzero((writers >= 0) & (writers != me)):
            return
        writes = th.cta.gmem.writes
        for b in range(off, off + n):
            if writes.ordered(th, w, b):
                continue
            writer, site = writes.writer(w, b)
            fail("race", f"race: {th.name} reads element {b // esize} of '{name}', which "
                 f"{writer} stored, and no release of that CTA after the store was acquired "
                 "by this thread: another CTA's plain store is visible only through a release "
                 "(st_release, or an atomic with release or acq_rel order, after a CTA barrier "
                 "when other threads stored) that this thread's acquire (ld_acquire, or an "
                 "atomic with acquire or acq_rel order, then a CTA barrier) observes", node,
                 note(f"{writer} stored it here", site))
