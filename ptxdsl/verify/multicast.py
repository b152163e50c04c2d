"""Multicast coverage: what the multicast copies of all the CTAs of a cluster deliver into
each CTA, against what that CTA's threads read and what its barrier expects.

Every multicast is evaluated in every CTA of the cluster that runs it (conditions on the
cluster registers are followed): its mask gives the CTAs it lands in, its destination the
bytes of the buffer. Indices that do not depend on the CTA's place in the cluster (a
pipeline's stage, a loop variable) are the same in every CTA at the same step, so copies
whose destinations share them are compared. For each CTA of the cluster:
  - bytes delivered by two copies race with each other;
  - bytes that a thread of the CTA reads and that no copy delivers are stale;
  - the bytes that land on a barrier per phase must be the bytes it expects: a mask that
    names a CTA whose barrier does not expect them completes phases early or never.
Masks or destinations that depend on more than the cluster registers are not decided.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from .. import ir
from .. import types as T
from ..errors import Note
from .effects import effect
from .facts import Facts, Report, text
from .ranks import RankEval, holds
from .remote import root


@dataclass(frozen=True)
class _Place:
    """A view of a shared buffer in one CTA: bytes [lo, lo + nbytes) of the part that the
    indices not known from the cluster registers (`key`) select."""

    buf: str
    key: tuple[object, ...]  # None where the index is known from the rank, else the expr
    lo: int
    nbytes: int
    shown: str


@dataclass(frozen=True)
class _Copy:
    stmt: ir.Stmt
    source: int  # cluster rank of the issuing CTA
    place: _Place
    bar: str
    loop: ir.Stmt | None


def _flatten(e: ir.Expr) -> tuple[ir.SharedBuf, list[ir.Expr]] | None:
    indices: list[ir.Expr] = []
    while isinstance(e, ir.Index):
        indices = list(e.indices) + indices
        e = e.base
    return (e, indices) if isinstance(e, ir.SharedBuf) else None


def _place(e: ir.Expr, decl: ir.SharedDecl, ev: RankEval, rank: int) -> _Place | None:
    found = _flatten(e)
    if found is None or not isinstance(e.type, T.SharedRef):
        return None
    _, indices = found
    strides, acc = [], decl.elem.nbytes
    for d in reversed(decl.shape):
        strides.append(acc)
        acc *= d
    strides.reverse()
    key: list[object] = []
    lo = 0
    shown: list[str] = []
    for idx, stride in zip(indices, strides, strict=False):
        try:
            v = ev.value(idx, rank)
        except (ir.Unknown, ZeroDivisionError):
            key.append(idx)
            continue
        key.append(None)
        lo += v * stride
        shown.append(str(v))
    nbytes = decl.elem.nbytes * prod(e.type.shape)
    name = decl.name
    return _Place(name, tuple(key), lo, nbytes, f"{name}[{', '.join(shown)}]" if shown else name)


def _reads(x: object, name: str, out: list[ir.Expr], skip: object) -> None:
    """Places of buffer `name` that an expression or statement reads."""
    if isinstance(x, tuple):
        for y in x:
            _reads(y, name, out, skip)
        return
    if not isinstance(x, ir.Node) or x is skip:
        return
    if isinstance(x, ir.Load) and root(x.ref) == name:
        out.append(x.ref)
        return
    if isinstance(x, ir.Expr) and isinstance(x.type, T.SharedRef) and root(x) == name:
        out.append(x)  # a view handed to a reader (a wgmma operand, a store's source)
        return
    for f in ir.node_fields(x):
        _reads(getattr(x, f), name, out, skip)


def check_multicast_coverage(facts: Facts, out: Report) -> None:
    if not any(effect(s).multicast for s in ir.walk(facts.kernel.body)):
        return
    _check(facts, out)


def _check(facts: Facts, out: Report) -> None:
    k = facts.kernel
    n = prod(k.cluster or (1, 1, 1))
    ev = RankEval(k)
    decls = {s.name: s for s in k.body if isinstance(s, ir.SharedDecl)}
    stmts = list(ir.sites(k.body))

    def ranks(path: tuple) -> list[int]:
        return [r for r in range(n) if all(holds(ev, c, r) is not (not want) for c, want in path)]

    # (target rank, copy): every multicast, in every CTA that runs it, into every CTA it names
    into: dict[int, list[_Copy]] = {t: [] for t in range(n)}
    for s, path, loop in stmts:
        if not effect(s).multicast:
            continue
        decl = decls.get(root(s.dst) or "")  # type: ignore[attr-defined]
        if decl is None:
            return
        for r in ranks(path):
            mask = ev.over_cluster(s.mask, [r])  # type: ignore[attr-defined]
            place = _place(s.dst, decl, ev, r)  # type: ignore[attr-defined]
            if not mask or place is None:
                return  # decided only when every copy is known in every CTA
            for t in range(n):
                if mask[0][1] >> t & 1:
                    into[t].append(_Copy(s, r, place, root(s.bar) or "", loop))  # type: ignore[attr-defined]
    if _check_bytes(facts, out, stmts, ranks, into, n):
        return
    for buf in sorted({c.place.buf for cs in into.values() for c in cs}):
        _check_buffer(out, buf, decls[buf], stmts, ranks, ev, into, n)


def _check_buffer(out: Report, buf: str, decl: ir.SharedDecl, stmts, ranks, ev, into, n) -> None:
    keys = {c.place.key for cs in into.values() for c in cs if c.place.buf == buf}
    if len(keys) != 1:
        return  # copies into different stages or views: not compared
    key = keys.pop()
    free = [i for i, x in enumerate(key) if x is not None]
    if free != list(range(len(free))):
        return  # only a leading stage index is left to run time
    part = decl.elem.nbytes * prod(decl.shape[len(free):])
    # reads of the buffer: bytes of the part, per CTA (the whole part when not known)
    reads: dict[int, list[tuple[int, int, ir.Stmt]]] = {t: [] for t in range(n)}
    for s, path, _ in stmts:
        places: list[ir.Expr] = []
        _reads(s, buf, places, getattr(s, "dst", None) if effect(s).multicast else None)
        if isinstance(s, ir.Store) and root(s.ref) == buf:
            places = [p for p in places if p is not s.ref]
        for p in places:
            for t in ranks(path):
                got = _place(p, decl, ev, t)
                if got is None or any(a is None and b is not None or a is not None and b is None
                                      for a, b in zip(got.key[:len(free)], key, strict=False)):
                    reads[t].append((0, part, s))
                else:
                    reads[t].append((got.lo, got.lo + got.nbytes, s))
    for t in range(n):
        cs = sorted((c for c in into[t] if c.place.buf == buf), key=lambda c: c.place.lo)
        for a, b in zip(cs, cs[1:], strict=False):
            if b.place.lo < a.place.lo + a.place.nbytes:
                out.error(f"'{b.place.shown}' of the CTA of cluster rank {t} is delivered twice: "
                          f"by this {b.stmt.syntax} in the CTA of rank {b.source} and by the "  # type: ignore[attr-defined]
                          f"{a.stmt.syntax} of rank {a.source}; the two copies race "  # type: ignore[attr-defined]
                          "(each CTA must deliver its own part)", b.stmt.loc,
                          Note(f"the other copy into '{a.place.shown}', in the CTA of rank "
                               f"{a.source}", a.stmt.loc))
                return
        for lo, hi, s in reads[t]:
            miss = _uncovered(lo, hi, cs)
            if miss is None or not cs:
                continue
            size = cs[0].place.nbytes
            what = _part_name(buf, decl, miss // size * size, len(free))
            sent = ", ".join(f"'{c.place.shown}' from rank {c.source}" for c in cs)
            out.error(f"'{what}' is read by the CTA of cluster rank {t}, but no multicast "
                      f"delivers it there (it receives {sent}): the read sees stale data",
                      s.loc, Note("the multicast copies into it are here; check their masks "
                                  "and destinations", cs[0].stmt.loc))
            return


def _part_name(buf: str, decl: ir.SharedDecl, off: int, lead: int) -> str:
    """`buf[i, ...]` naming the part that starts `off` bytes into a stage."""
    dims = decl.shape[lead:]
    idx = []
    stride = decl.elem.nbytes * prod(dims)
    for d in dims:
        stride //= d
        idx.append(off // stride)
        off %= stride
        if not off:
            break
    return f"{buf}[{', '.join(map(str, idx))}]"


def _uncovered(lo: int, hi: int, copies: list[_Copy]) -> int | None:
    """The first byte of [lo, hi) that no copy covers."""
    at = lo
    for c in copies:
        a, b = c.place.lo, c.place.lo + c.place.nbytes
        if a > at:
            break
        at = max(at, b)
        if at >= hi:
            return None
    return at if at < hi else None


def _check_bytes(facts: Facts, out: Report, stmts, ranks, into, n) -> bool:
    """The bytes that land on each barrier of each CTA per phase against those it expects
    (constant expect_tx counts, in the loop of the copies); True if a problem is reported."""
    threads: dict[int, int] = {}
    for v in facts.trace.visits:
        if effect(v.stmt).expect and v.counted:
            threads[id(v.stmt)] = int(v.may.sum())
    for bar in sorted({c.bar for cs in into.values() for c in cs}):
        loops = {c.loop for cs in into.values() for c in cs if c.bar == bar}
        expects = [(s, path, loop) for s, path, loop in stmts
                   if (effect(s).expect or effect(s).loads_global) and root(s.bar) == bar]
        if len(loops) != 1 or any(isinstance(s.bar, ir.Peer) for s, _, _ in expects) or \
                any(loop not in loops for _, _, loop in expects):
            continue
        for t in range(n):
            want, site = 0, None
            got = sum(c.place.nbytes for c in into[t] if c.bar == bar)
            for s, path, _ in expects:
                if t not in ranks(path):
                    continue
                if effect(s).loads_global:
                    nb = getattr(s, "nbytes", None)  # a tensor copy moves its whole view
                    if not isinstance(s.dst.type, T.SharedRef) or \
                            nb is not None and not isinstance(nb, ir.Const):
                        return False
                    got += int(nb.value) if isinstance(nb, ir.Const) else \
                        s.dst.type.elem.nbytes * prod(s.dst.type.shape)
                    continue
                if not isinstance(s.nbytes, ir.Const) or id(s) not in threads:
                    return False
                want += int(s.nbytes.value) * threads[id(s)]
                site = s
            if site is None or want == got:
                continue
            mine = [c for c in into[t] if c.bar == bar]
            if got > want:
                c = mine[-1]
                out.error(f"the mask of this {c.stmt.syntax} (in the CTA of cluster rank "  # type: ignore[attr-defined]
                          f"{c.source}) names rank {t}, whose '{bar}' expects {want} bytes per "
                          f"phase but receives {got}: the phase completes before every copy "
                          "has landed, or the copies overflow the next phase", c.stmt.loc,
                          Note(f"rank {t} sets the bytes '{bar}' expects here", site.loc))
            else:
                note = Note(f"the multicast copies that land there are here ({got} bytes)",
                            mine[0].stmt.loc) if mine else Note("no multicast names it", None)
                out.error(f"'{text(site.bar)}' of the CTA of cluster rank {t} expects {want} "  # type: ignore[attr-defined]
                          f"bytes per phase, but the copies of the cluster deliver {got} "
                          "there: its waiters hang", site.loc, note)
            return True
    return False
