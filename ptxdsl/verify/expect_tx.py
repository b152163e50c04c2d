"""expect_tx: the bytes a thread arms a barrier's phase with are the bytes the copies that
complete on it deliver (else the phase never completes, or completes early)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .. import ir
from ..errors import Note
from .barriers import constant
from .effects import effect, op_name
from .facts import Facts, Report, text


@dataclass
class _Armed:
    """Byte counts armed on one barrier expression and the copies that follow in a block."""

    expects: list[ir.Op]
    copies: list[ir.Op]
    partial: bool = False


def _copy_bytes(s: ir.Op) -> int | None:
    e = effect(s)
    if e.size is not None:
        return constant(getattr(s, e.size))
    view = getattr(s, e.async_write or "", None)
    return getattr(view.type, "nbytes", None) if view is not None else None


def check_expect_tx(facts: Facts, out: Report) -> None:
    """`mbarrier_arrive_expect_tx(b, N); copy(..., b)...`: N = bytes copied. The copies of a
    block, and, for a block that ends with the barrier armed, those issued after it in the
    branches around it (each block is followed to the end of the kernel). A copy that a loop
    around the block may issue again, or one in a nested block, leaves it undecided."""
    copies = [s for s in facts.statements if isinstance(s, ir.Op) and effect(s).complete]
    for block, loops, rest in _blocks(facts.kernel.body, (), ()):
        inside = {id(s) for s in ir.walk(block)}
        again = {id(s) for loop in loops for s in ir.walk(loop.body)} - inside
        repeated = [getattr(c, effect(c).complete or "") for c in copies if id(c) in again]
        _expect_tx_block(block, out, rest, repeated)


def _blocks(body: tuple[ir.Stmt, ...], loops: tuple[ir.For | ir.While, ...],
            rest: tuple[ir.Stmt, ...]
            ) -> Iterator[tuple[tuple[ir.Stmt, ...], tuple[ir.For | ir.While, ...],
                                tuple[ir.Stmt, ...]]]:
    """Every block of `body` (itself first), each with the loops around it and the
    statements that run after it (in the blocks around it, innermost first)."""
    yield body, loops, rest
    for i, s in enumerate(body):
        inner = loops + (s,) if isinstance(s, (ir.For, ir.While)) else loops
        for b in ir.blocks(s):
            yield from _blocks(b, inner, body[i + 1:] + rest)


def _may_alias(a: ir.Expr, b: ir.Expr) -> bool:
    """Whether two barrier expressions may name the same barrier."""
    if a == b:
        return True
    roots = []
    for e in (a, b):
        while isinstance(e, ir.Index):
            e = e.base
        roots.append(getattr(e, "name", None))
    if roots[0] != roots[1]:
        return False
    ia = constant(a.indices[0]) if isinstance(a, ir.Index) else None
    ib = constant(b.indices[0]) if isinstance(b, ir.Index) else None
    return ia is None or ib is None or ia == ib


def _expect_tx_block(block: tuple[ir.Stmt, ...], out: Report, rest: tuple[ir.Stmt, ...],
                     repeated: list[ir.Expr]) -> None:
    armed: dict[ir.Expr, _Armed] = {}
    early: dict[ir.Expr, list[ir.Op]] = {}  # copies issued before the arming, same block

    def touched(key: ir.Expr, nested: bool) -> None:
        # Another expression for the same barrier (or copies in a nested block): this block
        # alone does not tell the total.
        for k, seg in armed.items():
            if (nested or k != key) and _may_alias(k, key):
                seg.partial = True

    multicast = False  # peers deliver to this CTA's barriers too: the block can't tell totals
    for s in block:
        if effect(s).multicast:
            multicast = True
            for armed_seg in armed.values():
                armed_seg.partial = True
            continue
        e = effect(s)
        key = getattr(s, e.expect or e.complete or "", None)
        if key is not None:
            touched(key, nested=False)
        if isinstance(s, ir.Op) and e.expect and key is not None:
            seg = armed.get(key)
            if seg is not None and not seg.copies:
                seg.expects.append(s)
            else:
                if seg is not None:
                    _compare(seg, out)
                armed[key] = _Armed([s], early.pop(key, []))
                armed[key].partial = multicast
        elif isinstance(s, ir.Op) and e.complete and key is not None:
            if key in armed:
                armed[key].copies.append(s)
            else:
                early.setdefault(key, []).append(s)
        elif isinstance(s, (ir.Let, ir.Assign, ir.SetElem, ir.Asm)):
            names = set(s.outs) if isinstance(s, ir.Asm) else {s.name}
            for k in [k for k in armed if ir.free_names(k) & names]:
                _compare(armed.pop(k), out)
            for k in [k for k in early if ir.free_names(k) & names]:
                del early[k]
        else:
            for inner in (x for b in ir.blocks(s) for x in ir.walk(b)):
                ie = effect(inner)
                ikey = getattr(inner, ie.expect or ie.complete or "", None)
                if ikey is not None:
                    touched(ikey, nested=True)
    for key, seg in armed.items():
        if any(_may_alias(key, k) for k in repeated):
            seg.partial = True
        _follow(key, seg, rest)
        _compare(seg, out)


def _follow(key: ir.Expr, seg: _Armed, rest: tuple[ir.Stmt, ...]) -> bool:
    """Adds to `seg` the copies on `key` among the statements that run after its block, up
    to a change of a variable of `key` (then False); marks it partial at a copy it cannot
    count (nested other than under elect(), on another expression of the barrier, another
    arming, or multicast)."""
    for s in rest:
        if seg.partial:
            return False
        e = effect(s)
        k = getattr(s, e.expect or e.complete or "", None)
        if e.multicast or (k is not None and _may_alias(key, k) and (k != key or e.expect)):
            seg.partial = True
        elif k is not None and e.complete and k == key:
            seg.copies.append(s)  # type: ignore[arg-type]
        elif isinstance(s, (ir.Let, ir.Assign, ir.SetElem, ir.Asm)):
            names = set(s.outs) if isinstance(s, ir.Asm) else {s.name}
            if ir.free_names(key) & names:
                return False
        elif isinstance(s, ir.If) and not s.orelse and isinstance(s.cond, ir.Call) and \
                s.cond.fn == "elect":
            # the threads that ran the arming's block reach it: one of them runs it once
            if not _follow(key, seg, s.then):
                return False
        else:
            for inner in (x for b in ir.blocks(s) for x in ir.walk(b)):
                ie = effect(inner)
                ikey = getattr(inner, ie.expect or ie.complete or "", None)
                if ie.multicast or (ikey is not None and _may_alias(key, ikey)):
                    seg.partial = True
    return True


def _compare(seg: _Armed, out: Report) -> None:
    if seg.partial or not seg.copies:
        return
    armed = [constant(getattr(s, effect(s).size or "", None)) for s in seg.expects]
    moved = [_copy_bytes(c) for c in seg.copies]
    if None in armed or None in moved:
        return
    want, got = sum(armed), sum(moved)  # type: ignore[arg-type]
    if want == got:
        return
    first = seg.expects[0]
    b = getattr(first, effect(first).expect or "")
    where = getattr(first, effect(first).size or "").loc or first.loc
    notes = [Note(f"{op_name(c)} delivers {n} bytes to '{text(b)}' here", c.loc)
             for c, n in zip(seg.copies, moved, strict=True)]
    out.error(f"{op_name(first)} expects {want} bytes on '{text(b)}', but the copies that "
              f"complete on it deliver {got} bytes", where, *notes)
