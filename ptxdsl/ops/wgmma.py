"""Warpgroup matrix multiply-accumulate on the tensor cores: wgmma and its fences.

The shared-memory operands are places (`tile[row, k]`) in buffers declared with a swizzle;
the matrix descriptors (start address, leading/stride byte offsets, swizzle mode) are derived
from the declaration by `ptxdsl.swizzle`, so nobody encodes them by hand."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np

from .. import ir
from .. import types as T
from ..errors import CompileError, Diagnostic
from ..interp import wgmma as W
from ..interp.cta import Thread
from ..interp.errors import fail, note
from ..interp.program import GEN, PLAIN, Program, Step
from ..interp.sync import collective
from ..opdef import Effect, ErrorFn, OpDef, const_int, register
from ..swizzle import desc_hi, lbo_field, undeclared_layout

_INPUTS = {"bf16": "bf16", "f16": "f16", "f32": "tf32", "e4m3": "e4m3", "e5m2": "e5m2"}


def buffer_of(place: ir.Expr) -> ir.Expr:
    """The whole buffer (SharedBuf, or StageBuf before lowering) that a place indexes."""
    while isinstance(place, ir.Index):
        place = place.base
    return place


def k_of(elem: T.Scalar) -> int:
    """K of one wgmma: 32 bytes of inputs (16 bf16/f16, 8 tf32, 32 fp8)."""
    return 32 // elem.nbytes


@register
class Wgmma(OpDef):
    node = ir.Wgmma
    effect = Effect(wgmma=True)
    needs = "wgmma"
    operands = (("d", "regs", False), ("a", "mma_a", False), ("b", "smem", False),
                ("accumulate", "pred", True), ("neg_a", "const", True), ("neg_b", "const", True))

    def check(self, n: ir.Wgmma, err: ErrorFn) -> None:
        dt, at, bt = n.d.type, n.a.type, n.b.type
        assert isinstance(dt, T.RegArray)
        if dt.elem != T.f32:
            err(f"the wgmma accumulator must be a register array of f32, got {dt}", n.d.loc)
        elif dt.n % 4 or not 4 <= dt.n <= 128:
            err(f"an m64nN accumulator holds N / 2 f32 per thread with N in 8, 16, ..., 256; "
                f"'{getattr(n.d, 'name', '?')}' has {dt.n} elements (N = {2 * dt.n})", n.d.loc)
        assert isinstance(bt, T.SharedRef)
        if bt.shape != ():
            err("the wgmma B operand is a place: the first element of the N x K tile, "
                "written tile[n0, k0]", n.b.loc)
        if bt.elem.name not in _INPUTS:
            err(f"wgmma inputs are bf16, f16, e4m3, e5m2 or f32 (as tf32), got {bt.elem}",
                n.b.loc)
        if isinstance(at, T.SharedRef):
            if at.shape != ():
                err("the wgmma A operand is a place: the first element of the 64 x K tile, "
                    "written tile[m0, k0]", n.a.loc)
            if at.elem != bt.elem and not (at.elem.is_fp8 and bt.elem.is_fp8):
                err(f"wgmma A and B must have one input type (or two fp8 types), got {at.elem} "
                    f"and {bt.elem}", n.a.loc)
        elif isinstance(at, T.RegArray):
            wide = at.elem == bt.elem and at.elem.nbytes == 2 and at.n == 8
            fp8 = at.elem.is_fp8 and bt.elem.is_fp8 and at.n == 16
            if not (wide or fp8):
                err(f"an A fragment in registers is 8 elements of B's type (bf16 or f16), or "
                    f"16 of fp8 with B fp8, got {at} with B of {bt.elem}", n.a.loc)
        for flag in (n.neg_a, n.neg_b):
            if flag is not None and const_int(flag) not in (0, 1):
                err("neg_a / neg_b are 0 or 1", flag.loc or n.loc)

    def emit(self, e, n: ir.Wgmma) -> None:
        w = e.w
        elem = n.b.type.elem  # type: ignore[attr-defined]
        kind = _INPUTS[elem.name]
        kind_a = _INPUTS[n.a.type.elem.name]  # type: ignore[attr-defined]
        regs = e.lookup(n.d.name)  # type: ignore[attr-defined]
        d = "{" + ", ".join(regs) + "}"
        if isinstance(n.a.type, T.RegArray):
            a = "{" + ", ".join(fragment_regs(e, n.a)) + "}"
        else:
            a = descriptor(e, n.a)
        b = descriptor(e, n.b)
        acc = n.accumulate if n.accumulate is not None else ir.Const(value=True, type=T.pred)
        p = e.ev_reg(acc)
        sa = "-1" if n.neg_a is not None and const_int(n.neg_a) else "1"
        sb = "-1" if n.neg_b is not None and const_int(n.neg_b) else "1"
        # the transpose operands say MN-major (tf32 and fp8 have none: their operands are
        # K-major, which the verifier checks)
        tb = str(int(major_of(e.layout, n.b) == "mn"))
        trans = [] if elem.nbytes != 2 else ([tb] if isinstance(n.a.type, T.RegArray)
                                             else [str(int(major_of(e.layout, n.a) == "mn")), tb])
        shape = f"m64n{2 * len(regs)}k{k_of(elem)}"
        w.instr(f"wgmma.mma_async.sync.aligned.{shape}.f32.{kind_a}.{kind}", d, a, b, p, sa, sb,
                *trans)

    def interp(self, c: Program, n: ir.Wgmma) -> Step:
        name = n.d.name  # type: ignore[attr-defined]
        slot = c.slots[name]
        elem = n.b.type.elem  # type: ignore[attr-defined]
        kind, kdim, esz = _INPUTS[elem.name], k_of(elem), elem.nbytes
        kind_a = _INPUTS[n.a.type.elem.name]  # type: ignore[attr-defined]
        ncols = 2 * n.d.type.n  # type: ignore[attr-defined]
        b_off, b_layout = operand_place(c, n.b, "B")
        a_reg = isinstance(n.a.type, T.RegArray)
        if a_reg:
            whole = n.a.vec if isinstance(n.a, ir.Fragment) else n.a
            a_slot = c.slots[whole.name]  # type: ignore[attr-defined]
            a_k = c.expr(n.a.k) if isinstance(n.a, ir.Fragment) else (lambda th: 0)
            per = ir.fragment_elems(n.a.type.elem)  # type: ignore[attr-defined]
        else:
            a_off, a_layout = operand_place(c, n.a, "A")
        acc = c.expr(n.accumulate) if n.accumulate is not None else (lambda th: True)
        sign = np.float32((-1.0 if n.neg_a is not None and const_int(n.neg_a) else 1.0)
                          * (-1.0 if n.neg_b is not None and const_int(n.neg_b) else 1.0))

        def issue(th: Thread, quad: dict | None = None) -> None:
            st = W.state(th)
            W.issued(th, n)
            if not st.fenced:
                fail("wgmma", f"{th.name}: wgmma without a wgmma_fence() before it", n)
            if name in st.dirty:
                fail("wgmma", f"{th.name}: accumulator '{name}' was written after the last "
                     "wgmma_fence(); the wgmma would race with that write", n,
                     note("written here", st.dirty[name]))
            cur = th.regs[slot]
            if isinstance(cur, list):
                cur = W.Pending(name, cur, slot, n)
                th.regs[slot] = cur
            # the operands' bytes now: the tensor cores may read them until wgmma_wait
            pa = None if a_reg else W.places(th, a_off(th), W.rows_of(th), kdim, esz, a_layout)
            pb = W.places(th, b_off(th), np.arange(ncols), kdim, esz, b_layout)
            before = [W.raw(th, p, esz) for p in (pa, pb) if p is not None]
            keep, pend = bool(acc(th)), cur

            def run() -> None:
                now = [W.raw(th, p, esz) for p in (pa, pb) if p is not None]
                if any(not np.array_equal(x, y) for x, y in zip(before, now, strict=True)):
                    fail("race", f"race: {th.name}: shared memory that this wgmma reads was "
                         "overwritten before wgmma_wait completed it (a stage released to its "
                         "producer too early?)", n)
                if a_reg:
                    a = W.a_from_regs(th, quad, kind)  # type: ignore[arg-type]
                else:
                    a = W.decode(now[0], kind_a)
                b = W.decode(now[-1], kind)
                prod = (a @ b.T) * sign
                frag = W.scatter(th, prod.astype(np.float32))
                if keep:
                    frag = (np.asarray(pend.values, np.float32) + frag).astype(np.float32)
                pend.values = frag.tolist()

            pend.todo += 1
            st.open.append((pend, run))

        if not a_reg:
            return PLAIN, True, issue
        c.sites += 1
        site = c.sites

        def issue_with_fragments(th: Thread) -> Generator:
            # a thread's rows of A are spread over the fragments of its quad's four lanes
            frag = th.regs[a_slot]
            if not isinstance(frag, list):
                frag.touched(th, n)
            k0 = per * int(a_k(th))
            if not 0 <= k0 <= len(frag) - per:
                fail("bounds", f"{th.name}: frag(p, k): k is {k0 // per}, out of range "
                     f"[0, {len(frag) // per}) of '{whole.name}'", n.a)  # type: ignore[attr-defined]
            quad = yield from collective(th, site, "gather", (list(frag)[k0:k0 + per],), n)
            issue(th, quad)

        return GEN, True, issue_with_fragments


def fragment_regs(e: Any, a: ir.Expr) -> list[str]:
    """The 4 packed .b32 registers of an A fragment (see KernelEmitter.packed): a whole
    8-element array, or frag(p, k)."""
    if not isinstance(a, ir.Fragment):
        return e.lookup(f"{a.name}#b32")  # type: ignore[attr-defined]
    regs = e.lookup(f"{a.vec.name}#b32")  # type: ignore[attr-defined]
    k = e.const_index(a.k)
    if not 0 <= k < len(regs) // 4:
        raise CompileError(Diagnostic(f"frag(p, k): k is {k} in this unrolled iteration, out "
                                      f"of range [0, {len(regs) // 4})", a.loc))
    return regs[4 * k:4 * k + 4]


def operand_place(c: Program, place: ir.Expr, which: str):
    """(logical shared offset closure, layout) of the wgmma shared-memory operand `which`
    ("A" or "B"); the layout is (swizzle, major, bytes between blocks along M / N for
    MN-major rows)."""
    buf = buffer_of(place)
    decl = c.decls[buf.name]  # type: ignore[attr-defined]
    if not decl.swizzle:  # type: ignore[union-attr]
        fail("wgmma", undeclared_layout(which, buf.name.split(".")[-1]),  # type: ignore[attr-defined]
             place)
    off, _ = c.shared_place(place, logical=True)
    lbo = lbo_field(decl.shape, decl.elem.nbytes, decl.major,  # type: ignore[union-attr]
                    decl.swizzle) << 4  # type: ignore[union-attr]
    return off, (decl.swizzle, decl.major, lbo)  # type: ignore[union-attr]


def major_of(layout: Any, place: ir.Expr) -> str:
    return getattr(layout.decl(buffer_of(place).name), "major", "k")  # type: ignore[attr-defined]


def descriptor(e: Any, place: ir.Expr) -> str:
    """The 64-bit matrix descriptor of a K-major operand at `place`: start address from the
    place (row and k offset included), strides and swizzle mode from the buffer."""
    w = e.w
    decl = e.layout.decl(buffer_of(place).name)  # type: ignore[attr-defined]
    reg, off = e.shared_addr(place)
    lo = w.reg(T.u32)
    if off:
        w.instr("add.u32", lo, reg, str(off))
        w.instr("shr.u32", lo, lo, "4")
    else:
        w.instr("shr.u32", lo, reg, "4")
    lbo = lbo_field(decl.shape, decl.elem.nbytes, decl.major, decl.swizzle)
    w.instr("or.b32", lo, lo, str(lbo << 16))
    hi = w.reg(T.u32)
    w.instr("mov.u32", hi, str(desc_hi(decl.swizzle)))
    desc = w.reg(T.u64)
    w.instr("mov.b64", desc, f"{{{lo}, {hi}}}")
    return desc


@register
class WgmmaFence(OpDef):
    node = ir.WgmmaFence
    effect = Effect(wgmma=True)
    needs = "wgmma"

    def emit(self, e, n: ir.WgmmaFence) -> None:
        e.w.instr("wgmma.fence.sync.aligned")

    def interp(self, c: Program, n: ir.WgmmaFence) -> Step:
        return PLAIN, False, W.fence


@register
class WgmmaCommit(OpDef):
    node = ir.WgmmaCommit
    effect = Effect(wgmma=True)
    needs = "wgmma"

    def emit(self, e, n: ir.WgmmaCommit) -> None:
        e.w.instr("wgmma.commit_group.sync.aligned")

    def interp(self, c: Program, n: ir.WgmmaCommit) -> Step:
        return PLAIN, False, W.commit


@register
class WgmmaWait(OpDef):
    node = ir.WgmmaWait
    effect = Effect(wgmma=True)
    needs = "wgmma"
    operands = (("n", "const", False),)

    def check(self, n: ir.WgmmaWait, err: ErrorFn) -> None:
        v = const_int(n.n)
        if v is not None and v > 7:
            err(f"wgmma_wait takes 0 to 7 pending groups, got {v}", n.loc)

    def emit(self, e, n: ir.WgmmaWait) -> None:
        e.w.instr("wgmma.wait_group.sync.aligned", e.ev(n.n))

    def interp(self, c: Program, n: ir.WgmmaWait) -> Step:
        k = const_int(n.n) or 0
        return PLAIN, True, lambda th: W.wait(th, k)
