"""Tensor-core rules: wgmma's asynchronous register and shared-memory hazards, who issues
it, and its operands against the buffers' declared layouts.

The hazard check is a flow-sensitive walk of the lowered body (loops until a fixed point,
both arms of a branch joined): it tracks register arrays written since the last
`wgmma_fence`, and the wgmmas not yet completed by a `wgmma_wait` (uncommitted, then by
commit group) with the buffers they read. It reports
  - a wgmma whose accumulator (or A fragment) was written after the last wgmma_fence, or
    that no wgmma_fence precedes;
  - a read or write of an accumulator while a wgmma that writes it may be in flight;
  - shared memory that a wgmma which may be in flight reads, written under it: a copy
    into it (TMA, bulk, multicast), a generic store, or the release of its stage to the
    producer (`release`, or an arrive on a hand-written ring's empty barrier).
Stages are compared by their index expressions: a read of `buf[s]` conflicts with a write of
`buf[s]` while no variable of `s` has changed since the wgmma; once one has (the next
iteration, the ring advanced), `wgmma_smem.py` decides it from the loop run iteration by
iteration, so the release of the stage a group retired by wgmma_wait(n) read is accepted.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from .. import ir
from .. import types as T
from ..errors import Note, Span
from ..opdef import const_int
from ..swizzle import undeclared_layout
from .effects import effect, op_name
from .facts import Facts, Report, text
from .remote import root
from .threads import Visit, _assigned
from .warpgroup import SPLIT
from .wgmma_smem import (
    Rings,
    check_unrolled_overwrites,
    find_rings,
    overwrite_message,
    release_message,
)

_NEVER = ""  # the pseudo-array "no wgmma_fence yet"
_MAX_GROUPS = 8


MOVED = ir.Const(value=-1, type=T.u32)  # a stage index whose variables changed since


@dataclass(frozen=True)
class _Op:
    acc: str
    bufs: frozenset[str]
    loc: Span | None = field(compare=False)
    a_regs: str = ""  # an A fragment in registers, read asynchronously too
    # (buffer, index of its outer dimension or None) of each shared operand
    stages: frozenset[tuple[str, ir.Expr | None]] = frozenset()
    # per pipeline it reads: the waits on that pipeline since it was issued (0: it reads the
    # stage waited last); a lagging release hands back the stage `held - 1` waits old
    ages: tuple[tuple[str, int], ...] = ()

    def moved(self, names: set[str]) -> _Op:
        """This op once a variable of `names` changed: stage indices using it are unknown."""
        if not any(e is not None and ir.free_names(e) & names for _, e in self.stages):
            return self
        stages = frozenset((b, MOVED if e is not None and ir.free_names(e) & names else e)
                           for b, e in self.stages)
        return dataclasses.replace(self, stages=stages)


@dataclass(frozen=True)
class _State:
    dirty: frozenset[tuple[str, Span | None]]
    open: frozenset[_Op]
    groups: tuple[frozenset[_Op], ...]
    held: tuple[tuple[str, int], ...] = ()  # stages waited on and not released, per pipeline

    def pending(self) -> frozenset[_Op]:
        out = set(self.open)
        for g in self.groups:
            out |= g
        return frozenset(out)

    def moved(self, names: set[str]) -> _State:
        if not names or not self.pending():
            return self
        return _State(self.dirty, frozenset(o.moved(names) for o in self.open),
                      tuple(frozenset(o.moved(names) for o in g) for g in self.groups),
                      self.held)


def _join(a: _State, b: _State) -> _State:
    n = max(len(a.groups), len(b.groups))
    empty: frozenset[_Op] = frozenset()
    ga = (empty,) * (n - len(a.groups)) + a.groups
    gb = (empty,) * (n - len(b.groups)) + b.groups
    ha, hb = dict(a.held), dict(b.held)
    # the fewer stages held (the elected arm of a release has released one)
    held = {p: min(ha.get(p, 0), hb.get(p, 0)) for p in ha.keys() | hb.keys()}
    return _State(a.dirty | b.dirty, a.open | b.open,
                  tuple(x | y for x, y in zip(ga, gb, strict=True)), tuple(sorted(held.items())))


def _buffer(place: ir.Expr) -> str | None:
    while isinstance(place, ir.Index):
        place = place.base
    return place.name if isinstance(place, ir.SharedBuf) else None


def stage_of(place: ir.Expr, stages: dict[str, int]) -> tuple[str, ir.Expr | None] | None:
    """(buffer, index of its stage dimension) of a shared place; the index is None when the
    buffer is no ring (`stages`: buffer -> number of stages)."""
    while isinstance(place, ir.Peer):
        place = place.ref
    inner = place
    while isinstance(inner, ir.Index) and isinstance(inner.base, ir.Index):
        inner = inner.base
    name = _buffer(place)
    if name is None:
        return None
    if name in stages and isinstance(inner, ir.Index) and inner.indices:
        return name, inner.indices[0]
    return name, None


def same_stage(a: ir.Expr | None, b: ir.Expr | None) -> bool | None:
    """Whether two stage indices name the same stage: None when that is not known here."""
    if a is None or b is None:
        return True
    if a is MOVED or b is MOVED:
        return None
    return True if a == b else None


class _Hazards:
    def __init__(self, out: Report, rings: Rings):
        self.out = out
        self.rings = rings

    def block(self, stmts: tuple[ir.Stmt, ...], st: _State) -> _State:
        for s in stmts:
            st = self.stmt(s, st)
        return st

    def stmt(self, s: ir.Stmt, st: _State) -> _State:
        if (pipe := _released(s)) is not None:
            st = self.lagging_release(s, pipe, st)
        if isinstance(s, ir.If):
            self.reads(s.cond, st)
            return _join(self.block(s.then, st), self.block(s.orelse, st))
        if isinstance(s, (ir.For, ir.While)):
            if isinstance(s, ir.For):
                for e in (s.start, s.stop, s.step):
                    self.reads(e, st)
            changed = _assigned(s.body) | ({s.var} if isinstance(s, ir.For) else set())
            cur = st.moved(changed)
            for _ in range(6):  # the lattice is finite; a few passes reach its fixed point
                if isinstance(s, ir.While):
                    self.reads(s.cond, cur)
                nxt = _join(cur, self.block(s.body, cur).moved(changed))
                if nxt == cur:
                    break
                cur = nxt
            return cur
        if isinstance(s, ir.WgmmaFence):
            return dataclasses.replace(st, dirty=frozenset())
        if isinstance(s, ir.WgmmaCommit):
            groups = st.groups + ((st.open,) if st.open else ())
            if len(groups) > _MAX_GROUPS:
                groups = (groups[0] | groups[1],) + groups[2:]
            return _State(st.dirty, frozenset(), groups, st.held)
        if isinstance(s, ir.WgmmaWait):
            n = const_int(s.n) or 0
            return dataclasses.replace(st, groups=st.groups[len(st.groups) - n:] if n else ())
        if isinstance(s, ir.Wgmma):
            return self.wgmma(s, st)
        if isinstance(s, ir.MBarrierWait) and (pipe := _pipe_of(s.bar, ".full")):
            st = _waited(st, pipe)
        if isinstance(s, ir.MBarrierArrive):
            self.release(s, st)
        self.overwrite(s, st)
        for e in _exprs(s):
            self.reads(e, st)
        if isinstance(s, (ir.Let, ir.Assign)):
            st = st.moved({s.name})
        elif isinstance(s, ir.Asm):
            st = st.moved(set(s.outs))
        written = _written(s)
        if written is not None:
            self.touch(written, s.loc, st, "written")
            return dataclasses.replace(st, dirty=st.dirty | {(written, s.loc)})
        return st

    def overwrite(self, s: ir.Stmt, st: _State) -> None:
        """A copy into, or a generic store to, shared memory a pending wgmma reads."""
        if isinstance(s, ir.Store):
            place, how = s.ref, "this store writes"
        else:
            field_ = effect(s).async_write
            if field_ is None:
                return
            place, how = getattr(s, field_), f"this {op_name(s)} writes"
        if not isinstance(place.type, (T.SharedRef, T.PeerShared)) or not st.pending():
            return
        if isinstance(place, ir.Peer) or effect(s).multicast:
            return  # lands in other CTAs too: their wgmmas are not this thread's
        target = stage_of(place, self.rings.stages)
        if target is not None:
            self.conflict(st, target[0], target[1], s.loc, how)

    def conflict(self, st: _State, buf: str, idx: ir.Expr | None, loc: Span | None,
                 how: str) -> bool:
        for op in sorted(st.pending(), key=lambda o: o.loc.start if o.loc else 0):
            for b, e in sorted(op.stages, key=lambda x: x[0]):
                if b == buf and same_stage(e, idx):
                    self.out.error(overwrite_message(how, buf), loc,
                                   Note("the wgmma that reads it is issued here", op.loc))
                    return True
        return False

    def wgmma(self, s: ir.Wgmma, st: _State) -> _State:
        names = [s.d.name]  # type: ignore[attr-defined]
        if isinstance(s.a.type, T.RegArray):
            whole = s.a.vec if isinstance(s.a, ir.Fragment) else s.a
            names.append(whole.name)  # type: ignore[attr-defined]
        for name, loc in sorted(st.dirty, key=lambda x: (x[0], x[1].start if x[1] else 0)):
            if name == _NEVER:
                self.out.error("wgmma without a wgmma_fence() before it: the fence orders the "
                               "warpgroup's register accesses before the tensor cores read "
                               "them", s.loc)
            elif name in names:
                self.out.error(f"register array '{name}' is written after the last "
                               f"wgmma_fence() and read by this wgmma; put wgmma_fence() "
                               f"between them", s.loc, Note(f"'{name}' is written here", loc))
        if len(names) > 1:
            self.touch(names[1], s.loc, st, "read")
        bufs = frozenset(b for b in (_buffer(s.a), _buffer(s.b)) if b is not None)
        stages = frozenset(x for x in (stage_of(s.a, self.rings.stages),
                                       stage_of(s.b, self.rings.stages)) if x is not None)
        ages = tuple(sorted({(b.split(".")[0], 0) for b in bufs if "." in b}))
        op = _Op(names[0], bufs, s.loc, names[1] if len(names) > 1 else "", stages, ages)
        return dataclasses.replace(st, open=st.open | {op})

    def touch(self, name: str, loc: Span | None, st: _State, how: str) -> None:
        for op in sorted(st.pending(), key=lambda o: o.loc.start if o.loc else 0):
            if op.acc == name:
                self.out.error(f"accumulator '{name}' is {how} here while a wgmma that writes "
                               "it may still be in flight; wgmma_commit() and wgmma_wait(n) "
                               "must complete that wgmma first", loc,
                               Note("the wgmma is issued here", op.loc))
                return
            if op.a_regs == name and how == "written":
                self.out.error(f"A fragment '{name}' is written here while a wgmma that reads "
                               "it may still be in flight; wgmma_wait(n) must complete that "
                               "wgmma first", loc, Note("the wgmma is issued here", op.loc))
                return

    def reads(self, e: ir.Expr, st: _State) -> None:
        if isinstance(e, ir.Extract) and isinstance(e.vec.type, T.RegArray) and \
                isinstance(e.vec, ir.Var):
            self.touch(e.vec.name, e.loc, st, "read")
        for name in e.__dataclass_fields__:
            v = getattr(e, name)
            if isinstance(v, ir.Expr):
                self.reads(v, st)
            elif isinstance(v, tuple):
                for x in v:
                    if isinstance(x, ir.Expr):
                        self.reads(x, st)

    def release(self, s: ir.MBarrierArrive, st: _State) -> None:
        bar = s.bar
        while isinstance(bar, ir.Peer):
            bar = bar.ref
        idx = bar.indices[0] if isinstance(bar, ir.Index) and bar.indices else None
        name = root(bar) or ""
        for buf in self.rings.empties.get(name, ()):
            if name.endswith(".empty"):  # a pipeline's release: its own words
                pipe = name[: -len(".empty")]
                for op in sorted(st.pending(), key=lambda o: o.loc.start if o.loc else 0):
                    if any(b == buf and same_stage(e, idx) for b, e in op.stages):
                        self.out.error(release_message(pipe), s.loc,
                                       Note("the wgmma is issued here", op.loc))
                        return
                continue
            if self.conflict(st, buf, idx, s.loc,
                             f"this arrive on '{text(s.bar)}' releases the stage of"):
                return

    def lagging_release(self, s: ir.Stmt, pipe: str, st: _State) -> _State:
        """A pipeline's release hands back the oldest stage its consumer holds: a wgmma issued
        after the wait on that stage (fewer waits since than the stages held) may read it.
        Decided from the counts alone, for every iteration, whichever cursor the release
        indexes with (`wgmma_smem.py` leaves pipeline releases to this walk)."""
        held = dict(st.held)
        n = held.get(pipe, 0)
        for op in sorted(st.pending(), key=lambda o: o.loc.start if o.loc else 0):
            if dict(op.ages).get(pipe, -1) >= max(n - 1, 0):
                self.out.error(release_message(pipe, max(n - 1, 0)), s.loc,
                               Note("the wgmma is issued here", op.loc))
                break
        held[pipe] = max(n - 1, 0)
        return dataclasses.replace(st, held=tuple(sorted(held.items())))


def _pipe_of(b: ir.Expr, suffix: str) -> str | None:
    """The pipeline whose `suffix` ("full" or "empty") barriers `b` names, local or a peer's."""
    if isinstance(b, ir.Peer):
        b = b.ref
    while isinstance(b, ir.Index):
        b = b.base
    name = getattr(b, "name", "")  # only a pipeline's barriers have a dot in their name
    return name[: -len(suffix)] if name.endswith(suffix) else None


def _released(s: ir.Stmt) -> str | None:
    """The pipeline a statement releases a stage of: an arrive on its empty barrier, or the
    loop of arrives on the peers' empty barriers that a cluster pipeline releases with (its
    arrives are not counted again)."""
    if isinstance(s, ir.MBarrierArrive) and not isinstance(s.bar, ir.Peer):
        return _pipe_of(s.bar, ".empty")
    if isinstance(s, ir.For):
        ops = [x for x in ir.walk(s.body) if isinstance(x, ir.Op)]
        arrives = [x for x in ops if isinstance(x, ir.MBarrierArrive)]
        pipes = {_pipe_of(x.bar, ".empty") for x in arrives}
        if arrives and len(arrives) == len(ops) and len(pipes) == 1 and \
                all(isinstance(x.bar, ir.Peer) for x in arrives):
            return pipes.pop()
    return None


_MAX_AGE = 8  # waits counted since a wgmma was issued; more are as good as this many


def _waited(st: _State, pipe: str) -> _State:
    """A wait on the next stage: one more held, and every pending wgmma one wait older."""
    def older(op: _Op) -> _Op:
        ages = tuple((p, min(a + 1, _MAX_AGE) if p == pipe else a) for p, a in op.ages)
        return dataclasses.replace(op, ages=ages)

    held = dict(st.held)
    held[pipe] = min(held.get(pipe, 0) + 1, _MAX_AGE)
    return _State(st.dirty, frozenset(map(older, st.open)),
                  tuple(frozenset(map(older, g)) for g in st.groups),
                  tuple(sorted(held.items())))


def _exprs(s: ir.Stmt) -> list[ir.Expr]:
    out: list[ir.Expr] = []
    for f in dataclasses.fields(s):
        v = getattr(s, f.name)
        if isinstance(v, ir.Expr):
            out.append(v)
        elif isinstance(v, tuple):
            out.extend(x for x in v if isinstance(x, ir.Expr))
    return out


def _written(s: ir.Stmt) -> str | None:
    """The register array a statement writes (an element, or a whole initialisation)."""
    if isinstance(s, ir.SetElem):
        return s.name
    if isinstance(s, ir.Let) and isinstance(s.var_type, T.RegArray) and s.value is not None:
        return s.name
    return None


def _uses_wgmma(k: ir.Kernel) -> bool:
    return any(effect(s).wgmma for s in ir.walk(k.body))


def check_wgmma_hazards(facts: Facts, out: Report) -> None:
    k = facts.kernel
    if not _uses_wgmma(k):
        return
    start = _State(frozenset({(_NEVER, k.loc)}), frozenset(), ())
    rings = find_rings(facts)
    _Hazards(out, rings).block(k.body, start)
    check_unrolled_overwrites(facts, out, rings)


def check_wgmma_issuers(facts: Facts, out: Report) -> None:
    """wgmma and its fences are `.sync.aligned` over a warpgroup: every thread of whole,
    aligned warpgroups (warps 4g .. 4g + 4) executes them, or none."""
    if not _uses_wgmma(facts.kernel):
        return
    n = facts.n
    for v in facts.trace.visits:
        if not effect(v.stmt).wgmma or not v.may.any():
            continue
        if not v.certain:
            _split_guards(v, out)
            continue
        for g in range(0, n, 128):
            part = v.may[g : g + 128]
            k = int(part.sum())
            if 0 < k < len(part) or len(part) < 128 and k:
                idx = np.flatnonzero(part) + g
                out.error(f"{v.stmt.syntax} is executed by {k} thread(s) of warpgroup "  # type: ignore[attr-defined]
                          f"{g // 128} (threads {idx[0]} .. {idx[-1] + 1}); it is warpgroup-"
                          "collective: all 128 threads of whole, aligned warpgroups (warps "
                          "4g .. 4g + 4) must execute it together", v.stmt.loc)
                break


def _split_guards(v: Visit, out: Report) -> None:
    """A wgmma that only some threads of the trace may reach: the guards around it that
    split a warpgroup (an error), or that may (a warning)."""
    for cond, how in v.splits:
        what = f"{v.stmt.syntax} is under '{text(cond)}', which "  # type: ignore[attr-defined]
        rule = ("; it is warpgroup-collective: all 128 threads of whole, aligned warpgroups "
                "(warps 4g .. 4g + 4) must execute it together")
        if how == SPLIT:
            out.error(what + "differs between the threads of a warpgroup" + rule, v.stmt.loc,
                      Note("the condition is here", cond.loc))
            return
    for cond, _ in v.splits:
        out.warning(f"{v.stmt.syntax} is under '{text(cond)}', which may differ between the "  # type: ignore[attr-defined]
                    "threads of a warpgroup (it is warpgroup-collective); make the condition "
                    "the same for the 128 threads of each warpgroup (a role, %warp / 4, a "
                    "kernel parameter)", v.stmt.loc, Note("the condition is here", cond.loc))
        return


def check_wgmma_operands(facts: Facts, out: Report) -> None:
    """Each shared-memory operand lies in a buffer whose declared swizzled layout a
    descriptor can describe: K-major rows of the swizzle span, aligned to the pattern, the
    operand starting on an 8-row group and a 16-byte k offset, its rows inside the buffer."""
    layout = facts.layout
    for s in ir.walk(facts.kernel.body):
        if not isinstance(s, ir.Wgmma):
            continue
        ncols = 2 * s.d.type.n  # type: ignore[attr-defined]
        operands = [("A", s.a, 64), ("B", s.b, ncols)]
        for which, place, rows in operands:
            if not isinstance(place.type, T.SharedRef):
                continue
            name = _buffer(place)
            if name is None:
                continue
            decl = layout.decl(name)
            assert isinstance(decl, ir.SharedDecl)
            shown = name.split(".")[-1]
            if not decl.swizzle:
                out.error(undeclared_layout(which, shown), place.loc or s.loc)
                continue
            idx = _indices(place)
            row, col = idx[-2] if len(idx) >= 2 else None, idx[-1] if idx else None
            r, c = const_int(row) if row is not None else None, \
                const_int(col) if col is not None else None
            nrows = decl.shape[-2] if len(decl.shape) >= 2 else 1
            if decl.major == "mn":
                _check_mn(out, s, which, place, decl, shown, r, c, rows)
                continue
            if r is not None and r % 8:
                out.error(f"the wgmma {which} operand starts at row {r} of '{shown}'; a "
                          "descriptor addresses groups of 8 rows, so the row must be a "
                          "multiple of 8", place.loc or s.loc)
            if r is not None and decl.swizzle != 16 and len(idx) > 2:
                # rows run on across the leading dimensions ([2][128][64] holds 256 rows):
                # count from the indexed row to the end of the block that the innermost
                # constant leading indices select (a pipeline's stage index is not constant)
                lead: list[int] = []
                for i in reversed(idx[:-2]):
                    v = const_int(i)
                    if v is None:
                        break
                    lead.insert(0, v)
                dims = decl.shape[len(decl.shape) - 2 - len(lead):-2]
                flat = 0
                for v, d in zip(lead, dims, strict=True):
                    flat = flat * d + v
                r, nrows = flat * nrows + r, nrows * math.prod(dims)
            if r is not None and r + rows > nrows:
                out.error(f"the wgmma {which} operand needs {rows} rows from row {r}, but "
                          f"'{shown}' has {nrows}", place.loc or s.loc)
            kb = const_int(idx[-3]) if decl.swizzle == 16 and len(idx) >= 3 else None
            if kb is not None and kb + 2 > decl.shape[-3]:
                out.error(f"the wgmma {which} operand starts at k block {kb} of '{shown}'; a "
                          f"k-step reads 2 blocks of 16 bytes and '{shown}' has "
                          f"{decl.shape[-3]}", place.loc or s.loc)
            if c is not None and (c * decl.elem.nbytes) % 32:
                out.error(f"the wgmma {which} operand starts at k offset {c}; each k-step "
                          f"is 32 bytes, so it must be a multiple of {32 // decl.elem.nbytes}",
                          place.loc or s.loc)


def _check_mn(out: Report, s: ir.Wgmma, which: str, place: ir.Expr, decl: ir.SharedDecl,
              shown: str, k0: int | None, c: int | None, extent: int) -> None:
    """An MN-major operand `buf[..., k0, 0]`: rows step along K (8-row groups), each holds
    one block of `swizzle` bytes along M / N; wider operands span the third-last dimension."""
    loc = place.loc or s.loc
    if decl.elem.nbytes != 2:
        # PTX's wgmma has no transpose operand for tf32 and fp8: rows must run along K
        fix = (f"; store {which} K-major ([rows][k], rows of K elements: a row-major "
               f"{'M x K' if which == 'A' else 'N x K'} matrix) and declare '{shown}' "
               f"'swizzle {decl.swizzle}' without 'mn'") if decl.elem.is_fp8 else ""
        out.error(f"the wgmma {which} operand is MN-major, which PTX allows for 16-bit inputs "
                  f"only, got {decl.elem}{fix}", loc)
        return
    width = decl.swizzle // decl.elem.nbytes
    nrows = decl.shape[-2] if len(decl.shape) >= 2 else 1
    if k0 is not None and (k0 % 8 or k0 + 16 > nrows):
        out.error(f"the MN-major wgmma {which} operand starts at k row {k0} of '{shown}'; it "
                  f"reads 16 rows from a multiple of 8, and '{shown}' has {nrows}", loc)
    if c is not None and c != 0:
        out.error(f"the MN-major wgmma {which} operand must start at the beginning of a row "
                  f"(last index 0), got {c}", loc)
    blocks = decl.shape[-3] if len(decl.shape) >= 3 else 1
    if extent > width * blocks:
        out.error(f"the MN-major wgmma {which} operand spans {extent} elements along M / N, "
                  f"but '{shown}' holds {width * blocks} ({blocks} block(s) of {width}); give "
                  f"it an outer dimension of blocks ({shown}: {decl.elem}[{-(-extent // width)}]"
                  f"[{nrows}][{width}])", loc)


def _indices(place: ir.Expr) -> list[ir.Expr]:
    out: list[ir.Expr] = []
    while isinstance(place, ir.Index):
        out = list(place.indices) + out
        place = place.base
    return out
