"""Emitter services for the operation definitions (`ptxdsl/ops/`): mbarrier addresses,
declared arrival counts, and the watchdog's bounded wait. Mixed into KernelEmitter; each
operation's own PTX is written by its OpDef's `emit`."""

from __future__ import annotations

from typing import Any

from .. import ir
from .. import types as T
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
        """A wait that gives up after the watchdog time: the first thread to time out writes
        (site + 1, parity, block, thread, barrier offset) to the host-mapped report, then traps."""
        from ..printer import expr_text

        w = self.w
        self.sites.append(f"mbarrier {expr_text(s.bar)}"
                          + (f" in role '{s.role}'" if s.role else "")
                          + (f" at {s.loc}" if s.loc is not None else ""))
        site = len(self.sites)
        r, off = self.shared_addr(s.bar)
        a = f"[{r}+{off}]" if off else f"[{r}]"
        parity = self.ev_reg(s.parity)
        t0, now, p, late = w.reg(T.u64), w.reg(T.u64), w.reg(T.pred), w.reg(T.pred)
        top, done = w.label("wait"), w.label("waited")
        w.instr("mov.u64", t0, "%globaltimer")
        w.place_label(top)
        w.instr(poll, p, a, parity)
        w.instr("bra", done, guard=p)
        w.instr("mov.u64", now, "%globaltimer")
        w.instr("sub.u64", now, now, t0)
        w.instr("setp.lt.u64", late, now, str(self.watchdog_ns))
        w.instr("bra", top, guard=late)
        report, first, old = w.reg(T.u64), w.reg(T.pred), w.reg(T.u32)
        w.instr("ld.global.u64", report, f"[{WATCHDOG_SYMBOL}]")
        w.instr("setp.eq.u64", first, report, "0")
        w.instr("trap", guard=first)  # no report buffer registered: just stop
        w.instr("atom.global.cas.b32", old, f"[{report}]", "0", str(site))
        w.instr("setp.eq.u32", first, old, "0")
        cta, tid, where = w.reg(T.u32), w.reg(T.u32), w.reg(T.u32)
        w.instr("mov.u32", cta, "%ctaid.x")
        w.instr("mov.u32", tid, "%tid.x")
        w.instr("sub.u32", where, r, self.smem_base)  # type: ignore[arg-type]
        w.instr("add.u32", where, where, str(off))
        for i, v in enumerate((parity, cta, tid, where), start=1):
            w.instr("st.global.u32", f"[{report}+{4 * i}]", v, guard=first)
        w.instr("membar.sys")
        w.instr("trap")
        w.place_label(done)

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
