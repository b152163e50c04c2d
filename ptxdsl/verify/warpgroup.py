"""Whether a branch condition is the same in every thread of a warpgroup: wgmma and its
fences are warpgroup-collective, so a guard around them must not split a warpgroup.

A condition the trace knows per thread is decided exactly; an unknown one is decided from
its parts: parts that are the same in a warpgroup make a whole that is; `elect()` picks one
thread a warp; and `x == u`, with `x` known per thread and taking two or more values in a
warpgroup and `u` the same in every thread, holds for at most the threads of one value.
Anything else is undecided (a warning where it guards a wgmma)."""

from __future__ import annotations

import numpy as np

from .. import ir
from .values import Evaluator, Val

UNIFORM, SPLIT, UNKNOWN = "uniform", "split", "unknown"
WARPGROUP = 128


def verdict(ev: Evaluator, e: ir.Expr, env: dict[str, Val], must: np.ndarray,
            may: np.ndarray) -> str:
    """UNIFORM, SPLIT or UNKNOWN for condition `e` over the threads `may` that reach it."""
    v = ev.ev(e, env, must, may)
    if v.known is not None:
        return SPLIT if _values_per_group(v.known, may, 2) else UNIFORM
    if v.is_uniform:
        return UNIFORM
    if isinstance(e, ir.Call) and e.fn == "elect":
        return SPLIT
    if isinstance(e, ir.Compare) and e.op == "eq":
        a, b = ev.ev(e.a, env, must, may), ev.ev(e.b, env, must, may)
        for x, y in ((a, b), (b, a)):
            if x.known is not None and y.is_uniform and _values_per_group(x.known, may, 2):
                return SPLIT
    parts = [x for name in ir.node_fields(e) for x in _exprs(getattr(e, name))]
    if parts and all(verdict(ev, x, env, must, may) == UNIFORM for x in parts) and \
            not isinstance(e, (ir.Load, ir.Call)):
        return UNIFORM
    if isinstance(e, ir.Load) and verdict(ev, e.ref, env, must, may) == UNIFORM:
        return UNIFORM  # one address: one value
    return UNKNOWN


def _exprs(x: object) -> list[ir.Expr]:
    if isinstance(x, ir.Expr):
        return [x]
    return [y for y in x if isinstance(y, ir.Expr)] if isinstance(x, tuple) else []


def _values_per_group(known: int | np.ndarray, may: np.ndarray, least: int) -> bool:
    """Whether some warpgroup's threads in `may` hold at least `least` distinct values."""
    if isinstance(known, int):
        return least <= 1
    arr = np.broadcast_to(np.asarray(known), may.shape)
    for g in range(0, len(may), WARPGROUP):
        reached = may[g:g + WARPGROUP]
        if reached.any() and len(np.unique(arr[g:g + WARPGROUP][reached])) >= least:
            return True
    return False
