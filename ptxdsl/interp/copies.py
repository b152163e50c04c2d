"""Asynchronous copies in flight, and each thread's bulk async-groups.

The CTA scheduler advances copies one event at a time, at moments and in an order it picks
from its seeded random stream, so copies complete late and in varied orders. A load lands
in one to four chunks (16-byte granular), each doing complete_tx for its bytes, so an
expect_tx that is too small lets a phase complete while data is still landing. A store
first reads its shared-memory source (as late as possible), then writes global memory; its
source stays protected from generic writes until a bulk wait of the issuing thread covers it,
which is the contract, whenever the copy engine happens to read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .state import Sel

if TYPE_CHECKING:
    from .gwrites import Dest
    from .mbarrier import MBarrier
    from .state import CTAState, ThreadState

MAX_CHUNKS = 4


def _part(sel: Sel, a: int, b: int) -> Sel:
    return slice(sel.start + a, sel.start + b) if isinstance(sel, slice) else sel[a:b]


class AsyncLoad:
    """A bulk or tensor copy global -> shared completing its bytes on an mbarrier."""

    __slots__ = ("id", "op", "node", "cta", "bar", "dst", "fetch", "chunks", "data", "vc")

    def __init__(self, cta: CTAState, node: Any, bar: MBarrier, dst: Sel, nbytes: int,
                 fetch: Callable[[], np.ndarray]):
        self.id = cta.new_copy_id()
        self.op = node.syntax
        self.node, self.cta, self.bar, self.dst, self.fetch = node, cta, bar, dst, fetch
        self.data: np.ndarray | None = None
        rng = cta.rng
        k = rng.randint(1, max(1, min(MAX_CHUNKS, nbytes // 16)))
        cuts = sorted(rng.sample(range(16, nbytes, 16), k - 1))
        bounds = [0, *cuts, nbytes]
        self.chunks = list(zip(bounds, bounds[1:], strict=False))

    def start(self, th: ThreadState) -> None:
        self.vc = self.cta.clocks.release(th.tid)  # what the copy is ordered after
        self.cta.smem.begin_load(th, self, self.vc)
        self.bar.copies += 1

    def landing(self, part: Any, chunk: np.ndarray) -> np.ndarray:
        """The bytes a chunk leaves at `part`: the chunk itself (a reduction combines)."""
        return chunk

    def step(self) -> bool:
        """Land one chunk; True when the copy is finished."""
        if self.data is None:
            self.data = self.fetch()  # global memory is read when the first bytes land
        a, b = self.chunks.pop(self.cta.rng.randrange(len(self.chunks)))
        part, bar = _part(self.dst, a, b), self.bar
        self.cta.smem.deliver(self, part, self.landing(part, self.data[a:b]), bar.agent,
                              bar.delivery_clock())
        done = not self.chunks
        if done:
            bar.copies -= 1
            self.cta.smem.end_load(self)
        bar.complete_tx(b - a, self.node, self.vc)
        return done


class AsyncStore:
    """A bulk or tensor copy shared -> global, tracked by its thread's bulk async-groups."""

    __slots__ = ("id", "op", "node", "cta", "issuer", "src", "write", "dest", "reduces",
                 "data", "read_done", "write_done", "waited")

    def __init__(self, cta: CTAState, node: Any, issuer: ThreadState, src: Sel,
                 write: Callable[[np.ndarray], None], dest: Dest | None, reduces: bool = False):
        """`write` puts the bytes read from `src` into `dest` (None: none lie inside the
        tensor); a reduction (`reduces`) combines them element by element, atomically."""
        self.id = cta.new_copy_id()
        self.op = node.syntax
        self.node, self.cta, self.issuer, self.src, self.write = node, cta, issuer, src, write
        self.dest, self.reduces = dest, reduces
        self.data: np.ndarray | None = None
        self.read_done = False
        self.write_done = False
        self.waited = False

    def start(self, th: ThreadState) -> None:
        self.cta.smem.begin_store(self)
        self.issuer.bulk.open.append(self)

    def step(self) -> bool:
        if not self.read_done:
            self.data = self.cta.smem.u8[self.src].copy()
            self.read_done = True
        else:
            writes, dest = self.cta.gmem.writes, self.dest
            if writes is not None and dest is not None:  # other CTAs' stores there (gwrites.py)
                if self.reduces:
                    writes.strong(dest.key, dest.shape, dest.sel)
                else:
                    writes.landed(self.issuer, dest, self.node)
            self.write(self.data)  # type: ignore[arg-type]
            self.write_done = True
            self.cta.gmem.bump()
        groups = self.issuer.bulk
        if groups.waiters:
            self.cta.wake(groups)
        return self.write_done


class BulkGroups:
    """The bulk async-groups of one thread: `bulk_commit` closes the open group;
    `bulk_wait(n)` / `bulk_wait_read(n)` wait until at most the newest n groups are still
    writing / reading."""

    __slots__ = ("open", "groups", "read_waited", "waiters")

    def __init__(self) -> None:
        self.open: list[AsyncStore] = []
        self.groups: list[list[AsyncStore]] = []
        self.read_waited = 0  # oldest groups whose reads a bulk_wait_read has seen finish
        self.waiters: list[ThreadState] = []

    def commit(self) -> None:
        self.groups.append(self.open)
        self.open = []

    def _older(self, n: int) -> list[list[AsyncStore]]:
        return self.groups[: max(len(self.groups) - n, 0)]

    def done(self, n: int, read: bool) -> bool:
        if read:
            return all(c.read_done for g in self._older(n) for c in g)
        return all(c.write_done for g in self._older(n) for c in g)

    def retire(self, n: int, read: bool) -> None:
        """A wait for all but the newest `n` groups returned: their sources may be reused."""
        k = len(self._older(n))
        for g in self.groups[:k]:
            for c in g:
                if not c.waited:
                    c.waited = True
                    c.cta.smem.end_store(c)
        if read:
            self.read_waited = max(self.read_waited, k)
        else:
            del self.groups[:k]
            self.read_waited = max(self.read_waited - k, 0)

    def unwaited(self) -> list[AsyncStore]:
        """Stores whose source no wait has covered: uncommitted, or committed and not
        waited for."""
        return self.open + [c for g in self.groups[self.read_waited :] for c in g]
