"""IR expressions and places compiled into Python: `render` writes an expression tree as
Python source reading a thread `th`, `compile_expr` makes it a closure `f(thread) -> value`.

One table maps each expression class to its writer; the scalar semantics come from
`scalar.py` (the hottest operators written out with the same results), the registry's
expressions (atomics) run as their own closures. Warp-collective calls (shuffles, elect)
cannot run inside an expression, because they wait for the other lanes: the statement that
contains them evaluates them first (see `Program.prelude`) into a register slot, which the
expression then reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from .. import ir
from .. import types as T
from ..opdef import EXPR_REGISTRY
from ..swizzle import mask
from . import scalar
from .cta import Thread
from .errors import fail
from .memory import smem_base
from .source import Source

if TYPE_CHECKING:
    from .mbarrier import MBarrier
    from .state import KernelCode

Fn = Callable[[Thread], Any]
MASK64 = (1 << 64) - 1
COLLECTIVES = {"elect", "shfl_xor", "shfl_down", "shfl_up", "shfl_idx"}
# Python's parser takes 200 nested parentheses; a rendered node opens at most 8
MAX_NESTING = 16


def compile_expr(c: KernelCode, e: ir.Expr) -> Fn:
    """A closure computing `e` for a thread: the whole tree as one Python function."""
    src = Source()
    return src.function([f"return {render(c, src, e)}"])


def render(c: KernelCode, src: Source, e: ir.Expr) -> str:
    """Python source computing `e` for thread `th`, operands left to right as the closures
    of the IR nodes would evaluate them. Always an atom (a name, literal, call, subscript or
    parenthesised expression), so callers may combine renderings without precedence care."""
    if src.nesting >= MAX_NESTING:  # a deep subtree becomes a function of its own
        return f"{src.bind(compile_expr(c, e))}(th)"
    r = _RENDER.get(type(e))
    if r is None:
        return f"{src.bind(EXPR_REGISTRY[type(e)].interp(c, e))}(th)"
    src.nesting += 1
    try:
        return r(c, src, e)
    finally:
        src.nesting -= 1


def _const(c: KernelCode, src: Source, e: ir.Const) -> str:
    return src.literal(scalar.normaliser(e.type)(e.value))


def _var(c: KernelCode, src: Source, e: ir.Var) -> str:
    return f"{src.regs}[{c.slots[e.name]}]"


def _sreg(c: KernelCode, src: Source, e: ir.SReg) -> str:
    if e.name in ("clock", "clock64", "globaltimer"):  # a monotonic count of scheduler steps
        return f"(th.cta.steps & {(1 << e.type.nbits) - 1})"  # type: ignore[attr-defined]
    return f"th.sregs[{e.name!r}]"


def _unary(c: KernelCode, src: Source, e: ir.Unary) -> str:
    f = scalar.unary(e.op, e.type)  # type: ignore[arg-type]
    return f"{src.bind(f)}({render(c, src, e.x)})"


_OPERATOR = {"add": "+", "sub": "-", "mul": "*", "and": "&", "or": "|", "xor": "^"}


def _binary(c: KernelCode, src: Source, e: ir.Binary) -> str:
    a, b = render(c, src, e.a), render(c, src, e.b)
    t = e.type
    if isinstance(t, T.Ptr):  # pointer +/- element count
        return f"(({a} {'+' if e.op == 'add' else '-'} {b} * {t.elem.nbytes}) & {MASK64})"
    assert isinstance(t, T.Scalar)
    op = e.op
    # the hottest expressions of every kernel (addresses, indices, loop and float
    # arithmetic) written out; the same results as `scalar.binary`
    if t.is_int and op in _OPERATOR:
        return wrapped(f"({a} {_OPERATOR[op]} {b})", t)
    if t.is_float and op in ("add", "sub", "mul"):
        return f"{src.bind(scalar.rounder(t))}({a} {_OPERATOR[op]} {b})"
    node = src.bind(e)
    if op in ("div", "rem") and t.is_int and not t.is_signed:
        x, y = src.temp(), src.temp()
        return f"({x} {'//' if op == 'div' else '%'} {y} if (({x} := {a}), ({y} := {b}))[1] " \
            f"else {src.bind(_zero_division)}(th, {node}))"
    f = src.bind(scalar.binary(op, t))
    if op in ("div", "rem") and t.is_int:
        return f"{src.bind(_checked)}({f}, {a}, {b}, th, {node})"
    return f"{f}({a}, {b})"


def wrapped(x: str, t: T.Scalar) -> str:
    """`scalar.wrapper(t)` applied to the source `x`, written out."""
    m = (1 << t.nbits) - 1
    if not t.is_signed:
        return f"({x} & {m})"
    half = 1 << (t.nbits - 1)
    return f"((({x} + {half}) & {m}) - {half})"


def _checked(f: Callable[[int, int], int], a: int, b: int, th: Thread, node: ir.Expr) -> int:
    try:
        return f(a, b)
    except ZeroDivisionError:
        _zero_division(th, node)


def _zero_division(th: Thread, node: ir.Expr) -> NoReturn:
    fail("arithmetic", f"{th.name}: integer division by zero", node)


_COMPARISON = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def _compare(c: KernelCode, src: Source, e: ir.Compare) -> str:
    a, b = render(c, src, e.a), render(c, src, e.b)
    t = e.a.type
    if t.is_float and e.op == "ne":  # type: ignore[attr-defined]  # ordered: false with a NaN
        return f"{src.bind(scalar.compare(e.op, t))}({a}, {b})"  # type: ignore[arg-type]
    return f"({a} {_COMPARISON[e.op]} {b})"


def _select(c: KernelCode, src: Source, e: ir.Select) -> str:
    # selp reads both operands, then the condition
    a, b, cond = render(c, src, e.a), render(c, src, e.b), render(c, src, e.cond)
    return f"({a}, {b})[0 if {cond} else 1]"


def _cast(c: KernelCode, src: Source, e: ir.Cast) -> str:
    s, t = e.x.type, e.type
    x = render(c, src, e.x)
    if isinstance(s, T.Scalar) and isinstance(t, T.Scalar) and s.is_int and t.is_int:
        return wrapped(x, t)  # scalar.cast's zero- or sign-extension, written out
    return f"{src.bind(scalar.cast(s, t))}({x})"  # type: ignore[arg-type]


def _call(c: KernelCode, src: Source, e: ir.Call) -> str:
    if e.fn in COLLECTIVES:
        return f"{src.regs}[{c.hoisted[id(e)]}]"  # computed by the statement's prelude
    f = src.bind(scalar.intrinsic(e.fn, e.type))  # type: ignore[arg-type]
    return f"{f}({', '.join(render(c, src, a) for a in e.args)})"


def _pack(c: KernelCode, src: Source, e: ir.Pack) -> str:
    return f"({''.join(render(c, src, x) + ', ' for x in e.elems)})"


def _extract(c: KernelCode, src: Source, e: ir.Extract) -> str:
    v = render(c, src, e.vec)
    i = element_index(c, src, e.index, e.vec.type.n, e)  # type: ignore[attr-defined]
    if isinstance(e.vec.type, T.RegArray):
        return f"{owned(src, v, e)}[{i}]"
    return f"{v}[{i}]"


def element_index(c: KernelCode, src: Source, index: ir.Expr, n: int, node: ir.Node) -> str:
    """Source of a register or vector element index, checked against the `n` elements
    unless it is a constant (which the builder checked): one computed from unrolled loop
    variables is a located error here, not a Python IndexError (or a negative index that
    wraps around)."""
    i = render(c, src, index)
    if isinstance(index, ir.Const):
        return i
    t = src.temp()
    return f"({t} if 0 <= ({t} := {i}) < {n} else {src.bind(_element_out_of_range)}(th, {t}, " \
        f"{n}, {src.bind(node)}))"


def _element_out_of_range(th: Thread, i: int, n: int, node: ir.Node) -> NoReturn:
    fail("bounds", f"{th.name}: element index {i} is out of range [0, {n}) of this register "
         "array or vector", node)


def owned(src: Source, arr: str, node: ir.Node) -> str:
    """Source giving the register array `arr`, after reporting an accumulator that a wgmma
    still owns (a `wgmma.Pending` in place of the list)."""
    t = src.temp()
    return f"({t} if ({t} := {arr}).__class__ is list else {src.bind(touched)}({t}, th, " \
        f"{src.bind(node)}))"


def touched(arr: Any, th: Thread, node: ir.Node) -> Any:
    """Report the use of an accumulator that a wgmma still owns (`Pending.touched` raises)."""
    arr.touched(th, node)
    return arr


def _load(c: KernelCode, src: Source, e: ir.Load) -> str:
    t = e.type
    read, _ = scalar.codec(t)
    n = t.nbytes  # type: ignore[attr-defined]
    node = src.bind(e)
    if isinstance(e.ref, ir.Peer):
        where, _ = peer_place(c, e.ref)

        def peer_load(th: Thread) -> Any:
            cta, o = where(th)
            if cta is th.cta:
                return th.cta.smem.read(th, o, n, read, e)
            if isinstance(t, T.Vector):
                check_aligned(th, o, n, e)
            cta.smem._check_in_flight(th, slice(o, o + n), e, "reads")
            if cta.smem.writers is not None:
                cta.smem.writers.check_read(slice(o, o + n), th.cta, cta, th, e)
            return read(cta.smem.buf, o)

        return f"{src.bind(peer_load)}(th)"
    if isinstance(e.ref.type, T.SharedRef):
        off, _ = shared_offset(c, src, e.ref)
        if isinstance(t, T.Vector):
            off = f"{src.bind(aligned)}(th, {off}, {n}, {node})"
        return f"th.cta.smem.read(th, {off}, {n}, {src.bind(read)}, {node})"
    addr, esize = global_address(c, src, e.ref)
    return (f"{src.bind(read)}(*th.cta.gmem.locate(th, {addr}, {n}, {esize}, {node}, 'load', "
            f"{n}, 'read'))")


_RENDER: dict[type, Callable[[KernelCode, Source, Any], str]] = {
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


def aligned(th: Thread, off: int, n: int, node: Any) -> int:
    """`off`, once `check_aligned` passes."""
    check_aligned(th, off, n, node)
    return off


def shared_place(c: KernelCode, ref: ir.Expr, logical: bool = False) -> tuple[Fn, int]:
    """(byte offset of a shared place or view, bytes of the view); indices are
    bounds-checked against the declared shape. An element of a swizzled buffer is at its
    swizzled offset, unless `logical` (wgmma descriptors take the logical address)."""
    src = Source()
    off, view = shared_offset(c, src, ref, logical)
    return src.function([f"return {off}"]), view


def shared_offset(c: KernelCode, src: Source, ref: ir.Expr,
                  logical: bool = False) -> tuple[str, int]:
    """`shared_place` as source: (the offset for thread `th`, bytes of the view)."""
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
    terms = [str(c.layout.offset(ref.name))]
    for k, (i, dim, stride) in enumerate(zip(indices, decl.shape, strides, strict=False)):
        # each index is checked as soon as it is computed, in order
        t = src.temp()
        oob = f"{src.bind(_out_of_range)}(th, {t}, {k}, {dim}, {ref.name!r}, {src.bind(node)})"
        terms.append(f"({t} if 0 <= ({t} := {render(c, src, i)}) < {dim} else {oob}) * {stride}")
    off = f"({' + '.join(terms)})"
    view = node.type.nbytes  # type: ignore[attr-defined]
    if decl.swizzle and not logical and node.type.shape == ():  # type: ignore[attr-defined]
        # swizzle.physical on the absolute address, inline
        a, base = src.temp(), smem_base(c.layout)
        off = f"((({a} := {base} + {off}) ^ ((({a} >> 7) & {mask(decl.swizzle)}) << 4)) - {base})"
    return off, view


def _out_of_range(th: Thread, i: int, k: int, dim: int, name: str, node: ir.Expr) -> NoReturn:
    fail("bounds", f"{th.name}: index {i} is out of range for dimension {k} of '{name}' "
         f"(size {dim})", node)


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
    src = Source()
    addr, esize = global_address(c, src, ref)
    return src.function([f"return {addr}"]), esize


def global_address(c: KernelCode, src: Source, ref: ir.Expr) -> tuple[str, int]:
    """`global_place` as source: (the address for thread `th`, element size)."""
    assert isinstance(ref, ir.Index) and isinstance(ref.type, T.GlobalRef), ref
    base, idx = render(c, src, ref.base), render(c, src, ref.indices[0])
    esize = ref.type.elem.nbytes
    return f"(({base} + {idx} * {esize}) & {MASK64})", esize


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
