"""1D bulk copies (`cp.async.bulk`) between global and shared memory, and bulk groups."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np

from .. import ir
from .. import types as T
from ..interp.copies import AsyncLoad, AsyncStore
from ..interp.cta import Thread
from ..interp.errors import fail
from ..interp.program import GEN, PLAIN, Program, Step
from ..opdef import Effect, ErrorFn, OpDef, const_int, register


def stage_barrier(values: dict[str, Any], loc: Any, syntax: str) -> str | None:
    """An omitted barrier of a copy into a pipeline stage, or into a view of one
    (`ring.tile[r]`: a thread's or a multicast CTA's share), is the stage's full barrier."""
    dst = values.get("dst")
    while isinstance(dst, ir.Index):
        dst = dst.base
    if isinstance(dst, ir.StageBuf) and dst.side == "put":
        values["bar"] = ir.StageBarrier(pipe=dst.pipe, type=T.BarrierRef(0), loc=loc)
        return None
    return (f"{syntax} needs an mbarrier: pass one ({syntax}(..., bar)), or let one be derived "
            "by copying into a pipeline stage (between acquire and commit) or inside an "
            "'async name { ... }' block")


def smem_bytes(values: dict[str, Any], key: str, loc: Any) -> None:
    """An omitted byte count is the size of the shared-memory operand."""
    values["nbytes"] = ir.Const(value=values[key].type.nbytes, type=T.u32, loc=loc)


def check_smem_aligned(th: Thread, s: Any, off: int, align: int) -> None:
    addr = th.cta.smem.base + off
    if addr % align:
        fail("alignment", f"{th.name}: {s.syntax} needs {align}-byte aligned shared memory, but "
             f"{th.cta.smem.where(off)} may lie at shared-memory address {addr} (the kernel "
             f"aligns its shared memory to {th.cta.smem.layout.align} bytes)", s)


def _check_bulk(th: Thread, s: Any, nbytes: int, off: int, view: int) -> None:
    if nbytes <= 0 or nbytes % 16:
        fail("copy", f"{th.name}: a bulk copy moves a positive multiple of 16 bytes, got "
             f"{nbytes}", s)
    if nbytes > view:
        fail("bounds", f"{th.name}: {s.syntax} moves {nbytes} bytes, but the shared-memory "
             f"operand holds {view}", s)
    check_smem_aligned(th, s, off, 16)


class _BulkCopy(OpDef):
    smem_key = "dst"

    def derive(self, values: dict[str, Any], loc: Any) -> str | None:
        if values.get("nbytes") is None:
            smem_bytes(values, self.smem_key, loc)
        if "bar" in values and values["bar"] is None:
            return stage_barrier(values, loc, self.syntax)
        return None

    def omitted(self, n: Any, name: str) -> bool:
        if name == "nbytes":
            return const_int(n.nbytes) == getattr(n, self.smem_key).type.nbytes
        return isinstance(getattr(n, name), (ir.StageBarrier, ir.AsyncBarrier))

    def check(self, n: Any, err: ErrorFn) -> None:
        smem, size = getattr(n, self.smem_key), const_int(n.nbytes)
        if size is None:
            return
        if size <= 0 or size % 16:
            err(f"a bulk copy moves a positive multiple of 16 bytes, got {size}",
                n.nbytes.loc or n.loc)
        elif size > smem.type.nbytes:
            err(f"{self.syntax} moves {size} bytes but the shared-memory operand holds "
                f"{smem.type.nbytes}", n.nbytes.loc or n.loc)


@register
class BulkLoad(_BulkCopy):
    node = ir.BulkLoad
    effect = Effect(complete="bar", async_write="dst", global_operand="src", size="nbytes",
                    one_thread=True)
    sm80 = "copy"
    operands = (("dst", "smem", False), ("src", "gref", False), ("bar", "bar", True),
                ("nbytes", "u32", True))

    def emit(self, e, n: ir.BulkLoad) -> None:
        _, dst = e.addr(n.dst)
        _, src = e.addr(n.src)
        e.w.instr("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes", dst, src,
                  e.ev(n.nbytes), e.bar_addr(n.bar))

    def interp(self, c: Program, n: ir.BulkLoad) -> Step:
        (dst, view), (src, esize) = c.shared_place(n.dst), c.global_place(n.src)
        bar, nbytes = c.barrier_place(n.bar), c.expr(n.nbytes)

        def load(th: Thread) -> None:
            k, off, b = nbytes(th), dst(th), bar(th)
            _check_bulk(th, n, k, off, view)
            mv, goff = th.cta.gmem.locate(th, src(th), k, esize, n, "bulk_load source",
                                          align=16)
            b.check_async_use(th, n)

            def fetch() -> np.ndarray:
                return np.frombuffer(mv, np.uint8, k, goff).copy()

            th.cta.issue(th, AsyncLoad(th.cta, n, b, slice(off, off + k), k, fetch))

        return PLAIN, True, load


@register
class BulkStore(_BulkCopy):
    node = ir.BulkStore
    effect = Effect(async_read="src", global_operand="dst", size="nbytes", one_thread=True)
    sm80 = "copy"
    operands = (("dst", "gref", False), ("src", "smem", False), ("nbytes", "u32", True))
    async_reads = True
    smem_key = "src"

    def emit(self, e, n: ir.BulkStore) -> None:
        _, dst = e.addr(n.dst)
        _, src = e.addr(n.src)
        e.w.instr("cp.async.bulk.global.shared::cta.bulk_group", dst, src, e.ev(n.nbytes))

    def interp(self, c: Program, n: ir.BulkStore) -> Step:
        (dst, esize), (src, view) = c.global_place(n.dst), c.shared_place(n.src)
        nbytes = c.expr(n.nbytes)

        def store(th: Thread) -> None:
            k, off = nbytes(th), src(th)
            _check_bulk(th, n, k, off, view)
            mv, goff = th.cta.gmem.locate(th, dst(th), k, esize, n, "bulk_store destination",
                                          align=16)
            sel = slice(off, off + k)
            th.cta.smem.check_async_read(th, sel, n, n.syntax)

            def write(data: np.ndarray) -> None:
                mv[goff : goff + k] = data.data

            th.cta.issue(th, AsyncStore(th.cta, n, th, sel, write,
                                        th.cta.gmem.dest(dst(th), k, esize)))

        return PLAIN, True, store


@register
class BulkCommit(OpDef):
    node = ir.BulkCommit
    sm80 = "drop"

    def emit(self, e, n: ir.BulkCommit) -> None:
        e.w.instr("cp.async.bulk.commit_group")

    def interp(self, c: Program, n: ir.BulkCommit) -> Step:
        return PLAIN, True, lambda th: th.bulk.commit()


class _BulkWait(OpDef):
    operands = (("n", "const", True),)
    read = False

    def derive(self, values: dict[str, Any], loc: Any) -> str | None:
        if values.get("n") is None:
            values["n"] = ir.Const(value=0, type=T.u32, loc=loc)
        return None

    def omitted(self, n: Any, name: str) -> bool:
        return False

    def interp(self, c: Program, s: Any) -> Step:
        n, read = c.expr(s.n), self.read

        def wait(th: Thread) -> Generator:
            k, groups = n(th), th.bulk
            if not groups.done(k, read):
                th.wait = (s, groups, k)
                while not groups.done(k, read):
                    yield groups
            groups.retire(k, read)

        return GEN, True, wait


@register
class BulkWait(_BulkWait):
    node = ir.BulkWait
    sm80 = "drop"

    def emit(self, e, n: ir.BulkWait) -> None:
        e.w.instr("cp.async.bulk.wait_group", e.ev(n.n))


@register
class BulkWaitRead(_BulkWait):
    node = ir.BulkWaitRead
    sm80 = "drop"
    read = True

    def emit(self, e, n: ir.BulkWaitRead) -> None:
        e.w.instr("cp.async.bulk.wait_group.read", e.ev(n.n))
