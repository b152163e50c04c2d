"""PTX for the intrinsic statements: mbarriers, fences, named barriers, bulk and tensor
copies, and the watchdog's bounded waits. Mixed into KernelEmitter."""

from __future__ import annotations

from typing import Any

from .. import ir
from .. import types as T
from .writer import WATCHDOG_SYMBOL


class AsyncOps:
    """Emission of ir.Op statements; relies on the emitter's writer, layout and evaluators."""

    w: Any
    layout: Any
    smem_base: Any
    watchdog_ns: int
    sites: list[str]

    def bar_addr(self, bar: ir.Expr) -> str:
        r, off = self.shared_addr(bar)
        return f"[{r}+{off}]" if off else f"[{r}]"

    def op(self, s: ir.Op) -> None:
        w = self.w
        if isinstance(s, ir.MBarrierInit):
            count = self.ev(s.count) if s.count is not None else str(self.decl_count(s.bar))
            w.instr("mbarrier.init.shared::cta.b64", self.bar_addr(s.bar), count)
        elif isinstance(s, ir.MBarrierArrive):
            extra = [self.ev(s.count)] if s.count is not None else []
            w.instr("mbarrier.arrive.release.cta.shared::cta.b64", "_", self.bar_addr(s.bar),
                    *extra)
        elif isinstance(s, ir.MBarrierArriveExpectTx):
            w.instr("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64", "_",
                    self.bar_addr(s.bar), self.ev(s.nbytes))
        elif isinstance(s, ir.MBarrierExpectTx):
            w.instr("mbarrier.expect_tx.relaxed.cta.shared::cta.b64", self.bar_addr(s.bar),
                    self.ev(s.nbytes))
        elif isinstance(s, ir.MBarrierWait):
            if self.watchdog_ns:
                self.bounded_wait(s)
                return
            a, parity = self.bar_addr(s.bar), self.ev(s.parity)
            p = w.reg(T.pred)
            top = w.label("wait")
            w.place_label(top)
            w.instr("mbarrier.try_wait.parity.shared::cta.b64", p, a, parity)
            w.instr("bra", top, guard=f"!{p}")
        elif isinstance(s, ir.MBarrierInval):
            w.instr("mbarrier.inval.shared::cta.b64", self.bar_addr(s.bar))
        elif isinstance(s, ir.FenceProxyAsync):
            w.instr("fence.proxy.async.shared::cta")
        elif isinstance(s, ir.FenceMBarrierInit):
            w.instr("fence.mbarrier_init.release.cluster")
        elif isinstance(s, ir.BarSync):
            extra = [self.ev(s.nthreads)] if s.nthreads is not None else []
            w.instr("bar.sync", self.ev(s.id), *extra)
        elif isinstance(s, ir.BarArrive):
            w.instr("bar.arrive", self.ev(s.id), self.ev(s.nthreads))
        elif isinstance(s, ir.BulkLoad):
            _, dst = self.addr(s.dst)
            _, src = self.addr(s.src)
            w.instr("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes", dst, src,
                    self.ev(s.nbytes), self.bar_addr(s.bar))
        elif isinstance(s, ir.BulkStore):
            _, dst = self.addr(s.dst)
            _, src = self.addr(s.src)
            w.instr("cp.async.bulk.global.shared::cta.bulk_group", dst, src, self.ev(s.nbytes))
        elif isinstance(s, ir.BulkCommit):
            w.instr("cp.async.bulk.commit_group")
        elif isinstance(s, ir.BulkWait):
            w.instr("cp.async.bulk.wait_group", self.ev(s.n))
        elif isinstance(s, ir.BulkWaitRead):
            w.instr("cp.async.bulk.wait_group.read", self.ev(s.n))
        elif isinstance(s, ir.TensorLoad):
            _, dst = self.addr(s.dst)
            w.instr(f"cp.async.bulk.tensor.{len(s.coords)}d.shared::cluster.global.tile"
                    ".mbarrier::complete_tx::bytes", dst, self.tmap_operand(s.tmap, s.coords),
                    self.bar_addr(s.bar))
        elif isinstance(s, ir.TensorStore):
            _, src = self.addr(s.src)
            w.instr(f"cp.async.bulk.tensor.{len(s.coords)}d.global.shared::cta.tile.bulk_group",
                    self.tmap_operand(s.tmap, s.coords), src)
        elif isinstance(s, ir.TensorPrefetch):
            w.instr(f"cp.async.bulk.prefetch.tensor.{len(s.coords)}d.L2.global.tile",
                    self.tmap_operand(s.tmap, s.coords))
        elif isinstance(s, ir.TensorMapPrefetch):
            w.instr("prefetch.tensormap", f"[{self.ev(s.tmap)}]")
        else:
            raise TypeError(f"no PTX for {type(s).__name__}")

    def bounded_wait(self, s: ir.MBarrierWait) -> None:
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
        w.instr("mbarrier.try_wait.parity.shared::cta.b64", p, a, parity)
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

    def tmap_operand(self, tmap: ir.Expr, coords: tuple[ir.Expr, ...]) -> str:
        cs = ", ".join(self.ev(c) for c in coords)
        return f"[{self.ev(tmap)}, {{{cs}}}]"

    def decl_count(self, bar: ir.Expr) -> int:
        while isinstance(bar, ir.Index):
            bar = bar.base
        return self.layout.barrier_count(bar.name)  # type: ignore[attr-defined]
