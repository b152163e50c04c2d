"""Shared-memory budget, bulk and TMA alignment, TMA box limits."""

from __future__ import annotations

from math import gcd

from .. import ir
from ..errors import Note
from ..swizzle import swizzle_align
from . import absint
from .effects import effect, op_name, smem
from .facts import Facts, Report, text
from .threads import GmemRef, SmemRef, Visit
from .values import Val, lowbit

BULK_ALIGN = 16
TMA_ALIGN = 128
MAX_BOX_DIM = 256


def check_smem_budget(facts: Facts, out: Report) -> None:
    layout, limit = facts.layout, facts.target.smem_bytes
    if layout.request_bytes > limit:
        out.error(f"kernel '{facts.kernel.name}' needs {layout.request_bytes} bytes of shared "
                  f"memory (layout {layout.size} plus alignment slack); a CTA has at most "
                  f"{limit} on {facts.target.name}", facts.kernel.loc)


def _declared(ref: SmemRef, facts: Facts) -> Note:
    slot = facts.layout.offset(ref.decl.name)
    return Note(f"'{ref.decl.name}' is declared here with align {ref.decl.align} (placed at "
                f"shared-memory offset {slot})", ref.decl.loc)


def check_alignment(facts: Facts, out: Report) -> None:
    """Bulk copies: 16-byte aligned shared and global addresses and sizes. TMA: 128-byte
    aligned shared operands, and for a buffer that declares a swizzle, aligned to its
    pattern (8 rows: 1024 bytes for 128B). Where no swizzle is declared the tensor map's is
    unknown here; the launch compares it with the tile's alignment (kernelinfo.ParamInfo)."""
    swizzle_warned: set[str] = set()
    for v in facts.trace.visits:
        e = effect(v.stmt)
        ref = smem(v, e.shared_operand)
        if ref is None or not v.may.any():
            continue
        need = TMA_ALIGN if e.tma else BULK_ALIGN
        got = _shared_alignment(v, ref, need, facts, out)
        swizzle = getattr(ref.decl, "swizzle", 0)
        atom = swizzle_align(swizzle)
        if e.tma and got is not None and got < atom and ref.decl.name not in swizzle_warned:
            swizzle_warned.add(ref.decl.name)
            out.warning(f"{op_name(v.stmt)}'s shared operand '{text(ref.expr)}' is {got}-byte "
                        f"aligned; '{ref.decl.name}' declares swizzle {swizzle}, whose tensor "
                        f"map needs {atom}-byte aligned tiles", v.stmt.loc,
                        _declared(ref, facts))
        g = v.args.get(e.global_operand) if e.global_operand else None
        if isinstance(g, GmemRef):
            _global_alignment(v, g, out)
        size = v.args.get(e.size) if e.size else None
        if isinstance(size, Val):
            _size_alignment(v, size, getattr(v.stmt, e.size or ""), out)


def _shared_alignment(v: Visit, ref: SmemRef, need: int, facts: Facts,
                      out: Report) -> int | None:
    """Report a shared operand misaligned for `need`; return its proven alignment."""
    op = op_name(v.stmt)
    where = ref.expr.loc or v.stmt.loc
    if ref.decl.align < need:
        out.error(f"{op} needs a {need}-byte aligned shared operand, but '{ref.decl.name}' is "
                  f"declared with align {ref.decl.align}", where, _declared(ref, facts))
        return None
    slot = facts.layout.offset(ref.decl.name)
    base = min(facts.layout.align, ref.decl.align)
    vals = ref.offset.values(v.may)
    if vals is not None:
        addrs = vals + slot
        bad = addrs[addrs % need != 0]
        if bad.size:
            out.error(f"{op}'s shared operand '{text(ref.expr)}' starts {int(bad[0]) - slot} "
                      f"bytes into '{ref.decl.name}' (shared-memory offset {int(bad[0])}), "
                      f"which is not a multiple of {need}", where, _declared(ref, facts))
            return None
        return min(base, Val(addrs).alignment())
    got = min(base, ref.offset.alignment(), lowbit(slot))
    at = absint.add(ref.offset.range, absint.Range(slot, slot)) if got < need else None
    if at is not None and at.never_multiple_of(need):
        out.error(f"{op}'s shared operand '{text(ref.expr)}' is never {need}-byte aligned: "
                  f"its shared-memory address is {_residue(at, need)}", where,
                  _declared(ref, facts))
        return None
    if got < need:
        out.warning(f"cannot prove {need}-byte alignment of {op}'s shared operand "
                    f"'{text(ref.expr)}' (its offset is a multiple of {got} bytes)", where,
                    _declared(ref, facts))
    return got


def _size_alignment(v: Visit, size: Val, expr: ir.Expr, out: Report) -> None:
    where = expr.loc or v.stmt.loc
    op = op_name(v.stmt)
    vals = size.values(v.may)
    if vals is None:
        if size.align < BULK_ALIGN:
            out.warning(f"cannot prove that the size of {op} is a multiple of {BULK_ALIGN} "
                        f"bytes (it is a multiple of {size.align})", where)
    elif not isinstance(expr, ir.Const):  # a literal size is checked when it is written
        bad = vals[vals % BULK_ALIGN != 0]
        if bad.size:
            out.error(f"{op} moves {int(bad[0])} bytes ('{text(expr)}'); a bulk copy moves a "
                      f"multiple of {BULK_ALIGN} bytes", where)


def _global_alignment(v: Visit, g: GmemRef, out: Report) -> None:
    op = op_name(v.stmt)
    where = g.expr.loc or v.stmt.loc
    base = text(g.expr.base) if isinstance(g.expr, ir.Index) else "the pointer"
    vals = g.offset.values(v.may)
    if vals is not None:
        bad = vals[vals % BULK_ALIGN != 0]
        if bad.size:
            out.error(f"{op}'s global address '{text(g.expr)}' is {int(bad[0])} bytes past "
                      f"'{base}', not a multiple of {BULK_ALIGN}", where)
        return
    if g.offset.alignment() < BULK_ALIGN and g.offset.range.never_multiple_of(BULK_ALIGN):
        out.error(f"{op}'s global address '{text(g.expr)}' is never {BULK_ALIGN}-byte aligned: "
                  f"its offset from '{base}' is {_residue(g.offset.range, BULK_ALIGN)}", where)
    elif g.offset.alignment() < BULK_ALIGN:
        out.warning(f"cannot prove {BULK_ALIGN}-byte alignment of {op}'s global address "
                    f"'{text(g.expr)}' (its offset from '{base}' is a multiple of "
                    f"{g.offset.alignment()} bytes)", where)


def _residue(r: absint.Range, need: int) -> str:
    """What the congruence says about a misaligned byte offset ("4 modulo 16 bytes")."""
    m = gcd(r.mod, need)
    return f"{r.res % m} modulo {m} bytes on every path"


def check_tma_boxes(facts: Facts, out: Report) -> None:
    """The shared view of a tensor copy is its box: at most 256 elements per dimension, and
    an innermost row of a multiple of 16 bytes."""
    for v in facts.trace.visits:
        e = effect(v.stmt)
        ref = smem(v, e.shared_operand)
        if not e.tma or ref is None:
            continue
        op = op_name(v.stmt)
        where = ref.expr.loc or v.stmt.loc
        dims = list(ref.shape) or [1]
        for i, d in enumerate(dims):
            if d > MAX_BOX_DIM:
                out.error(f"{op} copies a box of shape {dims}: dimension {i} has {d} elements; "
                          f"a TMA box has at most {MAX_BOX_DIM} per dimension", where)
        row = dims[-1] * ref.decl.elem.nbytes
        if row % BULK_ALIGN:
            out.error(f"the innermost dimension of {op}'s box spans {row} bytes; it must be a "
                      f"multiple of {BULK_ALIGN}", where)
