"""Two CTAs storing one tile (issue 44, class 9): a `tma_store` whose coordinates step with
the CTA id by less than its box, so that neighbouring CTAs store overlapping boxes with
nothing ordering the stores. The usual cause is a tensor map over a flat view of several
CTAs' parts (heads x rows, stored per head): the map clips a box only at the bounds of the
whole tensor, so a part shorter than the box spills into the next one.

The coordinates are evaluated (`counts.Bounds`: each `let` replaced by its one definition)
for the CTAs 0 and 1 along each grid axis, in a few assignments of the parameters. Boxes that
differ and intersect in every assignment are an error; in some of them, a warning naming
the parameters. A store inside a loop, or whose coordinates depend on the thread, a load or
a variable assigned more than once, is left to the interpreter (`interp/gwrites.py`), which
reports every pair of unordered stores of one element as it runs; so are bulk stores."""

from __future__ import annotations

from .. import ir
from .. import types as T
from .counts import Bounds, Sample, samples_of
from .facts import Facts, Report, text

Box = tuple[tuple[int, int], ...]  # per coordinate, innermost first: [start, stop)


def check_tile_overlap(facts: Facts, out: Report) -> None:
    k = facts.kernel
    stores = [(s, path) for s, path, loop in ir.sites(k.body)
              if isinstance(s, ir.TensorStore) and loop is None]
    if not stores:
        return
    base = samples_of(k)
    axes = []
    for axis in "xyz":
        pairs = [Sample(b.params, b.sregs | {f"ctaid.{a}": 0 for a in "xyz"} |
                        {f"ctaid.{axis}": c,
                         f"nctaid.{axis}": max(2, b.sregs[f"nctaid.{axis}"])})
                 for b in base for c in (0, 1)]
        axes.append((axis, Bounds(k, pairs), pairs))
    for s, path in stores:
        any(_check(s, path, axis, bounds, pairs, out) for axis, bounds, pairs in axes)


def _box(s: ir.TensorStore, bounds: Bounds, si: int, path: tuple) -> Box | None:
    """The box `s` stores in sample `si`: None when the store does not run there or its
    coordinates are not known."""
    for cond, arm in path:
        if _never(cond, arm, bounds, si):
            return None
    shape = list(reversed(s.src.type.shape)) if isinstance(s.src.type, T.SharedRef) else []
    box = []
    for i, c in enumerate(s.coords):
        v = bounds.value(c, si)
        if v is None or not isinstance(v.known, int):
            return None
        start = v.known
        box.append((start, start + (shape[i] if i < len(shape) else 1)))
    return tuple(box)


def _never(cond: ir.Expr, arm: bool, bounds: Bounds, si: int) -> bool:
    """Whether the `arm` side of a branch on `cond` is never taken in sample `si`: its value
    is known, or one conjunct of a `then` (one disjunct of an `else`) is."""
    if isinstance(cond, ir.Binary) and cond.op == ("and" if arm else "or"):
        return _never(cond.a, arm, bounds, si) or _never(cond.b, arm, bounds, si)
    v = bounds.value(cond, si)
    return v is not None and bool(v.known) != arm


def _check(s: ir.TensorStore, path: tuple, axis: str, bounds: Bounds, pairs: list[Sample],
           out: Report) -> bool:
    """Report `s` if its boxes overlap for two CTAs along `axis`; whether it did."""
    hits: list[tuple[int, Box, Box]] = []
    known = 0
    for si in range(0, len(pairs), 2):
        a, b = _box(s, bounds, si, path), _box(s, bounds, si + 1, path)
        if a is None or b is None:
            continue
        known += 1
        if a != b and all(lo < hi2 and lo2 < hi for (lo, hi), (lo2, hi2) in zip(a, b, strict=True)):
            hits.append((si, a, b))
    if not hits:
        return False
    si, a, b = hits[0]
    params = sorted(set().union(*(bounds.params_of(c) for c in s.coords)))
    when = "" if len(hits) == known else " when " + ", ".join(
        f"{p} = {pairs[si].params[p]}" for p in params) + ", for one"
    dims = " x ".join(str(hi - lo) for lo, hi in reversed(a))
    coords = ", ".join(text(c) for c in s.coords)
    message = (f"{s.syntax} of '{text(s.tmap)}' at [{coords}] stores a box of {dims} "
               f"elements, and the boxes of the CTAs with %ctaid.{axis} = 0 and 1 overlap"
               f"{when} (at [{', '.join(str(lo) for lo, _ in a)}] and "
               f"[{', '.join(str(lo) for lo, _ in b)}]): two CTAs store the same elements "
               "with nothing ordering the stores, a race. A tensor map clips a box only at "
               "the bounds of its tensor: over a flat view of the CTAs' parts (heads x rows) a "
               "part shorter than the box spills into the next one; give the map one more "
               "dimension for the parts, so that its bound clips each box, or keep every "
               "part a multiple of the box")
    if when:
        out.warning(message, s.loc)
    else:
        out.error(message, s.loc)
    return True
