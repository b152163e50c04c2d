"""One mbarrier object, modelled on the PTX ISA phase model (reference/ptx-async.md §2).

init(n): phase 0, pending = expected = n, tx = 0. arrive(c): pending -= c. expect_tx(b):
tx += b. complete_tx(b) (by a copy): tx -= b. When pending == 0 and tx == 0 the phase
completes: phase += 1, pending = expected. `wait(parity P)` succeeds while the current phase's
parity differs from P, i.e. once the phase of parity P has completed; on a fresh barrier
(phase 0) `wait(1)` therefore succeeds at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import Note
from .errors import fail, note, threads_phrase

if TYPE_CHECKING:
    from .state import CTAState, ThreadState

MAX_COUNT = (1 << 20) - 1
MAX_TX = (1 << 20) - 1


class MBarrier:
    """The state of one mbarrier of one CTA, and its agent in the happens-before model: its
    clock advances with each completed phase (plus an offset per re-initialisation)."""

    __slots__ = ("label", "cta", "agent", "initialised", "phase", "pending", "expected", "tx",
                 "waiters", "init_node", "init_tid", "init_clock", "fenced", "base",
                 "pending_vc", "last_vc", "copies", "published", "last_published")

    def __init__(self, label: str, cta: CTAState, agent: int):
        self.label = label
        self.cta = cta
        self.agent = agent
        self.initialised = False
        self.phase = 0
        self.pending = 0
        self.expected = 0
        self.tx = 0
        self.waiters: list[ThreadState] = []
        self.init_node: Any = None
        self.init_tid = -1
        self.init_clock = 0
        self.fenced = False  # the initialising thread ran a fence after the init
        self.base = 0  # agent clock of the phases completed before the latest init
        self.pending_vc = cta.clocks.zeros()  # what the arrivals of this phase published
        self.last_vc = cta.clocks.zeros()  # what the latest completed phase published
        self.copies = 0  # in-flight copies that will complete_tx on this barrier
        # cluster rank -> epoch that remote arrivals of this phase (the latest completed one)
        # published (dsmem.py)
        self.published: dict[int, int] = {}
        self.last_published: dict[int, int] = {}

    def state(self) -> str:
        """`phase 2 (parity 0, not complete): 1 of 1 arrival(s) pending, tx-count 4096`."""
        return (f"phase {self.phase} (parity {self.phase & 1}, not complete): {self.pending} of "
                f"{self.expected} arrival(s) pending, tx-count {self.tx}")

    def explain(self, cta: CTAState, tids: list[int], parity: int) -> tuple[str, list[Note]]:
        """Why threads `tids`, waiting for `parity`, are stuck (for the deadlock report)."""
        notes = []
        if self.tx > 0 and not self.pending:
            notes.append(Note(f"every arrival came, but {self.tx} bytes armed by expect_tx "
                              "never landed: does expect_tx exceed the bytes copied?"))
        elif self.tx < 0:
            notes.append(Note(f"{-self.tx} bytes landed that no expect_tx armed: does "
                              "expect_tx fall short of the bytes copied?"))
        notes.append(note(f"'{self.label}' was initialised here", self.init_node))
        return (f"{threads_phrase(tids, 'wait')} on mbarrier {self.label} for the phase of "
                f"parity {parity} to complete, but {self.label} is in {self.state()}", notes)

    def delivery_clock(self) -> int:
        """The agent clock at which bytes landing now become visible: when the current
        phase completes."""
        return self.base + self.phase + 1

    def check_use(self, th: ThreadState, node: Any, verb: str) -> None:
        """Errors for using a barrier that is not initialised, or whose initialisation by
        another thread does not happen before this use."""
        if not self.initialised:
            extra = (note(f"'{self.label}' was invalidated or initialised here", self.init_node),)
            fail("mbarrier", f"{th.name} {verb} mbarrier {self.label}, which is not initialised",
                 node, *(extra if self.init_node is not None else ()))
        if th.tid != self.init_tid and not self.cta.clocks.knows(th.tid, self.init_tid,
                                                                  self.init_clock):
            fail("mbarrier", f"{th.name} {verb} mbarrier {self.label} before its initialisation "
                 f"is visible to it: thread {self.init_tid} must pass a barrier (bar_sync) "
                 "after mbarrier_init", node,
                 note(f"'{self.label}' was initialised here", self.init_node))

    def check_async_use(self, th: ThreadState, node: Any) -> None:
        """A copy will complete on this barrier: the copy engine (async proxy) sees the
        initialisation only after the initialising thread's fence_mbarrier_init()."""
        self.check_use(th, node, f"issues a {node.syntax} completing on")
        if not self.fenced:
            fail("mbarrier", f"a {node.syntax} completes on mbarrier {self.label}, but thread "
                 f"{self.init_tid} did not run fence_mbarrier_init() after initialising it: the "
                 "copy engine may see it uninitialised", node,
                 note(f"'{self.label}' was initialised here", self.init_node))

    def init(self, th: ThreadState, count: int, node: Any) -> None:
        if self.initialised:
            fail("mbarrier", f"{th.name} initialises mbarrier {self.label} again while it is "
                 "live (mbarrier_inval it first)", node,
                 note("it was initialised here", self.init_node))
        if not 1 <= count <= MAX_COUNT:
            fail("mbarrier", f"mbarrier arrival count must be in [1, {MAX_COUNT}], got {count}",
                 node)
        self.base += self.phase + 1
        self.initialised = True
        self.phase, self.pending, self.expected, self.tx = 0, count, count, 0
        self.pending_vc = self.cta.clocks.zeros()
        self.last_vc = self.cta.clocks.zeros()
        self.published, self.last_published = {}, {}
        self.init_node, self.init_tid = node, th.tid
        self.init_clock = int(self.cta.clocks.vc[th.tid, th.tid])
        self.fenced = False
        th.inits.append(self)

    def inval(self, th: ThreadState, node: Any) -> None:
        self.check_use(th, node, "invalidates")
        if self.waiters or self.copies:
            what = "threads wait on it" if self.waiters else "a copy will still complete on it"
            fail("mbarrier", f"{th.name} invalidates mbarrier {self.label} while {what}", node)
        self.initialised = False
        self.init_node = node

    def arrive(self, th: ThreadState, count: int, node: Any) -> None:
        """`mbarrier.arrive` (release): publishes `th`'s clock to this phase's waiters."""
        self.check_use(th, node, "arrives on")
        if count < 1 or count > self.pending:
            what = "an arrive count must be at least 1" if count < 1 else "too many arrivals"
            fail("mbarrier", f"{what}: {th.name} arrives on {self.label} with count {count}, "
                 f"but {self.label} is in {self.state()}", node,
                 note(f"'{self.label}' was initialised here", self.init_node))
        np.maximum(self.pending_vc, self.cta.clocks.release(th.tid), out=self.pending_vc)
        self.pending -= count
        self._advance()

    def expect_tx(self, th: ThreadState, nbytes: int, node: Any) -> None:
        self.check_use(th, node, "sets expect_tx on")
        self._add_tx(nbytes, node)
        self._advance()  # bytes that landed before they were expected may now balance

    def complete_tx(self, nbytes: int, node: Any, vc: np.ndarray) -> None:
        """A copy issued by a thread whose clock was `vc` delivered `nbytes`."""
        if not self.initialised:
            fail("mbarrier", f"a copy completes {nbytes} bytes on mbarrier {self.label}, which "
                 "is not initialised", node)
        np.maximum(self.pending_vc, vc, out=self.pending_vc)
        self._add_tx(-nbytes, node)
        self._advance()

    def done(self, parity: int) -> bool:
        """`try_wait.parity`: whether the phase of this parity has completed."""
        return (self.phase & 1) != parity

    def acquire(self, th: ThreadState) -> None:
        """A successful wait: `th` observes the latest completed phase."""
        self.cta.clocks.acquire(th.tid, self.last_vc)
        if self.last_published:
            th.cta.publication.acquire(self.last_published)

    def _add_tx(self, delta: int, node: Any) -> None:
        tx = self.tx + delta
        if not -MAX_TX <= tx <= MAX_TX:
            fail("mbarrier", f"the tx-count of mbarrier {self.label} would become {tx} bytes; a "
                 f"phase tracks at most {MAX_TX} (in {self.state()})", node)
        self.tx = tx

    def _advance(self) -> None:
        if self.pending or self.tx:
            return
        self.phase += 1
        self.pending = self.expected
        self.last_vc, self.pending_vc = self.pending_vc, self.cta.clocks.zeros()
        self.last_vc[self.agent] = self.base + self.phase
        self.last_published, self.published = self.published, {}
        if self.waiters:
            self.cta.wake(self)
