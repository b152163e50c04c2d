"""`turn { }` blocks become named barriers: the warpgroups of a role take turns.

For a role of n warpgroups (me = (%warp - first warp) / 4), the rotation uses n consecutive
named barriers b, b + 1, ..., b + n - 1 (the highest ids no `bar_sync` / `bar_arrive` of the
kernel names as a constant). Barrier b + i is warpgroup i's turn: a generation of it is
warpgroup i waiting (128 threads) and warpgroup i - 1 handing over (128), so every count is
256. Each turn block becomes

    bar_sync(b + me, 256); body; bar_arrive(b + (me + 1) % n, 256);

the role starts with warpgroup n - 1 handing the first turn to warpgroup 0, and ends with
warpgroup 0 taking the hand-over of the last turn, which nobody else waits for. The verifier
then checks the result like hand-written barriers (`verify.named`: counts against users),
and the interpreter runs it."""

from __future__ import annotations

import dataclasses

from .. import ir
from .. import types as T
from ..errors import DiagnosticBag
from ..opdef import const_int, effect

COUNT = 256  # the warpgroup whose turn it is, and the one handing it over


def _c(v: int) -> ir.Const:
    return ir.Const(value=v, type=T.u32)


def _bin(op: str, a: ir.Expr, b: ir.Expr) -> ir.Expr:
    return ir.Binary(op=op, a=a, b=b, type=T.u32)


def _bar(sync: bool, bid: ir.Expr, loc) -> ir.Stmt:
    node = ir.BarSync if sync else ir.BarArrive
    return node(id=bid, nthreads=_c(COUNT), loc=loc)


def _rewrite(stmts: tuple[ir.Stmt, ...], me: ir.Expr, n: int, base: int) -> tuple[ir.Stmt, ...]:
    out: list[ir.Stmt] = []
    for s in stmts:
        if isinstance(s, ir.Turn):
            nxt = _bin("rem", _bin("add", me, _c(1)), _c(n))
            out += [_bar(True, _bin("add", _c(base), me), s.loc), *s.body,
                    _bar(False, _bin("add", _c(base), nxt), s.loc)]
        else:
            out.append(ir.with_blocks(s, lambda b: _rewrite(b, me, n, base)))
    return tuple(out)


def _free_ids(k: ir.Kernel) -> set[int]:
    """Named barrier ids 1-15 that no bar_sync / bar_arrive of the kernel names as a constant."""
    used = {const_int(getattr(s, role)) for s in ir.walk(k.body)
            if (role := effect(s).named_barrier) is not None}
    return set(range(1, 16)) - used


def lower_turns(k: ir.Kernel, diags: DiagnosticBag) -> ir.Kernel:
    body: list[ir.Stmt] = []
    free = _free_ids(k)
    for s in k.body:
        if not isinstance(s, ir.Role) or not any(isinstance(x, ir.Turn) for x in ir.walk(s.body)):
            body.append(s)
            continue
        n = (s.warp_stop - s.warp_start) // 4
        base = next((b for b in range(16 - n, 0, -1) if set(range(b, b + n)) <= free), None)
        if base is None:
            diags.error(f"role '{s.name}' takes turns among {n} warpgroups, which needs {n} "
                        "consecutive named barriers that no bar_sync / bar_arrive uses", s.loc)
            body.append(s)
            continue
        free -= set(range(base, base + n))
        warp = ir.SReg(name="warp", type=T.u32)
        me = _bin("div", _bin("sub", warp, _c(s.warp_start)), _c(4))
        first = ir.If(cond=ir.Compare(op="eq", a=me, b=_c(n - 1), type=T.pred),
                      then=(_bar(False, _c(base), s.loc),), loc=s.loc)
        last = ir.If(cond=ir.Compare(op="eq", a=me, b=_c(0), type=T.pred),
                     then=(_bar(True, _c(base), s.loc),), loc=s.loc)
        body.append(dataclasses.replace(s, body=(first, *_rewrite(s.body, me, n, base), last)))
    return dataclasses.replace(k, body=tuple(body))
