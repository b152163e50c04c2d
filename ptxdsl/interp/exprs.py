"""IR expressions and places compiled into closures `f(thread) -> value`.

One table maps each expression class to its compiler; the scalar semantics come from
`scalar.py`. Warp-collective calls (shuffles, elect) cannot run inside a closure, because
they wait for the other lanes: the statement that contains them evaluates them first (see
`Program.prelude`) into a register slot, which the closure then reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import ir
from .. import types as T
from ..opdef import EXPR_REGISTRY
from ..swizzle import physical
from . import scalar
from .cta import Thread
from .errors import fail

if TYPE_CHECKING:
    from .mbarrier import MBarrier
    from .state import KernelCode

Fn = Callable[[Thread], Any]
MASK64 = (1 << 64) - 1
COLLECTIVES = {"elect", "shfl_xor", "shfl_down", "shfl_up", "shfl_idx"}


def compile_expr(c: KernelCode, e: ir.Expr) -> Fn:
    """A closure computing `e` for a thread."""
    f = _EXPR.get(type(e))
    return f(c, e) if f is not None else EXPR_REGISTRY[type(e)].interp(c, e)


def _const(c: KernelCode, e: ir.Const) -> Fn:
    v = scalar.normaliser(e.type)(e.value)
    return lambda th: v


def _var(c: KernelCode, e: ir.Var) -> Fn:
    slot = c.slots[e.name]
    return lambda th: th.regs[slot]


def _sreg(c: KernelCode, e: ir.SReg) -> Fn:
    if e.name in ("clock", "clock64", "globaltimer"):  # a monotonic count of scheduler steps
        mask = (1 << e.type.nbits) - 1  # type: ignore[attr-defined]
        return lambda th: th.cta.steps & mask
    name = e.name
    return lambda th: th.sregs[name]


def _unary(c: KernelCode, e: ir.Unary) -> Fn:
    f, x = scalar.unary(e.op, e.type), compile_expr(c, e.x)  # type: ignore[arg-type]
    return lambda th: f(x(th))


def _binary(c: KernelCode, e: ir.Binary) -> Fn:
    a, b = compile_expr(c, e.a), compile_expr(c, e.b)
    t = e.type
    if isinstance(t, T.Ptr):  # pointer +/- element count
        esize = t.elem.nbytes
        if e.op == "add":
            return lambda th: (a(th) + b(th) * esize) & MASK64
        return lambda th: (a(th) - b(th) * esize) & MASK64
    assert isinstance(t, T.Scalar)
    if (fast := _fast_binary(c, e, a, b)) is not None:
        return fast
    f = scalar.binary(e.op, t)
    if e.op in ("div", "rem") and t.is_int:

        def checked(th: Thread) -> Any:
            try:
                return f(a(th), b(th))
            except ZeroDivisionError:
                fail("arithmetic", f"{th.name}: integer division by zero", e)

        return checked
    return lambda th: f(a(th), b(th))


def _fast_binary(c: KernelCode, e: ir.Binary, a: Fn, b: Fn) -> Fn | None:
    """+, -, *, &, |, ^ of unsigned integers, and +, -, * of f32, without the generic
    operator's layers: the hottest expressions of every kernel (addresses, indices, loop
    arithmetic). Same results as `scalar.binary`."""
    t = e.type
    assert isinstance(t, T.Scalar)
    op = e.op
    if t.is_int and not t.is_signed and op in ("add", "sub", "mul", "and", "or", "xor"):
        m = (1 << t.nbits) - 1
        if isinstance(e.b, ir.Const):
            k = b(None)  # type: ignore[arg-type]
            if isinstance(e.a, ir.Var):
                s = c.slots[e.a.name]
                return {"add": lambda th: (th.regs[s] + k) & m,
                        "sub": lambda th: (th.regs[s] - k) & m,
                        "mul": lambda th: (th.regs[s] * k) & m,
                        "and": lambda th: th.regs[s] & k & m,
                        "or": lambda th: (th.regs[s] | k) & m,
                        "xor": lambda th: (th.regs[s] ^ k) & m}[op]
            return {"add": lambda th: (a(th) + k) & m, "sub": lambda th: (a(th) - k) & m,
                    "mul": lambda th: (a(th) * k) & m, "and": lambda th: a(th) & k & m,
                    "or": lambda th: (a(th) | k) & m, "xor": lambda th: (a(th) ^ k) & m}[op]
        return {"add": lambda th: (a(th) + b(th)) & m, "sub": lambda th: (a(th) - b(th)) & m,
                "mul": lambda th: (a(th) * b(th)) & m, "and": lambda th: a(th) & b(th) & m,
                "or": lambda th: (a(th) | b(th)) & m, "xor": lambda th: (a(th) ^ b(th)) & m}[op]
    if t == T.f32 and op in ("add", "sub", "mul"):
        r = scalar.rounder(t)
        return {"add": lambda th: r(a(th) + b(th)), "sub": lambda th: r(a(th) - b(th)),
                "mul": lambda th: r(a(th) * b(th))}[op]
    return None


def _compare(c: KernelCode, e: ir.Compare) -> Fn:
    f = scalar.compare(e.op, e.a.type)  # type: ignore[arg-type]
    a, b = compile_expr(c, e.a), compile_expr(c, e.b)
    return lambda th: f(a(th), b(th))


def _select(c: KernelCode, e: ir.Select) -> Fn:
    cond, a, b = compile_expr(c, e.cond), compile_expr(c, e.a), compile_expr(c, e.b)

    def select(th: Thread) -> Any:  # selp reads both operands
        x, y = a(th), b(th)
        return x if cond(th) else y

    return select


def _cast(c: KernelCode, e: ir.Cast) -> Fn:
    f, x = scalar.cast(e.x.type, e.type), compile_expr(c, e.x)  # type: ignore[arg-type]
    return lambda th: f(x(th))


def _call(c: KernelCode, e: ir.Call) -> Fn:
    if e.fn in COLLECTIVES:
        slot = c.hoisted[id(e)]  # computed by the statement's prelude
        return lambda th: th.regs[slot]
    f = scalar.intrinsic(e.fn, e.type)  # type: ignore[arg-type]
    args = [compile_expr(c, a) for a in e.args]
    if len(args) == 1:
        (x,) = args
        return lambda th: f(x(th))
    return lambda th: f(*(a(th) for a in args))


def _pack(c: KernelCode, e: ir.Pack) -> Fn:
    elems = [compile_expr(c, x) for x in e.elems]
    return lambda th: tuple(f(th) for f in elems)


def _extract(c: KernelCode, e: ir.Extract) -> Fn:
    v, i = compile_expr(c, e.vec), compile_expr(c, e.index)
    if isinstance(e.vec.type, T.RegArray):
        def element(th: Thread) -> Any:
            arr = v(th)
            if not isinstance(arr, list):
                arr.touched(th, e)  # an accumulator that a wgmma still owns
            return arr[i(th)]

        return element
    return lambda th: v(th)[i(th)]


def _load(c: KernelCode, e: ir.Load) -> Fn:
    t = e.type
    read, _ = scalar.codec(t)
    n = t.nbytes  # type: ignore[attr-defined]
    if isinstance(e.ref, ir.Peer):
        where, _ = peer_place(c, e.ref)

        def peer_load(th: Thread) -> Any:
            cta, o = where(th)
            if cta is th.cta:
                return th.cta.smem.read(th, o, n, read, e)
            if isinstance(t, T.Vector):
                check_aligned(th, o, n, e)
            cta.smem._check_in_flight(th, slice(o, o + n), e, "reads")
            return read(cta.smem.buf, o)

        return peer_load
    if isinstance(e.ref.type, T.SharedRef):
        off, _ = shared_place(c, e.ref)
        if not isinstance(t, T.Vector):
            return lambda th: th.cta.smem.read(th, off(th), n, read, e)

        def vload(th: Thread) -> Any:
            o = off(th)
            check_aligned(th, o, n, e)
            return th.cta.smem.read(th, o, n, read, e)

        return vload
    addr, esize = global_place(c, e.ref)

    def gload(th: Thread) -> Any:
        mv, o = th.cta.gmem.locate(th, addr(th), n, esize, e, "load", align=n)
        return read(mv, o)

    return gload


_EXPR: dict[type, Callable[[KernelCode, Any], Fn]] = {
    ir.Const: _const, ir.Var: _var, ir.SReg: _sreg, ir.Unary: _unary, ir.Binary: _binary,
    ir.Compare: _compare, ir.Select: _select, ir.Cast: _cast, ir.Call: _call, ir.Pack: _pack,
    ir.Extract: _extract, ir.Load: _load,
}  # fmt: skip


def subexprs(e: ir.Expr) -> list[ir.Expr]:
    """The direct operand expressions of `e`."""
    out: list[ir.Expr] = []
    for name in e.__dataclass_fields__:
        v = getattr(e, name)
        if isinstance(v, ir.Expr):
            out.append(v)
        elif isinstance(v, tuple):
            out.extend(x for x in v if isinstance(x, ir.Expr))
    return out


# ----------------------------------------------------------------------------- places


def check_aligned(th: Thread, off: int, n: int, node: Any) -> None:
    if off % n:
        fail("alignment", f"{th.name}: a {n}-byte vector access at shared-memory byte {off} "
             f"({th.cta.smem.where(off)}) is not {n}-byte aligned", node)


def shared_place(c: KernelCode, ref: ir.Expr, logical: bool = False) -> tuple[Fn, int]:
    """(byte offset of a shared place or view, bytes of the view); indices are
    bounds-checked against the declared shape. An element of a swizzled buffer is at its
    swizzled offset, unless `logical` (wgmma descriptors take the logical address)."""
    node, indices = ref, list[ir.Expr]()
    while isinstance(ref, ir.Index):
        indices = list(ref.indices) + indices
        ref = ref.base
    assert isinstance(ref, ir.SharedBuf), ref
    decl = c.decls[ref.name]
    assert isinstance(decl, ir.SharedDecl)
    strides, acc = [], decl.elem.nbytes
    for d in reversed(decl.shape):
        strides.append(acc)
        acc *= d
    strides.reverse()
    base = c.layout.offset(ref.name)
    terms = [(compile_expr(c, i), dim, stride, k)
             for k, (i, dim, stride) in enumerate(zip(indices, decl.shape, strides, strict=False))]
    view = node.type.nbytes  # type: ignore[attr-defined]
    name = ref.name

    def offset(th: Thread) -> int:
        o = base
        for f, dim, stride, k in terms:
            i = f(th)
            if not 0 <= i < dim:
                fail("bounds", f"{th.name}: index {i} is out of range for dimension {k} of "
                     f"'{name}' (size {dim})", node)
            o += i * stride
        return o

    if decl.swizzle and not logical and node.type.shape == ():  # type: ignore[attr-defined]
        swz = decl.swizzle

        def swizzled(th: Thread) -> int:
            sbase = th.cta.smem.base
            return physical(sbase + offset(th), swz) - sbase

        return swizzled, view
    return offset, view


def peer_place(c: KernelCode, ref: ir.Peer) -> tuple[Callable[[Thread], tuple[Any, int]], int]:
    """(the CTA and byte offset of a place in a peer CTA, bytes of the view)."""
    off, view = shared_place(c, ref.ref)
    rank = compile_expr(c, ref.rank)

    def where(th: Thread) -> tuple[Any, int]:
        r = rank(th)
        cl = th.cta.cluster
        if cl is None:
            if r != 0:
                fail("cluster", f"{th.name} names cluster rank {r}, but the kernel runs "
                     "clusters of one CTA", ref)
            return th.cta, off(th)
        return cl.peer(th, r, ref), off(th)

    return where, view


def global_place(c: KernelCode, ref: ir.Expr) -> tuple[Fn, int]:
    """(address of `ptr[i]`, element size)."""
    assert isinstance(ref, ir.Index) and isinstance(ref.type, T.GlobalRef), ref
    base, idx = compile_expr(c, ref.base), compile_expr(c, ref.indices[0])
    esize = ref.type.elem.nbytes
    return (lambda th: (base(th) + idx(th) * esize) & MASK64), esize


def barrier_place(c: KernelCode, e: ir.Expr) -> Callable[[Thread], MBarrier]:
    """The mbarrier object that `bar` or `bars[i]` names (`peer(bar, r)`: that of a peer)."""
    if isinstance(e, ir.Peer):
        local, rank = barrier_place(c, e.ref), compile_expr(c, e.rank)

        def remote(th: Thread) -> MBarrier:
            r, cl = rank(th), th.cta.cluster
            if cl is None:
                if r != 0:
                    fail("cluster", f"{th.name} names cluster rank {r}, but the kernel runs "
                         "clusters of one CTA", e)
                return local(th)
            p = cl.peer(th, r, e)
            mine = local(th)
            return p.barriers[mine.label.split("[")[0]][_element(mine)]

        return remote
    if isinstance(e, ir.BarrierObj):
        name = e.name
        return lambda th: th.cta.barriers[name][0]
    assert isinstance(e, ir.Index) and isinstance(e.base, ir.BarrierObj), e
    name, n = e.base.name, e.base.type.n  # type: ignore[attr-defined]
    idx = compile_expr(c, e.indices[0])

    def element(th: Thread) -> MBarrier:
        i = idx(th)
        if not 0 <= i < n:
            fail("bounds", f"{th.name}: index {i} is out of range for mbarrier array '{name}' "
                 f"of size {n}", e)
        return th.cta.barriers[name][i]

    return element


def _element(b: MBarrier) -> int:
    """The index of a barrier in its array (0 for a single barrier)."""
    label = b.label
    return int(label[label.index("[") + 1 : -1]) if "[" in label else 0
