"""Shared memory written while a wgmma that reads it may be in flight, across iterations.

`wgmma.py` walks the body once and compares stage indices as expressions; a wgmma group left
in flight into the next iteration (`wgmma_wait(1)`, then releasing the stage the older group
read) reads a stage whose index variables have changed since, which expressions cannot
compare. Such loops (those that wait with n > 0) are run iteration by iteration (`unroll`)
with their wgmmas, commits, waits, copies, stores and releases, and the pending groups are
replayed with the stage values of each iteration: a release or a write of the stage a group
still in flight reads is reported (an error when the iteration certainly runs, a warning
when it runs only if the loop is that long); the release of a stage whose groups
`wgmma_wait(n)` retired is fine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import ir
from ..errors import Note, Span
from ..opdef import const_int
from .effects import bar, effect, smem
from .facts import Facts, Report, text
from .order import _empties, _rings
from .remote import root
from .threads import BarRef, SmemRef, Visit


@dataclass
class Rings:
    """The ring buffers of a kernel: stages of each, and the buffers each empty barrier
    hands back to the producer."""

    stages: dict[str, int] = field(default_factory=dict)
    empties: dict[str, list[str]] = field(default_factory=dict)


def find_rings(facts: Facts) -> Rings:
    out = Rings()
    body = facts.kernel.body
    bars = {d.name: d for d in body if isinstance(d, ir.BarrierDecl)}
    for d in body:  # pipelines: 'p.full' / 'p.empty' barriers, 'p.buf' stage buffers
        if isinstance(d, ir.SharedDecl) and "." in d.name:
            pipe = d.name.split(".")[0]
            empty = bars.get(f"{pipe}.empty")
            if empty is not None:
                out.stages[d.name] = empty.n
                out.empties.setdefault(empty.name, []).append(d.name)
    if any(isinstance(s, (ir.Wgmma)) for s in facts.statements):
        rings = _rings(facts)
        for r in rings.values():
            out.stages[r.buf] = r.stages
        for name, rs in _empties(facts, rings).items():
            out.empties.setdefault(name, []).extend(r.buf for r in rs)
    return out


def overwrite_message(how: str, buf: str) -> str:
    shown = buf.split(".", 1)[1] if "." in buf else buf
    pipe = f" of '{buf.split('.')[0]}'" if "." in buf else ""
    return (f"{how} '{shown}'{pipe} while a wgmma that reads it may still be in flight: "
            "wgmma_wait(n) must retire that wgmma's group first")


def release_message(pipe: str, lag: int = 0) -> str:
    return (f"release({pipe}) hands the stage back to the producer while a wgmma reading it "
            f"may still be in flight; wgmma_wait({lag}) before release")


def _values(v: Visit, val) -> frozenset[int] | None:
    vals = val.values(v.must if v.must.any() else v.may) if val is not None else None
    return None if vals is None else frozenset(int(x) for x in np.unique(vals))


def _place(v: Visit, ref: object, rings: Rings) -> tuple[str, frozenset[int] | None] | None:
    if not isinstance(ref, SmemRef):
        return None
    name = ref.decl.name
    if name in rings.stages and ref.indices:
        return name, _values(v, ref.indices[0])
    return name, None


@dataclass(frozen=True)
class _Pending:
    reads: tuple[tuple[str, frozenset[int] | None], ...]
    loc: Span | None


def _keep(s: ir.Stmt) -> bool:
    return isinstance(s, (ir.Op, ir.Store))


def check_unrolled_overwrites(facts: Facts, out: Report, rings: Rings) -> None:
    loops = [s for s in facts.statements if isinstance(s, (ir.For, ir.While))
             and any(isinstance(x, ir.WgmmaWait) and (const_int(x.n) or 0) > 0
                     for x in ir.walk(s.body))
             and _may_overwrite(s, rings)]
    turns = 2 * max(rings.stages.values(), default=1) + 2
    for loop in loops:
        _replay(facts, out, rings, loop, facts.unroller.iterations(loop, turns, _keep))


def _may_overwrite(loop: ir.Stmt, rings: Rings) -> bool:
    """Whether the loop writes, or hands back through a hand-written ring, a buffer that its
    wgmmas read: the replay has nothing to find otherwise (a pipeline's releases are the
    count walk's)."""
    body = list(ir.walk(loop.body))  # type: ignore[attr-defined]
    read = {root(getattr(x, f)) for x in body if isinstance(x, ir.Wgmma) for f in ("a", "b")}
    for x in body:
        if isinstance(x, ir.Store):
            hit = root(x.ref) in read
        elif isinstance(x, ir.MBarrierArrive):
            name = root(x.bar) or ""
            hit = not name.endswith(".empty") and bool(read & set(rings.empties.get(name, ())))
        elif isinstance(x, ir.Op) and (field_ := effect(x).async_write) is not None:
            hit = root(getattr(x, field_)) in read
        else:
            continue
        if hit:
            return True
    return False


def _replay(facts: Facts, out: Report, rings: Rings, loop: ir.Stmt, its) -> None:
    open_: list[_Pending] = []
    groups: list[list[_Pending]] = []
    for it in its:
        for v in it.visits:
            s = v.stmt
            if isinstance(s, ir.Wgmma):
                reads = tuple(p for f in ("a", "b") if (p := _place(v, v.args.get(f), rings)))
                open_.append(_Pending(reads, s.loc))
            elif isinstance(s, ir.WgmmaCommit):
                if open_:
                    groups.append(open_)
                open_ = []
            elif isinstance(s, ir.WgmmaWait):
                n = const_int(s.n) or 0
                groups = groups[len(groups) - n:] if n else []
            else:
                for buf, vals, how in _writes(v, rings):
                    pending = [p for g in groups for p in g] + open_
                    hit = next((p for p in pending for b, pv in p.reads if b == buf and
                                (pv is None or vals is None or pv & vals)), None)
                    if hit is None:
                        continue
                    msg = overwrite_message(how, buf)
                    note = Note("the wgmma that reads it is issued here", hit.loc)
                    at = s.loc.start if s.loc else None
                    if any(k[0] == "error" and k[2] == at for k in out.seen):
                        return  # the walk over the counts has reported this site
                    if it.sure:
                        out.error(msg, s.loc, note)
                    else:
                        out.warning(f"{msg} (in iteration {it.number}, if the loop runs that "
                                    "long)", s.loc, note)
                    return


def _writes(v: Visit, rings: Rings):
    """(buffer, stage values, words) of what a visit overwrites or hands to the producer."""
    s = v.stmt
    if isinstance(s, ir.Store):
        p = _place(v, v.args.get("ref"), rings)
        if p is not None:
            yield (*p, "this store writes")
        return
    e = effect(s)
    if e.async_write and not effect(s).multicast:
        p = _place(v, smem(v, e.async_write), rings)
        if p is not None:
            yield (*p, f"this {getattr(s, 'syntax', '')} writes")
    if isinstance(s, ir.MBarrierArrive):
        b = bar(v, "bar")
        if isinstance(b, BarRef):
            vals = _values(v, b.index) if b.index is not None else None
            if b.decl.name.endswith(".empty"):
                return  # a pipeline's release: wgmma.py decides it from the stages held
            for buf in rings.empties.get(b.decl.name, ()):
                yield buf, vals, f"this arrive on '{text(b.expr)}' releases the stage of"
