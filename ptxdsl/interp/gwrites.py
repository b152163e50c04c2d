"""Writes of global memory by the CTAs of a launch (issue 44, class 9): two CTAs (or two
ranks) that write the same element with nothing ordering the writes race, whichever order a
seed ran them in, since the value left there depends on which write lands last.

Every plain, vector, bulk and tensor store of a launch of more than one CTA records, per byte
of the array it writes, its CTA, thread, that thread's clock (`hb.py`), the CTA's cluster
release epoch (`dsmem.py`) and the store's site; an async store records them as its bytes
land, for its issuing thread. A write by another CTA is ordered after the recorded one only
through a release the second writer acquired that the first write happened before: an
atomic or `st_release` and its acquire in a grid that talks through global memory
(`gorder.py`, which checks plain loads against the same record), or the cluster barrier (or a
remote mbarrier arrive) inside a cluster. Launches are the other order: each `run` starts a
fresh record. Atomics, `st_release` and reductions (`red`, `cp.reduce.async.bulk`) order
themselves: they clear the record, so atomic updates of one element never race. Two CTAs
storing the same value still race: the model follows the hardware's rule, not the data.

Arrays are told apart by the address and size of their host bytes, so a tensor map and a
pointer over the same array share one record."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import fail, note

Key = tuple[int, int]


def key_of(array: np.ndarray) -> Key:
    """The record an array's stores go to: its host address and byte size."""
    return array.__array_interface__["data"][0], array.nbytes


@dataclass(frozen=True)
class Dest:
    """The bytes of a global array an async store writes: `sel` indexes the array's bytes
    viewed with `shape` (flat, or the array's shape and then its element bytes)."""

    key: Key
    shape: tuple[int, ...]
    sel: Any
    name: str
    esize: int


def flat_dest(key: Key, off: int, nbytes: int, name: str, esize: int) -> Dest:
    return Dest(key, (key[1],), slice(off, off + nbytes), name, esize)


def window_dest(array: np.ndarray, window: tuple[slice, ...], name: str) -> Dest:
    """The bytes of `array[window]` (a tensor map's box inside the tensor)."""
    return Dest(key_of(array), (*array.shape, array.itemsize), (*window, slice(None)), name,
                array.itemsize)


class Written:
    """Per byte of one array: the CTA whose store wrote it last (-1: none, or an access that
    orders itself), its thread, the thread's clock and the CTA's cluster epoch then, and the
    store's site."""

    __slots__ = ("cta", "tid", "clock", "epoch", "site")

    def __init__(self, size: int):
        self.cta = np.full(size, -1, np.int32)
        self.tid = np.zeros(size, np.int32)
        self.clock = np.zeros(size, np.int64)
        self.epoch = np.zeros(size, np.int64)
        self.site = np.zeros(size, np.int32)


class GlobalWrites:
    """The record of one launch's (or one `run_ranks` call's) global stores."""

    def __init__(self, per_rank: int = 0) -> None:
        self.per_rank = per_rank  # the CTAs of one rank's launch under run_ranks (0: one launch)
        self.arrays: dict[Key, Written] = {}
        self.ctas: dict[int, Any] = {}  # CTA index -> the CTA, for clusters and messages
        self.sites: list[tuple[Any, str]] = [(None, "")]  # (node, who issued an async store)
        self.site_ids: dict[int, int] = {}

    def write(self, th: Any, key: Key, shape: tuple[int, ...], sel: Any, name: str,
              esize: int, node: Any, what: str = "") -> None:
        """`th` (or the async store `what` names, which it issued) writes bytes `sel` of
        array `key`."""
        w = self.arrays.get(key)
        if w is None:
            w = self.arrays[key] = Written(key[1])
        flat = len(shape) == 1
        cta = th.cta
        me = cta.index
        writers = (w.cta if flat else w.cta.reshape(shape))[sel]
        if np.count_nonzero((writers != me) & (writers >= 0)):
            self._check(th, w, shape, sel, name, esize, node, what)
        writers[...] = me
        i = self.site_ids.get(id(node))
        if i is None:
            i = self.site_ids[id(node)] = len(self.sites)
            self.sites.append((node, what))
        if me not in self.ctas:
            self.ctas[me] = cta
        (w.site if flat else w.site.reshape(shape))[sel] = i
        (w.tid if flat else w.tid.reshape(shape))[sel] = th.tid
        if cta.gmem.order is not None:
            (w.clock if flat else w.clock.reshape(shape))[sel] = cta.clocks.vc[th.tid, th.tid]
        if cta.cluster is not None:
            (w.epoch if flat else w.epoch.reshape(shape))[sel] = cta.publication.epoch

    def landed(self, th: Any, dest: Dest, node: Any) -> None:
        """An async store issued by `th` wrote `dest`."""
        self.write(th, dest.key, dest.shape, dest.sel, dest.name, dest.esize, node,
                   f"the {node.syntax} issued by ")

    def strong(self, key: Key, shape: tuple[int, ...], sel: Any) -> None:
        """An atomic, release store or reduction wrote these bytes: it orders itself."""
        w = self.arrays.get(key)
        if w is not None:
            (w.cta if len(shape) == 1 else w.cta.reshape(shape))[sel] = -1

    def ordered(self, th: Any, w: Written, b: int) -> bool:
        """Whether the store recorded at byte `b` happened before `th`'s present."""
        a = int(w.cta[b])
        if a < 0 or a == th.cta.index:
            return True
        order = th.cta.gmem.order
        if order is not None and order.covers(th, a, int(w.tid[b]), int(w.clock[b])):
            return True
        writer, cluster = self.ctas[a], th.cta.cluster
        return cluster is not None and writer.cluster is cluster and \
            th.cta.publication.known.get(writer.rank, 0) > w.epoch[b]

    def label(self, index: int) -> str:
        """CTA `index` as messages name it."""
        rank = f" of rank {index // self.per_rank}" if self.per_rank else ""
        return f"CTA {self.ctas[index].label}{rank}"

    def writer(self, w: Written, b: int) -> tuple[str, Any]:
        """Who stored byte `b` last, as messages name them, and the store's site."""
        node, what = self.sites[int(w.site[b])]
        return f"{what}thread {int(w.tid[b])} of {self.label(int(w.cta[b]))}", node

    def _check(self, th: Any, w: Written, shape: tuple[int, ...], sel: Any, name: str,
               esize: int, node: Any, what: str) -> None:
        me = th.cta.index
        writers = (w.cta if len(shape) == 1 else w.cta.reshape(shape))[sel]
        starts = np.array([s.start or 0 for s in (sel if isinstance(sel, tuple) else (sel,))])
        strides = np.cumprod((*shape[1:], 1)[::-1])[::-1]
        at = (np.argwhere((writers != me) & (writers >= 0)) + starts) @ strides
        # the bytes one store wrote share a record: decide each record once, in byte order
        records = np.stack([w.cta[at], w.tid[at], w.clock[at], w.epoch[at]], axis=1)
        _, first = np.unique(records, axis=0, return_index=True)
        for i in sorted(first):
            b = int(at[i])
            if not self.ordered(th, w, b):
                self._race(th, w, shape, b, name, esize, node, what)

    def _race(self, th: Any, w: Written, shape: tuple[int, ...], b: int, name: str, esize: int,
              node: Any, what: str) -> None:
        i = b // esize
        if len(shape) == 1:
            element = f"element {i} of '{name}'"
        else:
            index = ", ".join(str(int(x)) for x in np.unravel_index(i, shape[:-1]))
            element = f"element [{index}] of '{name}'"
        who, site = self.writer(w, b)
        fail("race", f"race: {what}{th.name} writes {element}, which {who} stored, and nothing "
             "orders the two stores: two CTAs write the same element and the value left "
             "depends on which lands last. Give each CTA its own elements, or order the "
             "stores: a release after the first (st_release, or an atomic with release or "
             "acq_rel order, after a CTA barrier) that the second writer acquires (ld_acquire, "
             "or an atomic with acquire or acq_rel order, then a CTA barrier), or a cluster "
             "barrier between CTAs of one cluster", node, note(f"{who} stored it here", site))
