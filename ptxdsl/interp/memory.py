"""Shared and global memory of an interpreted kernel.

Shared memory is one byte buffer per CTA, laid out by `codegen/layout.py`. Its address 0
stands at `base`, the least aligned address the emitter's in-kernel rounding allows, so
alignment and swizzle follow what the hardware may see. Per-byte shadow state drives the
checks (agents and clocks as in `hb.py`):
  w_agent, w_clock, w_site   the last write: a thread, or a barrier for bytes a copy delivered;
  r_agent, r_clock, r_site   the last read since that write (a thread);
  loading    id of an async load whose bytes are still in flight (not yet landed);
  reading    number of async stores reading the byte that no bulk wait has covered;
  gw_owner   1 + tid of the thread whose generic write is the byte's latest write, and
  gw_fence   the epoch of that writer's first fence_proxy_async() after it (0: none yet);
  written    whether anything wrote the byte (reading garbage warns).
Two accesses conflict unless the first happened before the second.

Global memory is the kernel's numpy arguments, each at its own virtual base address, so
pointer arithmetic works on plain integers. In a launch of several CTAs, `writes`
(gwrites.py) checks that stores are ordered after other CTAs' stores of the same bytes, and
in a grid whose CTAs talk through it, `order` (gorder.py) checks loads against them too.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import ir
from ..codegen.layout import Layout
from .dsmem import Writers
from .errors import InterpWarning, fail, note
from .gwrites import Dest, Key, flat_dest, key_of
from .hb import Clocks
from .scalar import Reader, Writer
from .state import Sel

if TYPE_CHECKING:
    from .copies import AsyncLoad, AsyncStore
    from .gorder import GridOrder
    from .gwrites import GlobalWrites
    from .state import ThreadState


def smem_base(layout: Layout) -> int:
    """The address at which shared memory starts: the least aligned one that the emitter's
    in-kernel rounding to `layout.align` allows."""
    return layout.align if layout.align < 1024 else 0


def first_offset(sel: Sel, mask: np.ndarray) -> int:
    """The byte offset of the first selected byte for which `mask` holds."""
    i = int(np.argmax(mask))
    return sel.start + i if isinstance(sel, slice) else int(sel[i])


class SharedMemory:
    """One CTA's dynamic shared memory and its shadow state."""

    def __init__(self, layout: Layout, garbage: bytes, clocks: Clocks, track_proxy: bool,
                 warned: set[int]):
        self.layout = layout
        self.base = smem_base(layout)
        self.clocks = clocks
        size = len(garbage)
        self.buf = bytearray(garbage)  # real shared memory starts with garbage
        self.u8 = np.frombuffer(self.buf, np.uint8)
        self.written = np.zeros(size, bool)
        # the agents and clocks of the last write and read side by side, so that a generic
        # write checks both in one go
        self.accessors = np.full((size, 2), -1, np.int32)
        self.stamps = np.zeros((size, 2), np.int64)
        self.w_agent, self.r_agent = self.accessors[:, 0], self.accessors[:, 1]
        self.w_clock, self.r_clock = self.stamps[:, 0], self.stamps[:, 1]
        self.w_site = np.zeros(size, np.int32)
        self.r_site = np.zeros(size, np.int32)
        self.loading = np.zeros(size, np.int32)
        self.reading = np.zeros(size, np.int32)
        self.track_proxy = track_proxy
        self.gw_owner = np.zeros(size, np.int32)
        self.gw_fence = np.zeros(size, np.int64)
        self.loads: dict[int, AsyncLoad] = {}
        self.stores: dict[int, AsyncStore] = {}
        self.version = 0  # counts the changes to the bytes
        self.gathered: dict[Any, tuple[Any, int, np.ndarray]] = {}  # see wgmma.raw
        self.sites: list[Any] = [None]
        self.site_ids: dict[int, int] = {}
        self.agents: list[str] = []  # names of the barrier agents, for messages
        self.warned = warned
        self.writers: Writers | None = None  # in a cluster: which CTA wrote each byte

    # ------------------------------------------------------------------ naming

    def where(self, off: int) -> str:
        """The element at a byte offset, as the kernel writes it: `stage[1, 4]`."""
        for s in self.layout.items:
            if s.offset <= off < s.offset + s.nbytes:
                d = s.decl
                if not isinstance(d, ir.SharedDecl):
                    return f"mbarrier '{s.name}'"
                i = (off - s.offset) // d.elem.nbytes
                idx = np.unravel_index(i, d.shape)
                return f"{s.name}[{', '.join(str(int(x)) for x in idx)}]"
        return f"shared-memory byte {off} (outside every buffer)"

    def site(self, node: Any) -> int:
        """The number under which the shadow state records `node` (from 1)."""
        i = self.site_ids.get(id(node))
        if i is None:
            i = self.site_ids[id(node)] = len(self.sites)
            self.sites.append(node)
        return i

    # ------------------------------------------------------------------ happens-before

    @staticmethod
    def _unordered(sel: Sel, agents: np.ndarray, clocks: np.ndarray,
                   vc: np.ndarray) -> int | None:
        """The first byte whose recorded access `vc` does not cover (a thread's own accesses
        and unrecorded bytes, agent -1, always are)."""
        bad = vc.take(agents) < clocks
        return first_offset(sel, bad) if np.count_nonzero(bad) else None

    def _conflict(self, th: ThreadState, off: int, node: Any, what: str, write: bool) -> None:
        """Report the recorded access at byte `off` that `what` is not ordered after."""
        if write:
            agent, site = int(self.w_agent[off]), self.sites[int(self.w_site[off])]
        else:
            agent, site = int(self.r_agent[off]), self.sites[int(self.r_site[off])]
        nthreads = th.cta.nthreads
        if agent >= nthreads:
            label = self.agents[agent - nthreads]
            fail("race", f"race: {what} {self.where(off)}, which a {site.syntax} delivered on "
                 f"mbarrier {label}, but nothing orders that delivery before it: no wait of "
                 f"this thread observed that phase of {label} complete", node,
                 note(f"the {site.syntax} was issued here", site))
        other = th.cta.threads[agent].name
        verb = "wrote" if write else "read"
        fail("race", f"race: {what} {self.where(off)}, which {other} {verb}, and nothing orders "
             f"that {'write' if write else 'read'} before it (a barrier, or an mbarrier arrive "
             "observed by a wait)", node, note(f"{other} {verb} it here", site))

    def _check_after_writes(self, th: ThreadState, sel: Sel, vc: np.ndarray, node: Any,
                            what: str) -> None:
        off = self._unordered(sel, self.w_agent[sel], self.w_clock[sel], vc)
        if off is not None:
            self._conflict(th, off, node, what, write=True)

    def _check_after_reads(self, th: ThreadState, sel: Sel, vc: np.ndarray, node: Any,
                           what: str) -> None:
        off = self._unordered(sel, self.r_agent[sel], self.r_clock[sel], vc)
        if off is not None:
            self._conflict(th, off, node, what, write=False)

    def _check_after_accesses(self, th: ThreadState, sel: Sel, vc: np.ndarray, node: Any,
                              what: str) -> None:
        """A write of `sel`: report the first recorded write, then read, it is not ordered
        after (both checked in one go first)."""
        if np.count_nonzero(vc.take(self.accessors[sel]) < self.stamps[sel]):
            self._check_after_writes(th, sel, vc, node, what)
            self._check_after_reads(th, sel, vc, node, what)

    # ------------------------------------------------------------------ generic accesses

    def read(self, th: ThreadState, off: int, n: int, rd: Reader, node: Any) -> Any:
        sel = slice(off, off + n)
        if self.loads:
            self._check_in_flight(th, sel, node, "reads")
        tid = th.tid
        vc = self.clocks.vc[tid]
        if np.count_nonzero(vc.take(self.w_agent[sel]) < self.w_clock[sel]):
            self._check_after_writes(th, sel, vc, node, f"{th.name} reads")
        written = self.written[sel]
        if np.count_nonzero(written) != written.size and id(node) not in self.warned:
            self.warned.add(id(node))
            loc = getattr(node, "loc", None)
            text = f"{th.name} reads {self.where(off)}, which nothing has written"
            warnings.warn(InterpWarning(f"{loc}: {text}" if loc else text), stacklevel=2)
        if self.writers is not None:
            self.writers.check_read(sel, th.cta, th.cta, th, node)
        self.r_agent[sel] = tid
        self.r_clock[sel] = vc[tid]
        self.r_site[sel] = self.site_ids.get(id(node)) or self.site(node)
        return rd(self.buf, off)

    def write(self, th: ThreadState, off: int, n: int, wr: Writer, value: Any, node: Any) -> None:
        sel = slice(off, off + n)
        if self.loads:
            self._check_in_flight(th, sel, node, "writes")
        if self.stores and np.count_nonzero(self.reading[sel]):
            store = self._store_at(off + int(np.argmax(self.reading[sel])))
            fail("race", f"race: {th.name} writes {self.where(off)} while a {store.op} may "
                 f"still read it ({store.issuer.name} has not waited for it with "
                 "bulk_wait_read)", node, note(f"the {store.op} was issued here", store.node))
        tid = th.tid
        vc = self.clocks.vc[tid]
        self._check_after_accesses(th, sel, vc, node, f"{th.name} writes")
        wr(self.buf, off, value)
        self.version += 1
        self.written[sel] = True
        self.w_agent[sel] = tid
        self.w_clock[sel] = vc[tid]
        self.w_site[sel] = self.site_ids.get(id(node)) or self.site(node)
        self.r_agent[sel] = -1
        if self.writers is not None:
            self.writers.wrote(sel, th.cta)
        if self.track_proxy:
            self.gw_owner[sel] = tid + 1
            self.gw_fence[sel] = 0
            last = th.unfenced[-1] if th.unfenced else None
            if last is not None and last[1] == off and last[2] is node:
                last[1] = off + n
            else:
                th.unfenced.append([off, off + n, node])

    def _check_in_flight(self, th: ThreadState, sel: Sel, node: Any, verb: str) -> None:
        ids = self.loading[sel]
        if np.count_nonzero(ids):
            load = self.loads[int(ids[np.argmax(ids != 0)])]
            hint = getattr(load, "hint", None) or f"wait on mbarrier {load.bar.label}"
            fail("race", f"race: {th.name} {verb} {self.where(first_offset(sel, ids != 0))} "
                 f"while a {load.op} into it is in flight ({hint} first)", node,
                 note(f"the {load.op} was issued here", load.node))

    def _store_at(self, off: int) -> AsyncStore:
        for s in self.stores.values():
            sel = s.src
            if (sel.start <= off < sel.stop) if isinstance(sel, slice) else (sel == off).any():
                return s
        raise AssertionError(off)

    # ------------------------------------------------------------------ proxy fences

    def fence(self, th: ThreadState) -> None:
        """fence_proxy_async(): this thread's generic writes so far may reach the async
        proxy of any thread that this fence happens before."""
        if not th.unfenced:
            return
        me, epoch = th.tid + 1, self.clocks.vc[th.tid, th.tid]
        bytes_ = np.array([i for a, b, _ in th.unfenced for i in range(a, b)], np.intp)
        mine = bytes_[(self.gw_owner[bytes_] == me) & (self.gw_fence[bytes_] == 0)]
        self.gw_fence[mine] = epoch
        th.unfenced.clear()

    def check_async_read(self, th: ThreadState, sel: Sel, node: Any, op: str) -> None:
        """An async store issued by `th` reads `sel`: every generic write there must be
        followed by its writer's fence_proxy_async(), and that fence must happen before the
        store (or be `th`'s own)."""
        owner = self.gw_owner[sel]
        if np.count_nonzero(owner):
            fence = self.gw_fence[sel]
            writer = np.maximum(owner - 1, 0)
            vc = self.clocks.vc[th.tid]
            seen = (writer == th.tid) | (vc[writer] >= fence)
            bad = (owner != 0) & ((fence == 0) | ~seen)
            if np.count_nonzero(bad):
                self._missing_fence(th, sel, bad, node, op)
        self._check_after_writes(th, sel, self.clocks.vc[th.tid], node,
                                 f"the {op} issued by {th.name} reads")

    def _missing_fence(self, th: ThreadState, sel: Sel, bad: np.ndarray, node: Any,
                       op: str) -> None:
        off = first_offset(sel, bad)
        writer = th.cta.threads[int(self.gw_owner[off]) - 1]
        site = self.sites[int(self.w_site[off])]
        if writer is th:
            why = "this thread wrote it with a generic store and has not run fence_proxy_async()"
        elif self.gw_fence[off]:
            why = (f"{writer.name} wrote it and ran fence_proxy_async(), but no barrier orders "
                   "that fence before this store")
        else:
            why = f"{writer.name} wrote it with a generic store and has not run fence_proxy_async()"
        fail("proxy-fence", f"missing proxy fence: the {op} issued by {th.name} reads "
             f"{self.where(off)}, but {why}; every writing thread needs fence_proxy_async() "
             "and then a barrier before the async proxy reads shared memory", node,
             note(f"{writer.name} wrote it here", site))

    # ------------------------------------------------------------------ async copies

    def begin_load(self, th: ThreadState, load: AsyncLoad, vc: np.ndarray) -> None:
        """A load issued by `th` (whose clock is `vc`) will write `load.dst`."""
        sel = load.dst
        if self.stores and np.count_nonzero(self.reading[sel]):
            off = first_offset(sel, self.reading[sel] != 0)
            store = self._store_at(off)
            fail("race", f"race: a {load.op} overwrites {self.where(off)} while a {store.op} "
                 f"may still read it ({store.issuer.name} has not waited for it with "
                 "bulk_wait_read)", load.node, note(f"the {store.op} was issued here", store.node))
        busy = self.loading[sel]
        if np.count_nonzero(busy):
            other = self.loads[int(busy[np.argmax(busy != 0)])]
            fail("race", f"race: a {load.op} writes {self.where(first_offset(sel, busy != 0))} "
                 f"while another {other.op} into it is in flight", load.node,
                 note(f"the other {other.op} was issued here", other.node))
        self._check_after_accesses(th, sel, vc, load.node,
                                   f"a {load.op} issued by {th.name} overwrites")
        self.loading[sel] = load.id
        self.loads[load.id] = load

    def deliver(self, load: AsyncLoad, sel: Sel, data: np.ndarray, agent: int,
                clock: int) -> None:
        """Bytes of `load` land: written by barrier `agent`, visible at its `clock`."""
        self.u8[sel] = data
        if self.writers is not None:
            self.writers.rank[sel] = -1  # ordered by the mbarrier it completes on
        self.version += 1
        self.written[sel] = True
        self.loading[sel] = 0
        self.w_agent[sel] = agent
        self.w_clock[sel] = clock
        self.w_site[sel] = self.site(load.node)
        self.r_agent[sel] = -1
        self.gw_owner[sel] = 0

    def end_load(self, load: AsyncLoad) -> None:
        del self.loads[load.id]

    def begin_store(self, store: AsyncStore) -> None:
        sel = store.src
        busy = self.loading[sel]
        if np.count_nonzero(busy):
            load = self.loads[int(busy[np.argmax(busy != 0)])]
            fail("race", f"race: a {store.op} reads {self.where(first_offset(sel, busy != 0))} "
                 f"while a {load.op} into it is in flight", store.node,
                 note(f"the {load.op} was issued here", load.node))
        self.reading[sel] += 1
        self.stores[store.id] = store

    def end_store(self, store: AsyncStore) -> None:
        """A bulk wait of the issuing thread covered the store: its source may be reused by
        whoever that thread's later releases reach."""
        sel, tid = store.src, store.issuer.tid
        self.reading[sel] -= 1
        del self.stores[store.id]
        self.r_agent[sel] = tid
        self.r_clock[sel] = self.clocks.vc[tid, tid]
        self.r_site[sel] = self.site(store.node)


class GlobalWatch:
    """What a thread spinning on global memory waits for: any write to global memory
    (`GlobalMemory.bump`), by any CTA. A loop whose condition would read the same values
    again blocks here instead of spinning, so the CTAs it waits for can run."""

    __slots__ = ("waiters",)

    def __init__(self) -> None:
        self.waiters: list[ThreadState] = []

    def explain(self, cta: Any, tids: list[int], detail: Any) -> tuple[str, list]:
        who = "thread" if len(tids) == 1 else "threads"
        return (f"{who} {', '.join(map(str, tids[:8]))}{' ...' if len(tids) > 8 else ''} "
                "spin on global memory that no running CTA will write again: the value this "
                "loop waits for never comes", [])


class GlobalMemory:
    """The kernel's pointer arguments: numpy arrays at virtual base addresses 2**40 apart.
    `epoch` counts the writes to global memory; spinning threads wait on `watch` for it to
    move."""

    SHIFT = 40

    def __init__(self) -> None:
        self.regions: list[tuple[str, memoryview, int]] = []
        self.keys: list[Key] = []  # each region's record in `writes`
        self.epoch = 0
        self.watch = GlobalWatch()
        self.wakes = 0  # how many writes woke spinning threads
        self.order: GridOrder | None = None
        self.writes: GlobalWrites | None = None

    def bump(self) -> None:
        """Global memory was written: wake the threads spinning on it, in whatever CTA."""
        self.epoch += 1
        if self.watch.waiters:
            self.wakes += 1
            for t in self.watch.waiters:
                t.cta.runnable.append(t)
            self.watch.waiters.clear()

    def add(self, name: str, array: np.ndarray) -> int:
        """Register an argument array; returns its base address."""
        self.regions.append((name, array.reshape(-1).view(np.uint8).data, array.nbytes))
        self.keys.append(key_of(array))
        return len(self.regions) << self.SHIFT

    def locate(self, th: ThreadState, addr: int, nbytes: int, esize: int, node: Any, what: str,
               align: int = 0, plain: str = "") -> tuple[memoryview, int]:
        """(bytes of the array, byte offset) of an access of `nbytes` to elements of
        `esize` bytes, bounds- and alignment-checked (`align` defaults to `esize`). `plain`
        is "read" or "write" for a plain load or store, which `order` checks."""
        r = (addr >> self.SHIFT) - 1
        off = addr & ((1 << self.SHIFT) - 1)
        if not 0 <= r < len(self.regions):
            fail("bounds", f"{th.name}: {what} at address 0x{addr:x}, which is not inside any "
                 "argument array", node)
        name, mv, size = self.regions[r]
        if off + nbytes > size:
            fail("bounds", f"{th.name}: {what} reaches element {(off + nbytes) // esize - 1} of "
                 f"'{name}', which has {size // esize} elements", node)
        align = align or esize
        if off % align:
            fail("alignment", f"{th.name}: {what} at byte {off} of '{name}' is not aligned to "
                 f"{align} bytes", node)
        if plain and self.writes is not None:
            key = self.keys[r]
            if plain == "write":
                self.writes.write(th, key, (size,), slice(off, off + nbytes), name, esize, node)
            elif self.order is not None:
                self.order.read(th, self.writes.arrays.get(key), name, off, nbytes, esize, node)
        return mv, off

    def dest(self, addr: int, nbytes: int, esize: int) -> Dest:
        """The bytes a bulk copy of `nbytes` at `addr`, which `locate` has checked, writes."""
        r = (addr >> self.SHIFT) - 1
        return flat_dest(self.keys[r], addr & ((1 << self.SHIFT) - 1), nbytes,
                         self.regions[r][0], esize)

    def strong(self, th: ThreadState, addr: int, nbytes: int, sem: str, scope: str) -> None:
        """An atomic access with order `sem` at `scope` (or a release store) at `addr`, which
        `locate` has checked."""
        if self.writes is not None:
            r, off = (addr >> self.SHIFT) - 1, addr & ((1 << self.SHIFT) - 1)
            self.writes.strong(self.keys[r], (self.regions[r][2],), slice(off, off + nbytes))
        if self.order is not None:
            self.order.ordered(th, sem, scope, addr)
