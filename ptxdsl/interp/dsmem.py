"""Ordering of shared memory across the CTAs of a cluster (DSMEM), which `hb.py`'s vector
clocks (one CTA's threads and barriers) do not reach.

Each CTA counts its cluster-scope releases (an arrival on the cluster barrier with
`.release`, a remote mbarrier arrive, which is `.release.cluster`): its epoch. A shared-memory
byte that a generic store writes remembers the writing CTA and its epoch then; a release
publishes the CTA's writes of earlier epochs, and a CTA acquires what a peer published
through the cluster barrier generation, or the mbarrier phase, it waited for. A read of a
byte another CTA wrote is ordered after that write only if the reader's CTA has acquired a
later epoch of the writer's. A relaxed cluster arrival publishes nothing; a remote arrive
publishes only to the CTA whose barrier it reaches. (The writer's and reader's own threads
are taken together: which thread of a CTA released or acquired is `hb.py`'s concern.)"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import fail


class Publication:
    """One CTA's cluster-scope release epoch, and the epochs of its peers it has acquired."""

    __slots__ = ("epoch", "known")

    def __init__(self) -> None:
        self.epoch = 0
        self.known: dict[int, int] = {}

    def release(self) -> int:
        """Publishes this CTA's writes so far: the epoch a reader must acquire to see them."""
        self.epoch += 1
        return self.epoch

    def acquire(self, published: dict[int, int]) -> None:
        for rank, epoch in published.items():
            if epoch > self.known.get(rank, 0):
                self.known[rank] = epoch


def publish(into: dict[int, int], rank: int, epoch: int) -> None:
    if epoch > into.get(rank, 0):
        into[rank] = epoch


class Writers:
    """Per byte of one CTA's shared memory: the CTA whose generic store wrote it last (-1:
    none, or bytes an async copy delivered, which its mbarrier orders) and that CTA's epoch
    then."""

    __slots__ = ("rank", "epoch")

    def __init__(self, size: int):
        self.rank = np.full(size, -1, np.int16)
        self.epoch = np.zeros(size, np.int64)

    def wrote(self, sel: Any, cta: Any) -> None:
        self.rank[sel] = cta.rank
        self.epoch[sel] = cta.publication.epoch

    def check_read(self, sel: Any, reader: Any, owner: Any, th: Any, node: Any) -> None:
        """`th` of CTA `reader` reads `sel` of CTA `owner`'s shared memory."""
        ranks = self.rank[sel]
        others = (ranks >= 0) & (ranks != reader.rank)
        if not np.count_nonzero(others):
            return
        known = reader.publication.known
        seen = np.array([known.get(int(r), 0) for r in ranks], np.int64)
        bad = others & (seen <= self.epoch[sel])
        if np.count_nonzero(bad):
            i = int(np.argmax(bad))
            off = (sel.start if isinstance(sel, slice) else 0) + i
            writer = int(ranks[i])
            fail("race", f"race: {th.name} reads {owner.smem.where(off)} of cluster rank "
                 f"{owner.rank}, which cluster rank {writer} wrote, and no release of rank "
                 f"{writer} after that write was acquired by rank {reader.rank} (a relaxed "
                 "cluster arrival publishes nothing; a remote arrive publishes to the CTA "
                 "whose barrier it reaches)", node)
