"""Ampere (sm_80) operations: cp.async of 4/8/16 bytes (.ca/.cg, zero-fill), its commit
groups and waits, cp.async.mbarrier.arrive[.noinc], and the test_wait mbarrier loop."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import ir
from .. import types as T
from ..codegen.abi import DESC_BASE, DESC_DIMS, DESC_STRIDES, DESC_SWIZZLE
from ..interp import cpasync
from ..interp.cta import Thread
from ..interp.errors import fail
from ..interp.program import PLAIN, Program, Step
from ..opdef import Effect, ErrorFn, OpDef, const_int, definition, register
from ..swizzle import mask, tma_swizzle_bytes
from .mbarrier import check_parity, emit_poll_loop

CP_SIZES = (4, 8, 16)
# test_wait spins (try_wait, which suspends the thread, is sm_90): between polls a waiting
# thread sleeps this long, leaving issue slots to the warps that do the work (0: pure spin)
WAIT_BACKOFF_NS = 256  # measured on the H200: best for spin-heavy waits, neutral elsewhere


class _CpAsync(OpDef):
    operands = (("dst", "smem", False), ("src", "gref", False), ("nbytes", "const", True),
                ("src_bytes", "u32", True))
    effect = Effect(cp_async="copy")
    sm80 = "keep_one"
    default: int | None = None

    def derive(self, values: dict[str, Any], loc: Any) -> str | None:
        if values.get("nbytes") is None:
            n = self.default or values["dst"].type.nbytes
            if n not in CP_SIZES:
                return (f"{self.syntax} copies 4, 8 or 16 bytes; the destination holds {n}: "
                        "give the size")
            values["nbytes"] = ir.Const(value=n, type=T.u32, loc=loc)
        return None

    def omitted(self, n: Any, name: str) -> bool:
        if name == "nbytes":
            want = self.default or n.dst.type.nbytes
            return const_int(n.nbytes) == want and n.src_bytes is None
        return getattr(n, name) is None

    def check(self, n: Any, err: ErrorFn) -> None:
        size = const_int(n.nbytes)
        allowed = (16,) if self.default else CP_SIZES
        if size not in allowed:
            want = "16" if self.default else "4, 8 or 16"
            err(f"{self.syntax} copies {want} bytes, got {size}",
                n.nbytes.loc or n.loc)
            return
        if n.dst.type.shape and size > n.dst.type.nbytes:
            err(f"{self.syntax} copies {size} bytes but its destination holds "
                f"{n.dst.type.nbytes}", n.loc)
        sb = const_int(n.src_bytes)
        if sb is not None and size is not None and sb > size:
            err(f"{self.syntax} reads at most its {size} bytes, got src_bytes {sb}",
                n.src_bytes.loc or n.loc)

    def emit(self, e, n: Any) -> None:
        _, dst = e.addr(n.dst)
        _, src = e.addr(n.src)
        extra = [e.ev(n.src_bytes)] if n.src_bytes is not None else []
        e.w.instr(f"cp.async.{n.cache}.shared.global", dst, src, str(const_int(n.nbytes)),
                  *extra)

    def interp(self, c: Program, n: Any) -> Step:
        (dst, _), (src, esize) = c.shared_place(n.dst), c.global_place(n.src)
        size = const_int(n.nbytes) or 16
        srcb = c.expr(n.src_bytes) if n.src_bytes is not None else None

        def copy(th: Thread) -> None:
            off = dst(th)
            end = _buffer_end(th, off)
            if off + size > end:
                fail("bounds", f"{th.name}: {n.syntax} copies {size} bytes to "
                     f"{th.cta.smem.where(off)}, past the end of its buffer", n)
            if (th.cta.smem.base + off) % size:
                fail("alignment", f"{th.name}: {n.syntax} of {size} bytes needs a {size}-byte "
                     f"aligned destination, but {th.cta.smem.where(off)} is not", n)
            k = size if srcb is None else srcb(th)
            if not 0 <= k <= size:
                fail("copy", f"{th.name}: {n.syntax} src_bytes {k} exceeds its {size} bytes", n)
            data = np.zeros(size, np.uint8)
            if k:
                mv, goff = th.cta.gmem.locate(th, src(th), k, esize, n, f"{n.syntax} source",
                                              align=size)

                def fetch() -> np.ndarray:
                    data[:k] = np.frombuffer(mv, np.uint8, k, goff)
                    return data
            else:
                def fetch() -> np.ndarray:
                    return data

            cpasync.issue(th, cpasync.CpCopy(th.cta, n, slice(off, off + size), fetch))

        return PLAIN, True, copy


def _buffer_end(th: Thread, off: int) -> int:
    for slot in th.cta.smem.layout.items:
        if slot.offset <= off < slot.offset + slot.nbytes:
            return slot.offset + slot.nbytes
    return off


@register
class CpAsync(_CpAsync):
    node = ir.CpAsync


@register
class CpAsyncCg(_CpAsync):
    node = ir.CpAsyncCg
    default = 16


@register
class CpAsyncCommit(OpDef):
    node = ir.CpAsyncCommit
    sm80 = "keep_one"

    def emit(self, e, n: ir.CpAsyncCommit) -> None:
        e.w.instr("cp.async.commit_group")

    def interp(self, c: Program, n: ir.CpAsyncCommit) -> Step:
        return PLAIN, True, cpasync.commit


@register
class CpAsyncWait(OpDef):
    node = ir.CpAsyncWait
    effect = Effect(cp_async="completes")
    sm80 = "keep_one"
    operands = (("n", "const", False),)

    def check(self, n: ir.CpAsyncWait, err: ErrorFn) -> None:
        k = const_int(n.n)
        if k is not None and k > 7:
            err(f"cp_async_wait waits for at most 7 pending groups, got {k}", n.n.loc or n.loc)

    def emit(self, e, n: ir.CpAsyncWait) -> None:
        e.w.instr("cp.async.wait_group", e.ev(n.n))

    def interp(self, c: Program, n: ir.CpAsyncWait) -> Step:
        k = c.expr(n.n)
        return PLAIN, True, lambda th: cpasync.wait_group(th, k(th))


@register
class CpAsyncWaitAll(OpDef):
    node = ir.CpAsyncWaitAll
    effect = Effect(cp_async="completes")
    sm80 = "keep_one"

    def emit(self, e, n: ir.CpAsyncWaitAll) -> None:
        e.w.instr("cp.async.wait_all")

    def interp(self, c: Program, n: ir.CpAsyncWaitAll) -> Step:
        return PLAIN, True, cpasync.wait_all


class _Arrive(OpDef):
    operands = (("bar", "bar", False),)
    noinc = False

    def emit(self, e, n: Any) -> None:
        mn = "cp.async.mbarrier.arrive.noinc" if self.noinc else "cp.async.mbarrier.arrive"
        e.w.instr(f"{mn}.shared::cta.b64", e.bar_addr(n.bar))

    def interp(self, c: Program, n: Any) -> Step:
        bar, noinc = c.barrier_place(n.bar), self.noinc
        return PLAIN, True, lambda th: cpasync.ArriveOn(th, n, bar(th), noinc) and None


@register
class CpAsyncArrive(_Arrive):
    node = ir.CpAsyncArrive
    effect = Effect(cp_async="completes")
    sm80 = "keep_one"


@register
class CpAsyncArriveNoinc(_Arrive):
    node = ir.CpAsyncArriveNoinc
    effect = Effect(arrive="bar", cp_async="completes")
    sm80 = "keep_one"
    noinc = True


@register
class MBarrierTestWait(OpDef):
    node = ir.MBarrierTestWait
    effect = Effect(wait="bar", parity="parity")
    sm80 = "keep"
    operands = (("bar", "bar", False), ("parity", "u32", False))

    def check(self, n: ir.MBarrierTestWait, err: ErrorFn) -> None:
        check_parity(n, err)

    def emit(self, e, n: ir.MBarrierTestWait) -> None:
        poll = "mbarrier.test_wait.parity.shared::cta.b64"
        if e.watchdog_ns:
            e.bounded_wait(n, poll=poll)
            return
        emit_poll_loop(e, n, poll, WAIT_BACKOFF_NS)

    def interp(self, c: Program, n: ir.MBarrierTestWait) -> Step:
        return definition(ir.MBarrierWait).interp(c, n)


def desc_names(prefix: str, rank: int) -> dict[str, T.Type]:
    """The registers TensorDescFields defines, with their types."""
    names: dict[str, T.Type] = {}
    for i in range(rank):
        names[f"{prefix}.dim{i}"] = T.u32
    for i in range(rank):
        names[f"{prefix}.stride{i}"] = T.u64
    names[f"{prefix}.swizzle"] = T.u32
    return names


@register
class TensorDescFields(OpDef):
    node = ir.TensorDescFields
    sm80 = "keep"
    operands = (("tmap", "tmap", False),)

    def emit(self, e, n: ir.TensorDescFields) -> None:
        w, tm = e.w, n.tmap.type
        sym = f"p_{n.tmap.name}"  # type: ignore[attr-defined]
        base = w.reg(T.Ptr(tm.elem))  # type: ignore[attr-defined]
        w.instr("ld.param.u64", base, f"[{sym}+{DESC_BASE}]")
        w.instr("cvta.to.global.u64", base, base)
        e.bind(f"{n.prefix}.base", base)
        for name, t in desc_names(n.prefix, tm.rank).items():  # type: ignore[attr-defined]
            r = w.reg(t)
            field = name.rsplit(".", 1)[1]
            if field.startswith("dim"):
                off = DESC_DIMS + 4 * int(field[3:])
            elif field.startswith("stride"):
                off = DESC_STRIDES + 8 * int(field[6:])
            else:
                off = DESC_SWIZZLE
            w.instr(f"ld.param.{t}", r, f"[{sym}+{off}]")
            e.bind(name, r)

    def interp(self, c: Program, n: ir.TensorDescFields) -> Step:
        model_of = c.expr(n.tmap)
        rank = n.tmap.type.rank  # type: ignore[attr-defined]
        base_slot = c.slot(f"{n.prefix}.base")
        slots = {name: c.slot(name) for name in desc_names(n.prefix, rank)}

        def load(th: Thread) -> None:
            model = model_of(th)
            if model.oob_fill != "zero":
                fail("unsupported", f"tensor map '{n.tmap.name}' fills out-of-bounds elements "  # type: ignore[attr-defined]
                     f"with {model.oob_fill}; on sm_80 cp.async zero-fills them", n)
            a = model.array
            bases = th.cta.gmem.__dict__.setdefault("tensor_bases", {})
            if id(a) not in bases:
                bases[id(a)] = th.cta.gmem.add(f"{n.tmap.name} (tensor)", a)  # type: ignore[attr-defined]
            th.regs[base_slot] = bases[id(a)]
            for i in range(rank):
                th.regs[slots[f"{n.prefix}.dim{i}"]] = a.shape[rank - 1 - i]
                th.regs[slots[f"{n.prefix}.stride{i}"]] = a.strides[rank - 1 - i] // a.itemsize
            th.regs[slots[f"{n.prefix}.swizzle"]] = mask(tma_swizzle_bytes(model.swizzle))

        return PLAIN, False, load
