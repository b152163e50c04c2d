"""Lowering for Ampere (`--arch sm_80`): the Hopper forms of a lowered kernel become cp.async.

Runs after `ptxdsl.lower.pipelines` (pipelines and roles are already mbarriers and
branches) and after the verifier has checked the Hopper form, so every byte count and arrival
count it relies on is known to be right (the pass list: `Target.passes`). What changes:

- A 1D bulk load becomes 16-byte `cp.async.cg` copies spread over the lanes of the issuing
  warp, then one `cp.async.mbarrier.arrive.noinc` per lane on the copy's barrier. A block run
  by one thread of a fully active warp (`if elect()`, or a condition such as `tid == 0` that
  selects one thread) is widened to its warp: the copies and stores run on every lane, the
  rest of the block's side effects stay on the one thread (guarded by the same condition).
  Elsewhere the issuing thread copies the chunks alone.
- A tensor-tile load becomes cp.async over the box; the tensor-map parameter then carries a
  tensor descriptor (base, shape, strides, swizzle; see `ops.sm80`) that the runtime and
  the interpreter build from the same arguments. Out-of-bounds elements are zero-filled
  (`src_bytes`), and the map's swizzle permutes the 16-byte chunks of the box as TMA does.
- Bulk and tensor stores become vector loads from shared memory and vector stores to global
  memory by the lanes; bulk groups, proxy fences, `fence.mbarrier_init` and `setmaxnreg`
  vanish; mbarrier waits become `test_wait` loops; `arrive_expect_tx` becomes a plain arrive.
- Each barrier that copies complete on gets its arrival count re-derived: the arrivals it
  had plus one per lane per copy of a phase (the phase's bytes / the bytes of one copy).

What has no sm_80 form (clusters beyond one CTA, multicast, TMA reduce, wgmma, any other
Hopper-only operation) is a located error naming the operation and the architecture.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from math import prod

from .. import ir
from .. import types as T
from ..errors import DiagnosticBag, Note, Span
from ..opdef import const_int, defined
from ..target import Target
from .threads import ThreadModel

U32, S32, U64 = T.u32, T.s32, T.u64
CHUNK = 16
UNROLL_LIMIT = 32  # chunks per lane; unrolled, ptxas folds the index arithmetic
FULL = -1
TILE_UNROLL = 8  # tensor tiles: blocks of 8 chunks (their index arithmetic compiles slowly)

# What sm_80 does with each operation is its OpDef's `sm80`; of the plain statements every
# target has, these side effects stay on the one thread of a block widened to its warp
_CORE = (ir.SharedDecl, ir.BarrierDecl, ir.Let, ir.Assign, ir.SetElem, ir.Store, ir.Return,
         ir.Asm)
_CORE_ONE_THREAD = (ir.Store, ir.Asm)


def _on_sm80(s: ir.Stmt) -> str:
    """What sm_80 does with `s`: its operation's `sm80`, "" for any other statement."""
    d = defined(s)
    return "" if d is None else d.sm80


def _c(v: int, t: T.Scalar = U32) -> ir.Const:
    return ir.Const(value=v, type=t)


def _b(op: str, a: ir.Expr, b: ir.Expr, t: T.Type | None = None) -> ir.Expr:
    return ir.Binary(op=op, a=a, b=b, type=t or a.type)


def _cmp(op: str, a: ir.Expr, b: ir.Expr) -> ir.Expr:
    return ir.Compare(op=op, a=a, b=b, type=T.pred)


def _cast(e: ir.Expr, t: T.Scalar) -> ir.Expr:
    return e if e.type == t else ir.Cast(x=e, type=t)


def _sel(c: ir.Expr, a: ir.Expr, b: ir.Expr) -> ir.Expr:
    return ir.Select(cond=c, a=a, b=b, type=a.type)


def _own_exprs(s: ir.Stmt) -> Iterator[ir.Expr]:
    """Every expression in the statement's own operands (not in nested bodies)."""
    stack: list[object] = [getattr(s, f) for f in s.__dataclass_fields__ if f != "loc"]
    while stack:
        x = stack.pop()
        if isinstance(x, ir.Expr):
            yield x
            stack.extend(getattr(x, f) for f in x.__dataclass_fields__ if f != "loc")
        elif isinstance(x, tuple):
            stack.extend(x)


def _atomic_in(s: ir.Stmt) -> ir.Atomic | None:
    return next((x for x in _own_exprs(s) if isinstance(x, ir.Atomic)), None)


def _elect() -> ir.Expr:
    return ir.Call(fn="elect", args=(), type=T.pred)


_BITS = {1: T.u8, 2: T.u16, 4: T.u32, 8: T.u64}
WORDS = T.Vector(U32, 4)  # a 16-byte chunk moved bit for bit (no float canonicalising)


def _operands(s: ir.Stmt) -> list[ir.Expr]:
    """The expressions a statement names directly, and their sub-places (not nested bodies)."""
    out: list[ir.Expr] = []
    todo = [getattr(s, f.name) for f in dataclasses.fields(s)
            if f.name not in ("then", "orelse", "body", "loc")]
    while todo:
        e = todo.pop()
        if isinstance(e, tuple):
            todo.extend(e)
        elif isinstance(e, ir.Expr):
            out.append(e)
            todo.extend(getattr(e, f.name) for f in dataclasses.fields(e)
                        if f.name not in ("type", "loc"))
    return out


def _bar_name(bar: ir.Expr) -> str:
    while isinstance(bar, ir.Index):
        bar = bar.base
    return bar.name  # type: ignore[attr-defined]


def _contains_copy(stmts: tuple[ir.Stmt, ...]) -> bool:
    return any(_on_sm80(s) == "copy" for s in ir.walk(stmts))


def _multi_index(flat: ir.Expr, shape: tuple[int, ...]) -> tuple[ir.Expr, ...]:
    """Indices (outermost first) of element `flat` of a row-major view of `shape`."""
    out: list[ir.Expr] = []
    rest = flat
    for i, d in enumerate(reversed(shape)):
        if i == len(shape) - 1:
            out.append(rest)
        else:
            out.append(_b("rem", rest, _c(d)))
            rest = _b("div", rest, _c(d))
    return tuple(reversed(out))


def _view_place(view: ir.Expr, flat: ir.Expr) -> ir.Expr:
    """The element `flat` (row-major) of a shared-memory view, as a place."""
    st = view.type
    assert isinstance(st, T.SharedRef)
    if not st.shape:
        return view
    return ir.Index(base=view, indices=_multi_index(flat, st.shape),
                    type=T.SharedRef(st.elem, ()))


@dataclass
class _Widen:
    """A block widened to its warp: `guard` selects the thread that ran it before."""

    guard: ir.Expr | None  # None: elect() (a fresh call at each use)

    def cond(self) -> ir.Expr:
        return self.guard if self.guard is not None else _elect()


@dataclass
class _BarFacts:
    copies: list[tuple[int, int, Span | None]] = field(default_factory=list)  # bytes, lanes
    # (bytes armed, threads arming per phase or None, whether it also arrives, where)
    expects: list[tuple[int | None, int | None, bool, Span | None]] = field(
        default_factory=list)
    arrives: list[Span | None] = field(default_factory=list)


class _Sm80:
    def __init__(self, k: ir.Kernel, diags: DiagnosticBag, target: Target):
        self.k, self.diags = k, diags
        self.arch = target.name  # named in messages
        # a kernel in clusters of several CTAs on a target without them: refused once, at
        # the kernel, and not again at what its clusters made
        self.clustered = not target.clusters and k.cluster is not None and prod(k.cluster) > 1
        self.model = ThreadModel(k.threads)
        assigned = {s.name for s in ir.walk(k.body) if isinstance(s, ir.Assign)}
        for s in ir.walk(k.body):
            if isinstance(s, ir.Let) and s.value is not None and s.name not in assigned:
                self.model.env[s.name] = s.value
        self.bars: dict[str, _BarFacts] = {}
        self.descs: dict[str, ir.Expr] = {}
        self.names = 0
        self.unlocated = False  # an error was reported for a statement without a place

    def error(self, what: str, loc: Span | None, *notes: Note) -> None:
        if loc is None:  # a statement the compiler added: say it at the kernel, once
            if self.clustered or self.unlocated:
                return  # what made it was reported (a cluster), or this was
            self.unlocated, loc = True, self.k.loc
        self.diags.error(f"{what} has no {self.arch} form (it needs sm_90 / Hopper); "
                         "compile this kernel for sm_90a", loc, *notes)

    def fresh(self, stem: str) -> str:
        self.names += 1
        return f"sm80.{stem}{self.names}"

    def facts(self, bar: ir.Expr) -> _BarFacts:
        return self.bars.setdefault(_bar_name(bar), _BarFacts())

    # ------------------------------------------------------------------ kernel

    def run(self) -> ir.Kernel:
        k = self.k
        if self.clustered:
            self.error(f"a cluster of {prod(k.cluster or ())} CTAs (kernel '{k.name}')", k.loc)
        body = self.block(k.body, [], None)
        descs = tuple(ir.TensorDescFields(tmap=t, prefix=f"{name}.desc", loc=t.loc)
                      for name, t in self.descs.items())
        body = self.recount(body)
        return dataclasses.replace(k, body=descs + body)

    def recount(self, body: tuple[ir.Stmt, ...]) -> tuple[ir.Stmt, ...]:
        """Barrier counts with one arrival per lane per copy of a phase added."""
        decls = {s.name: s for s in body if isinstance(s, ir.BarrierDecl)}
        counts: dict[str, int] = {}
        for name, f in self.bars.items():
            if not f.copies or name not in decls:
                continue
            d = decls[name]
            where = Note(f"'{name}' is declared here with count {d.count}", d.loc)
            sizes = {(b, n) for b, n, _ in f.copies}
            expects = {e for e, _, _, _ in f.expects}
            armers = {n for _, n, _, _ in f.expects}
            if len(armers) == 1 and None not in armers:
                per_phase = armers.pop()
            elif not f.arrives and all(a for _, _, a, _ in f.expects):
                per_phase = d.count  # every arrival of a phase arms it
            else:
                per_phase = None
            if len(sizes) != 1 or len(expects) != 1 or None in expects or per_phase is None:
                loc = f.copies[0][2]
                self.diags.error(f"cannot re-derive the arrival count of mbarrier '{name}' for "
                                 f"{self.arch}: its copies must all move the same bytes from the "
                                 "same number of lanes, armed by expect_tx of one constant byte "
                                 "count from a known number of threads", loc, where)
                continue
            (nbytes, lanes), (armed,) = sizes.pop(), expects
            if armed % nbytes:  # type: ignore[operator]
                self.diags.error(f"mbarrier '{name}' is armed with {armed} bytes per arrival, "
                                 f"not a multiple of its copies' {nbytes}", f.expects[0][3], where)
                continue
            counts[name] = d.count + per_phase * (armed // nbytes) * lanes  # type: ignore[operator]
        if not counts:
            return body
        out = []
        for s in body:
            if isinstance(s, ir.BarrierDecl) and s.name in counts:
                s = dataclasses.replace(s, count=counts[s.name])
            out.append(s)
        return tuple(self.fix_inits(tuple(out), counts))

    def fix_inits(self, stmts: tuple[ir.Stmt, ...], counts: dict[str, int]) -> list[ir.Stmt]:
        out: list[ir.Stmt] = []
        for s in stmts:
            if isinstance(s, ir.MBarrierInit) and s.count is not None and \
                    _bar_name(s.bar) in counts:
                s = dataclasses.replace(s, count=_c(counts[_bar_name(s.bar)]))
            else:
                s = ir.with_blocks(s, lambda b: tuple(self.fix_inits(b, counts)))
            out.append(s)
        return out

    # ------------------------------------------------------------------ statements

    def block(self, stmts: tuple[ir.Stmt, ...], path: list, widen: _Widen | None
              ) -> tuple[ir.Stmt, ...]:
        out: list[ir.Stmt] = []
        for s in stmts:
            out += self.stmt(s, path, widen)
        return tuple(out)

    def stmt(self, s: ir.Stmt, path: list, widen: _Widen | None) -> list[ir.Stmt]:
        self.check_sregs(s)
        if widen is not None and (atom := _atomic_in(s)) is not None:
            self.diags.error(f"{atom.syntax} in a block that {self.arch} runs on the whole warp "
                             "(to issue its copies) would run on every lane; move it out of the "
                             "block", atom.loc or s.loc)
            return []
        if any(isinstance(e, ir.Peer) for e in _operands(s)):
            self.error("peer() (another CTA's shared memory)", s.loc)
            return []
        if isinstance(s, ir.If):
            return self.branch(s, path, widen)
        if isinstance(s, (ir.For, ir.While)):
            return [dataclasses.replace(s, body=self.block(s.body, path, widen))]
        if isinstance(s, (ir.BulkLoad, ir.TensorLoad)):
            return self.load(s, widen)
        if isinstance(s, ir.BulkStore):
            return self.bulk_store(s, widen)
        if isinstance(s, ir.TensorStore):
            return self.tensor_store(s, widen)
        if isinstance(s, (ir.MBarrierArriveExpectTx, ir.MBarrierExpectTx)):
            arrive = isinstance(s, ir.MBarrierArriveExpectTx)
            self.facts(s.bar).expects.append((const_int(s.nbytes), self.site_threads(path, widen),
                                              arrive, s.loc))
            if not arrive:
                return []  # cp.async arrive-ons carry the bytes: nothing to expect
            return self.guarded(ir.MBarrierArrive(bar=s.bar, loc=s.loc), widen)
        if isinstance(s, ir.MBarrierWait):
            return [ir.MBarrierTestWait(bar=s.bar, parity=s.parity, role=s.role, loc=s.loc)]
        if isinstance(s, ir.MBarrierArrive):
            self.facts(s.bar).arrives.append(s.loc)
            if s.count is not None:
                self.error("mbarrier_arrive with a count", s.loc)
            return self.guarded(s, widen)
        how = _on_sm80(s)
        if how == "drop" or isinstance(s, ir.SetMaxNReg):  # no register reallocation either
            return []
        if isinstance(s, ir.Op) and how not in ("keep", "keep_one"):
            self.error(f"'{s.syntax or type(s).__name__}'", s.loc)
            return []
        if isinstance(s, ir.CpAsyncArriveNoinc):
            self.facts(s.bar).arrives.append(s.loc)
        if not isinstance(s, (ir.Op, *_CORE)):
            self.error(f"'{type(s).__name__}'", s.loc)
            return []
        if how == "keep_one" or isinstance(s, _CORE_ONE_THREAD):
            return self.guarded(s, widen)
        return [s]

    def check_sregs(self, s: ir.Stmt) -> None:
        """Cluster special registers exist from sm_90 on."""
        for x in _own_exprs(s):
            if isinstance(x, ir.SReg) and "cluster" in x.name:
                self.error(f"'%{x.name}'", x.loc or s.loc)

    def site_threads(self, path: list, widen: _Widen | None) -> int | None:
        """How many threads run a one-thread statement here (a widened block: one a warp)."""
        try:
            act = self.model.active(path)
        except (ir.Unknown, KeyError, ZeroDivisionError, TypeError):
            return None
        return len({t // 32 for t in act}) if widen is not None else len(act)

    def guarded(self, s: ir.Stmt, widen: _Widen | None) -> list[ir.Stmt]:
        if widen is None:
            return [s]
        return [ir.If(cond=widen.cond(), then=(s,), orelse=(), loc=s.loc)]

    def branch(self, s: ir.If, path: list, widen: _Widen | None) -> list[ir.Stmt]:
        if not s.orelse and _contains_copy(s.then):
            plan = self.widening(s, path)
            if plan is not None:
                cond, guard = plan
                inner = path + ([(cond, True)] if cond is not None else [])
                body = self.block(s.then, inner, _Widen(guard))
                if cond is None:
                    return list(body)
                return [ir.If(cond=cond, then=body, orelse=(), loc=s.loc)]
        then = self.block(s.then, path + [(s.cond, True)], widen)
        orelse = self.block(s.orelse, path + [(s.cond, False)], widen)
        return [dataclasses.replace(s, then=then, orelse=orelse)]

    def widening(self, s: ir.If, path: list) -> tuple[ir.Expr | None, ir.Expr | None] | None:
        """(new condition, guard) that widen `s` to its warp, or None when it cannot be."""
        try:
            outer = self.model.active(path)
            inner = self.model.active(path + [(s.cond, True)])
        except (ir.Unknown, KeyError, ZeroDivisionError, TypeError):
            return None
        warps = {t // 32 for t in inner}
        if not inner or len(inner) != len(warps) or \
                not all(w * 32 + i in outer for w in warps for i in range(32)):
            return None  # not one thread of each of some fully active warps
        if isinstance(s.cond, ir.Call) and s.cond.fn == "elect" and \
                {t // 32 for t in outer} == warps:
            return None, None  # every lane that reaches the `if elect()` runs the block
        if len(warps) != 1:
            return None
        w = next(iter(warps))
        return _cmp("eq", ir.SReg(name="warp", type=U32), _c(w)), s.cond

    # ------------------------------------------------------------------ copies

    def lanes(self, widen: _Widen | None) -> tuple[int, ir.Expr]:
        if widen is None:
            return 1, _c(0)
        return 32, ir.SReg(name="laneid", type=U32)

    def chunk_loop(self, nchunks: int, widen: _Widen | None, body_of, loc: Span | None,
                   unroll: int) -> list[ir.Stmt]:
        """for each 16-byte chunk c of this lane: body_of(c). `unroll`: FULL unrolls up to
        UNROLL_LIMIT chunks a lane, k > 1 unrolls blocks of k inside a loop, 0 not at all."""
        lanes, lane = self.lanes(widen)
        per = -(-nchunks // lanes)
        var = self.fresh("i")
        it: ir.Expr = ir.Var(name=var, type=U32)
        block = unroll if unroll > 1 and per % unroll == 0 and per > unroll else 1
        if block > 1:
            inner = self.fresh("u")
            it = _b("add", _b("mul", it, _c(block)), ir.Var(name=inner, type=U32))
        c = _b("add", _b("mul", it, _c(lanes)), lane) if lanes > 1 else it
        body = tuple(body_of(c))
        if nchunks % lanes:
            body = (ir.If(cond=_cmp("lt", c, _c(nchunks)), then=body, orelse=(), loc=loc),)
        if block > 1:
            body = (ir.For(var=inner, var_type=U32, start=_c(0), stop=_c(block), step=_c(1),
                           body=body, unroll=True, loc=loc),)
            per //= block
        full = unroll == FULL and per <= UNROLL_LIMIT
        return [ir.For(var=var, var_type=U32, start=_c(0), stop=_c(per), step=_c(1), body=body,
                       unroll=full, loc=loc)]

    def lanes_done(self, widen: _Widen | None, loc: Span | None) -> list[ir.Stmt]:
        """After the lanes of a widened block read a store's source out of shared memory:
        a warp synchronisation (elect(), whose bar.warp.sync orders every lane's accesses
        before what the block's one thread does next), so that its release (the stage handed
        back, a flag) covers the other lanes' reads and writes too. (A block selected by
        elect() re-elects its thread with that synchronisation already.)"""
        if widen is None or widen.guard is None:
            return []
        return [ir.Let(name=self.fresh("synced"), var_type=T.pred, value=_elect(), loc=loc)]

    def load(self, s: ir.BulkLoad | ir.TensorLoad, widen: _Widen | None) -> list[ir.Stmt]:
        dst = s.dst
        st = dst.type
        assert isinstance(st, T.SharedRef)
        esize = st.elem.nbytes
        if CHUNK % esize:
            self.diags.error(f"{s.syntax} into {st.elem} elements cannot be split into 16-byte "
                             f"cp.async for {self.arch}", s.loc)
            return []
        if isinstance(s, ir.BulkLoad):
            nbytes = const_int(s.nbytes)
            if nbytes is None:
                self.diags.error(f"bulk_load needs a constant byte count to be lowered to "
                                 f"cp.async for {self.arch}", s.loc)
                return []
            stmts = self.chunk_loop(nbytes // CHUNK, widen, lambda c: self.bulk_chunk(s, c),
                                    s.loc, FULL)
        else:
            tile = self.tile(s, s.tmap, s.coords, st)
            if tile is None:
                return []
            nbytes = st.nbytes
            stmts = self.chunk_loop(nbytes // CHUNK, widen,
                                    lambda c: [self.tile_load_chunk(s, tile, c)], s.loc,
                                    TILE_UNROLL)
        lanes, _ = self.lanes(widen)
        self.facts(s.bar).copies.append((nbytes, lanes, s.loc))
        return stmts + [ir.CpAsyncArriveNoinc(bar=s.bar, loc=s.loc)]

    def bulk_chunk(self, s: ir.BulkLoad, c: ir.Expr) -> list[ir.Stmt]:
        st = s.dst.type
        q = CHUNK // st.elem.nbytes  # type: ignore[attr-defined]
        dst = _view_place(s.dst, _b("mul", c, _c(q)))
        return [ir.CpAsyncCg(dst=dst, src=self.global_chunk(s.src, c), nbytes=_c(CHUNK),
                             loc=s.loc)]

    def global_chunk(self, ref: ir.Expr, c: ir.Expr) -> ir.Expr:
        """`ptr[i]` moved on by 16-byte chunk `c`."""
        assert isinstance(ref, ir.Index)
        gt = ref.type
        assert isinstance(gt, T.GlobalRef)
        i = ref.indices[0]
        step = _b("mul", c, _c(CHUNK // gt.elem.nbytes))
        if isinstance(i.type, T.Scalar) and i.type != U32:
            step = _cast(step, i.type)
        return dataclasses.replace(ref, indices=(_b("add", i, step),))

    def bulk_store(self, s: ir.BulkStore, widen: _Widen | None) -> list[ir.Stmt]:
        st = s.src.type
        nbytes = const_int(s.nbytes)
        assert isinstance(st, T.SharedRef)
        vt = WORDS
        if nbytes is None or CHUNK % st.elem.nbytes:
            self.diags.error(f"bulk_store of {st.elem} needs a constant byte count and 16-byte "
                             f"vectors of its elements to be lowered for {self.arch}", s.loc)
            return []

        def chunk(c: ir.Expr) -> list[ir.Stmt]:
            src = _view_place(s.src, _b("mul", c, _c(CHUNK // st.elem.nbytes)))
            return [ir.Store(ref=self.global_chunk(s.dst, c), value=ir.Load(ref=src, type=vt),
                             loc=s.loc)]

        return self.chunk_loop(nbytes // CHUNK, widen, chunk, s.loc, FULL) + \
            self.lanes_done(widen, s.loc)

    # ------------------------------------------------------------------ tensor tiles

    def tile(self, s: ir.Op, tmap: ir.Expr, coords: tuple[ir.Expr, ...], st: T.SharedRef
             ) -> dict | None:
        tm = tmap.type
        assert isinstance(tm, T.TensorMap)
        box = st.shape
        if not isinstance(tmap, ir.Var) or len(box) != tm.rank:
            self.diags.error(f"{s.syntax} on {self.arch} copies a box of the shared operand's "
                             f"shape: it needs a shared view of rank {tm.rank} (got {len(box)}) "
                             "and a tensor-map parameter", s.loc)
            return None
        esize = st.elem.nbytes
        if (box[-1] * esize) % CHUNK:
            self.diags.error(f"{s.syntax} on {self.arch}: the inner box dimension "
                             f"({box[-1]} x {esize} bytes) is not a multiple of 16 bytes", s.loc)
            return None
        name = tmap.name
        self.descs.setdefault(name, tmap)
        p = f"{name}.desc"
        v = lambda n, t: ir.Var(name=f"{p}.{n}", type=t)  # noqa: E731
        return {"box": box, "q": CHUNK // esize, "esize": esize, "coords": coords,
                "base": ir.Var(name=f"{p}.base", type=T.Ptr(tm.elem)),
                "dims": [v(f"dim{i}", U32) for i in range(tm.rank)],
                "strides": [v(f"stride{i}", U64) for i in range(tm.rank)],
                "swizzle": v("swizzle", U32), "elem": tm.elem}

    def tile_chunk(self, tile: dict, c: ir.Expr):
        """(shared place of chunk c with the swizzle applied, global place, in-bounds rows,
        first x, x as u32) of a box chunk."""
        box, q = tile["box"], tile["q"]
        cpr = box[-1] // q
        j, row = _b("rem", c, _c(cpr)), _b("div", c, _c(cpr))
        outer = _multi_index(row, box[:-1]) if len(box) > 1 else ()
        coords = tile["coords"]
        x = _b("add", _cast(coords[0], S32), _cast(_b("mul", j, _c(q)), S32))
        xu = _cast(x, U32)
        inb: ir.Expr | None = None
        off: ir.Expr = _cast(x, U64)
        for k in range(1, len(box)):
            y = _b("add", _cast(coords[k], S32), _cast(outer[len(box) - 1 - k], S32))
            ok = _cmp("lt", _cast(y, U32), tile["dims"][k])
            inb = ok if inb is None else _b("and", inb, ok, T.pred)
            off = _b("add", off, _b("mul", _cast(y, U64), tile["strides"][k]))
        byte = _b("mul", c, _c(CHUNK))
        swz = _b("xor", byte, _b("shl", _b("and", _b("shr", byte, _c(7)), tile["swizzle"]),
                                 _c(4)))
        return swz, off, inb, x, xu

    def tile_load_chunk(self, s: ir.TensorLoad, tile: dict, c: ir.Expr) -> ir.Stmt:
        swz, off, inb, _, xu = self.tile_chunk(tile, c)
        q, esize = tile["q"], tile["esize"]
        dim0 = tile["dims"][0]
        left = _b("sub", dim0, xu)
        valid = _sel(_cmp("lt", xu, dim0),
                     _b("mul", _b("min", left, _c(q)), _c(esize)), _c(0))
        if inb is not None:
            valid = _sel(inb, valid, _c(0))
        inside = _cmp("ne", valid, _c(0))
        goff = _sel(inside, off, _c(0, U64))
        src = ir.Index(base=tile["base"], indices=(goff,), type=T.GlobalRef(tile["elem"]))
        dst = _view_place(s.dst, _b("div", swz, _c(esize)))
        return ir.CpAsyncCg(dst=dst, src=src, nbytes=_c(CHUNK), src_bytes=valid, loc=s.loc)

    def tensor_store(self, s: ir.TensorStore, widen: _Widen | None) -> list[ir.Stmt]:
        st = s.src.type
        assert isinstance(st, T.SharedRef)
        tile = self.tile(s, s.tmap, s.coords, st)
        if tile is None:
            return []
        q, esize, elem = tile["q"], tile["esize"], tile["elem"]
        vt, bits = WORDS, _BITS.get(esize)
        if bits is None:
            self.diags.error(f"tma_store of {st.elem} elements has no {self.arch} form", s.loc)
            return []

        def chunk(c: ir.Expr) -> list[ir.Stmt]:
            swz, off, inb, x, xu = self.tile_chunk(tile, c)
            first = _b("div", swz, _c(esize))
            dim0 = tile["dims"][0]
            gref = ir.Index(base=tile["base"], indices=(off,), type=T.GlobalRef(elem))
            whole = _cmp("le", _b("add", xu, _c(q)), dim0)
            nonneg = _cmp("ge", x, _c(0, S32))
            full = _b("and", whole, nonneg, T.pred)
            vec = ir.Store(ref=gref, value=ir.Load(ref=_view_place(s.src, first), type=vt),
                           loc=s.loc)
            # a ragged edge: element by element, those inside the tensor
            jv = self.fresh("j")
            j = ir.Var(name=jv, type=U32)
            xj = _b("add", xu, j)
            one = ir.Store(ref=ir.Index(base=tile["base"], indices=(_b("add", off,
                                                                       _cast(j, U64)),),
                                        type=T.GlobalRef(elem)),
                           value=ir.Load(ref=_view_place(s.src, _b("add", first, j)),
                                         type=bits), loc=s.loc)
            edge = ir.For(var=jv, var_type=U32, start=_c(0), stop=_c(q), step=_c(1),
                          body=(ir.If(cond=_cmp("lt", xj, dim0), then=(one,), orelse=()),),
                          loc=s.loc)
            inner: ir.Stmt = ir.If(cond=full, then=(vec,), orelse=(edge,), loc=s.loc)
            if inb is not None:
                inner = ir.If(cond=inb, then=(inner,), orelse=(), loc=s.loc)
            return [inner]

        return self.chunk_loop(st.nbytes // CHUNK, widen, chunk, s.loc, TILE_UNROLL) + \
            self.lanes_done(widen, s.loc)


def lower_sm80_kernel(k: ir.Kernel, diags: DiagnosticBag, target: Target) -> ir.Kernel:
    """The lowered kernel rewritten for an Ampere `target` (sm_80); whatever has no form
    there goes to `diags`."""
    return _Sm80(k, diags, target).run()
