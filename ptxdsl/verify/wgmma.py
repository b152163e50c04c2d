"""Tensor-core rules: wgmma's asynchronous register and shared-memory hazards, who issues
it, its operands against the buffers' declared layouts, and the register budget.

The hazard check is a flow-sensitive walk of the lowered body (loops until a fixed point,
both arms of a branch joined): it tracks register arrays written since the last
`wgmma_fence`, and the wgmmas not yet completed by a `wgmma_wait` (uncommitted, then by
commit group) with the buffers they read. It reports
  - a wgmma whose accumulator (or A fragment) was written after the last wgmma_fence, or
    that no wgmma_fence precedes;
  - a read or write of an accumulator while a wgmma that writes it may be in flight;
  - a pipeline stage released to its producer while a wgmma reading that stage may be in
    flight (the producer would overwrite the tile under it). A consumer whose release lags
    holds several stages and releases the oldest: the walk counts the stages held (waits on
    the pipeline's full barriers less releases) and, for each pending wgmma, how many waits
    have passed since it was issued, so a wgmma that read a younger stage than the one
    released may stay in flight (`wgmma_wait(1)` before a lagging release).
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
from .facts import Facts, Report

WGMMA_OPS = (ir.Wgmma, ir.WgmmaFence, ir.WgmmaCommit, ir.WgmmaWait)
_NEVER = ""  # the pseudo-array "no wgmma_fence yet"
_MAX_GROUPS = 8
_MAX_AGE = 8  # waits counted since a wgmma was issued; more are as good as this many
_RESERVED_REGS = 8  # addresses, loop counters and predicates beside the register arrays


@dataclass(frozen=True)
class _Op:
    acc: str
    bufs: frozenset[str]
    loc: Span | None = field(compare=False)
    a_regs: str = ""  # an A fragment in registers, read asynchronously too
    # per pipeline it reads: the waits on that pipeline since it was issued (0: it reads the
    # stage waited last)
    ages: tuple[tuple[str, int], ...] = ()


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


class _Hazards:
    def __init__(self, out: Report):
        self.out = out

    def block(self, stmts: tuple[ir.Stmt, ...], st: _State) -> _State:
        for s in stmts:
            st = self.stmt(s, st)
        return st

    def stmt(self, s: ir.Stmt, st: _State) -> _State:
        if (pipe := _released(s)) is not None:
            return self.release(s, pipe, st)
        if isinstance(s, ir.If):
            self.reads(s.cond, st)
            return _join(self.block(s.then, st), self.block(s.orelse, st))
        if isinstance(s, (ir.For, ir.While)):
            if isinstance(s, ir.For):
                for e in (s.start, s.stop, s.step):
                    self.reads(e, st)
            cur = st
            for _ in range(6):  # the lattice is finite; a few passes reach its fixed point
                if isinstance(s, ir.While):
                    self.reads(s.cond, cur)
                nxt = _join(cur, self.block(s.body, cur))
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
        for e in _exprs(s):
            self.reads(e, st)
        written = _written(s)
        if written is not None:
            self.touch(written, s.loc, st, "written")
            return dataclasses.replace(st, dirty=st.dirty | {(written, s.loc)})
        return st

    def wgmma(self, s: ir.Wgmma, st: _State) -> _State:
        names = [s.d.name]  # type: ignore[attr-defined]
        if isinstance(s.a.type, T.RegArray):
            names.append(s.a.name)  # type: ignore[attr-defined]
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
        ages = tuple(sorted({(b.split(".")[0], 0) for b in bufs if "." in b}))
        op = _Op(names[0], bufs, s.loc, names[1] if len(names) > 1 else "", ages)
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

    def release(self, s: ir.Stmt, pipe: str, st: _State) -> _State:
        """The release of the oldest stage held: a wgmma issued before the wait on a younger
        stage (age >= the stages held - 1) read it."""
        held = dict(st.held)
        n = held.get(pipe, 0)
        for op in sorted(st.pending(), key=lambda o: o.loc.start if o.loc else 0):
            if dict(op.ages).get(pipe, -1) >= n - 1:
                lag = f"wgmma_wait({n - 1}) before release" if n > 1 else \
                    "wgmma_wait(0) before release"
                self.out.error(f"release({pipe}) hands the stage back to the producer while a "
                               f"wgmma reading it may still be in flight; {lag}", s.loc,
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
    loop of arrives on the peers' empty barriers that a cluster pipeline releases with."""
    if isinstance(s, ir.MBarrierArrive):
        return _pipe_of(s.bar, ".empty")
    if isinstance(s, ir.For):
        arrives = [x for x in ir.walk(s.body) if isinstance(x, ir.MBarrierArrive)]
        pipes = {_pipe_of(x.bar, ".empty") for x in arrives}
        if arrives and len(pipes) == 1 and all(isinstance(x.bar, ir.Peer) for x in arrives):
            return pipes.pop()
    return None


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
    return any(isinstance(s, WGMMA_OPS) for s in ir.walk(k.body))


def check_wgmma_hazards(facts: Facts, out: Report) -> None:
    k = facts.kernel
    if not _uses_wgmma(k):
        return
    start = _State(frozenset({(_NEVER, k.loc)}), frozenset(), ())
    _Hazards(out).block(k.body, start)


def check_wgmma_issuers(facts: Facts, out: Report) -> None:
    """wgmma and its fences are `.sync.aligned` over a warpgroup: every thread of whole,
    aligned warpgroups (warps 4g .. 4g + 4) executes them, or none."""
    if not _uses_wgmma(facts.kernel):
        return
    n = facts.n
    for v in facts.trace.visits:
        if not isinstance(v.stmt, WGMMA_OPS) or not v.certain or not v.may.any():
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
                out.error(f"the wgmma {which} operand is in buffer '{shown}', which declares no "
                          f"swizzle; declare its layout ('swizzle 128' with rows of 128 bytes, "
                          "or 64 / 32, or 16 for the unswizzled core-matrix layout) so that TMA "
                          "and the descriptor agree", place.loc or s.loc)
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


def check_register_arrays(facts: Facts, out: Report) -> None:
    """The register arrays a thread declares fit the budget of its role (setmaxnreg) or of
    the kernel (maxnreg, else 255)."""
    k = facts.kernel
    base = k.maxnreg or 255
    _budget(k.body, base, out)


def _budget(stmts: tuple[ir.Stmt, ...], budget: int, out: Report) -> int:
    used = 0
    for s in stmts:
        if isinstance(s, ir.SetMaxNReg):
            budget = s.regs
        elif isinstance(s, ir.Let) and isinstance(s.var_type, T.RegArray):
            used += s.var_type.n * (2 if s.var_type.elem.nbytes == 8 else 1)
            if used + _RESERVED_REGS > budget:
                out.error(f"register array '{s.name}' brings this thread's register arrays to "
                          f"{used} registers, more than its budget of {budget} allows (keep "
                          f"{_RESERVED_REGS} for addresses and counters); raise the role's "
                          "regs or shrink the tile", s.loc)
        elif isinstance(s, ir.If):
            used += max(_budget(s.then, budget, out), _budget(s.orelse, budget, out))
        elif isinstance(s, (ir.For, ir.While)):
            used += _budget(s.body, budget, out)
    return used
