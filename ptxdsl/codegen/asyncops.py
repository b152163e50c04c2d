"""Emitter services for the operation definitions (`ptxdsl/ops/`): mbarrier addresses,
declared arrival counts, and the watchdog's bounds on mbarrier waits and on spin loops. Mixed
into KernelEmitter; each operation's own PTX is written by its OpDef's `emit`."""

from __future__ import annotations

from typing import Any

from .. import ir
from .. import types as T
from ..errors import Span
from ..kernelinfo import WATCH_SPIN
from .writer import WATCHDOG_SYMBOL


class AsyncOps:
    """Helpers the OpDefs call; relies on the emitter's writer, layout and evaluators."""

    w: Any
    layout: Any
    smem_base: Any
    watchdog_ns: int
    sites: list[str]

    # provided by KernelEmitter
    def shared_addr(self, ref: ir.Expr) -> tuple[str, int]:
        raise NotImplementedError

    def ev_reg(self, e: ir.Expr) -> str:
        raise NotImplementedError

    def bar_addr(self, bar: ir.Expr) -> str:
        r, off = self.shared_addr(bar)
        return f"[{r}+{off}]" if off else f"[{r}]"

    def bounded_wait(self, s: ir.MBarrierWait,
                     poll: str = "mbarrier.try_wait.parity.shared::cta.b64") -> None:
        """A wait that gives up after the watchdog time (see `give_up_after`), reporting the
        parity and the barrier's offset in shared memory."""
        from ..printer import expr_text

        w = self.w
        site = self.watch_site(f"mbarrier {expr_text(s.bar)}"
                               + (f" in role '{s.role}'" if s.role else ""), s.loc)
        r, off = self.shared_addr(s.bar)
        a = f"[{r}+{off}]" if off else f"[{r}]"
        parity = self.ev_reg(s.parity)
        where = w.reg(T.u32)
        w.instr("sub.u32", where, r, self.smem_base)  # type: ignore[arg-type]
        w.instr("add.u32", where, where, str(off))
        t0, p = w.reg(T.u64), w.reg(T.pred)
        top, done = w.label("wait"), w.label("waited")
        w.instr("mov.u64", t0, "%globaltimer")
        w.place_label(top)
        w.instr(poll, p, a, parity)
        w.instr("bra", done, guard=p)
        self.give_up_after(t0, top, site, {1: parity, 4: where})
        w.place_label(done)

    def spin_clock(self, s: ir.While) -> str | None:
        """The start time of a loop the watchdog bounds, or None: one whose condition reads
        global memory through an atomic or an ordered load spins until another CTA (or GPU)
        writes, forever if it never does."""
        if not self.watchdog_ns or not ir.has_expr(s.cond, (ir.Atomic, ir.AtomicLoad)):
            return None
        t0 = self.w.reg(T.u64)
        self.w.instr("mov.u64", t0, "%globaltimer")
        return t0

    def spin_check(self, s: ir.While, t0: str) -> None:
        """In a bounded spin loop whose condition still holds: go on into the body, or give
        up once the loop has spun for the watchdog time."""
        from ..printer import expr_text

        site = self.watch_site(f"spin loop `while {expr_text(s.cond)}`", s.loc)
        body = self.w.label("spin")
        self.give_up_after(t0, body, site, {5: str(WATCH_SPIN)})
        self.w.place_label(body)

    def watch_site(self, what: str, loc: Span | None) -> int:
        """Record a bounded wait's description for the host's message; its number (1-based)
        is what the device reports."""
        self.sites.append(what + (f" at {loc}" if loc is not None else ""))
        return len(self.sites)

    def give_up_after(self, t0: str, again: str, site: int, words: dict[int, str]) -> None:
        """Branch to `again` while less than the watchdog time has passed since `t0`; else the
        first thread to time out writes `site`, its block and thread, and `words` (report
        word -> operand) to the host-mapped report, and every thread that times out traps."""
        w = self.w
        now, in_time = w.reg(T.u64), w.reg(T.pred)
        w.instr("mov.u64", now, "%globaltimer")
        w.instr("sub.u64", now, now, t0)
        w.instr("setp.lt.u64", in_time, now, str(self.watchdog_ns))
        w.instr("bra", again, guard=in_time)
        report, first, old = w.reg(T.u64), w.reg(T.pred), w.reg(T.u32)
        w.instr("ld.global.u64", report, f"[{WATCHDOG_SYMBOL}]")
        w.instr("setp.eq.u64", first, report, "0")
        w.instr("trap", guard=first)  # no report buffer registered: just stop
        w.instr("atom.global.cas.b32", old, f"[{report}]", "0", str(site))
        w.instr("setp.eq.u32", first, old, "0")
        cta, tid = w.reg(T.u32), w.reg(T.u32)
        w.instr("mov.u32", cta, "%ctaid.x")
        w.instr("mov.u32", tid, "%tid.x")
        for i, v in sorted({2: cta, 3: tid, **words}.items()):
            w.instr("st.global.u32", f"[{report}+{4 * i}]", v, guard=first)
        w.instr("membar.sys")
        w.instr("trap")

    def peer_addr(self, p: ir.Peer) -> str:
        """`mapa`: the shared::cluster address of place `p.ref` in the CTA of rank `p.rank`."""
        r, off = self.shared_addr(p.ref)  # type: ignore[attr-defined]
        w = self.w
        if off:
            a = w.reg(T.u32)
            w.instr("add.u32", a, r, str(off))
            r = a
        out = w.reg(T.u32)
        w.instr("mapa.shared::cluster.u32", out, r, self.ev(p.rank))  # type: ignore[attr-defined]
        return out

    def decl_count(self, bar: ir.Expr) -> int:
        while isinstance(bar, ir.Index):
            bar = bar.base
        return self.layout.barrier_count(bar.name)  # type: ignore[attr-defined]
