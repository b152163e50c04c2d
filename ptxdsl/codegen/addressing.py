"""Addresses the emitter derives from declarations: generic accesses to swizzled buffers,
index arithmetic of constants and unrolled loop variables folded into address offsets, and
the swizzle and tile alignment that each tensor-map parameter must fit at launch."""

from __future__ import annotations

from math import gcd, prod
from typing import Any

from .. import ir
from .. import types as T
from ..swizzle import mask
from .layout import Layout


class Addressing:
    """Mixed into KernelEmitter (which provides `w`, `layout` and `const_index`)."""

    w: Any
    layout: Layout

    def const_index(self, e: ir.Expr) -> int:
        raise NotImplementedError  # KernelEmitter's

    def swizzle_of(self, ref: ir.Expr) -> int:
        while isinstance(ref, ir.Index):
            ref = ref.base
        decl = self.layout.decl(ref.name)  # type: ignore[attr-defined]
        return getattr(decl, "swizzle", 0)

    def swizzled(self, r: str, off: int, swz: int) -> str:
        """The swizzled address of logical shared address r + off: the base is aligned to
        the pattern, so the XOR applies to the absolute address (see ptxdsl.swizzle)."""
        w = self.w
        a, t = w.reg(T.u32), w.reg(T.u32)
        w.instr("add.u32", a, r, str(off))
        w.instr("shr.u32", t, a, "3")
        w.instr("and.b32", t, t, str(mask(swz) << 4))
        w.instr("xor.b32", a, a, t)
        return a

    def immediate_of(self, e: ir.Expr) -> int | None:
        """The value of a u32 expression of constants and unrolled loop variables, or None."""
        if e.type != T.u32 or not isinstance(e, (ir.Const, ir.Var, ir.Binary)):
            return None
        try:
            v = self.const_index(e)
        except (TypeError, ValueError, KeyError, ZeroDivisionError):
            return None
        return v if 0 <= v < 1 << 32 else None

    def split_const(self, e: ir.Expr) -> tuple[int, ir.Expr | None]:
        """A u32 index as (constant part, the rest or None): `row + i * 8` with `i` unrolled
        gives (8 i, row), so the constant goes into the address offset."""
        v = self.immediate_of(e)
        if v is not None:
            return v, None
        if isinstance(e, ir.Binary) and e.op == "add":
            ca, ra = self.split_const(e.a)
            cb, rb = self.split_const(e.b)
            if ra is None or rb is None:
                return ca + cb, ra if rb is None else rb
            return ca + cb, ir.Binary(op="add", a=ra, b=rb, type=e.type)
        return 0, e



def tile_aligns(k: ir.Kernel, layout: Layout) -> dict[str, tuple[int, str]]:
    """For each tensor-map parameter: the alignment (bytes) that every shared tile its TMA
    copies reach is known to have, and the buffer of the least aligned one (the launch
    compares it with the swizzle of the tensor map passed)."""
    out: dict[str, tuple[int, str]] = {}
    for s in ir.walk(k.body):
        if isinstance(s, (ir.TensorLoad, ir.TensorLoadMulticast, ir.TensorStore,
                          ir.TensorReduce)) and isinstance(s.tmap, ir.Var):
            smem = s.dst if isinstance(s, (ir.TensorLoad, ir.TensorLoadMulticast)) else s.src
            align, offset = layout.align, 0
            while isinstance(smem, ir.Index):
                view = smem.base.type
                assert isinstance(view, T.SharedRef)
                for i, x in enumerate(smem.indices):
                    step = view.elem.nbytes * prod(view.shape[i + 1:])
                    if isinstance(x, ir.Const):
                        offset += int(x.value) * step
                    else:
                        align = gcd(align, step)
                smem = smem.base
            offset += layout.offset(smem.name)  # type: ignore[attr-defined]
            align = gcd(align, offset) if offset else align
            name = smem.name.split(".")[-1]  # type: ignore[attr-defined]
            if s.tmap.name not in out or align < out[s.tmap.name][0]:
                out[s.tmap.name] = (align, name)
    return out


def tmap_swizzles(k: ir.Kernel, layout: Layout) -> dict[str, tuple[int | None, str]]:
    """For each tensor-map parameter that TMA copies use with swizzle-declaring buffers:
    (the swizzle they declare, a buffer name); (None, "") where two buffers disagree."""
    out: dict[str, tuple[int | None, str]] = {}
    for s in ir.walk(k.body):
        if isinstance(s, (ir.TensorLoad, ir.TensorLoadMulticast, ir.TensorStore,
                          ir.TensorReduce)) and isinstance(s.tmap, ir.Var):
            smem = s.dst if isinstance(s, (ir.TensorLoad, ir.TensorLoadMulticast)) else s.src
            while isinstance(smem, ir.Index):
                smem = smem.base
            decl = layout.decl(smem.name)  # type: ignore[attr-defined]
            swz = getattr(decl, "swizzle", 0)
            if not swz:
                continue
            prev = out.get(s.tmap.name)
            name = smem.name.split(".")[-1]  # type: ignore[attr-defined]
            out[s.tmap.name] = (swz, name) if prev is None or prev[0] == swz else (None, "")
    return out
