"""Operand checking for the intrinsic statements, driven by each OpDef's `operands`.

Kinds:
  bar     one mbarrier (`b` or `bars[i]`)
  u32     a u32 value (literals allowed)
  const   a non-negative integer constant
  smem    a shared-memory place or view (a whole buffer, a stage `buf[s]`, an element)
  gref    a global-memory place `ptr[i]`
  tmap    a tensor-map parameter
  pipe    a pipeline
  coords  a list `[c0, c1, ...]` of 32-bit integer coordinates, innermost first
  rbar    one mbarrier of this CTA or, through peer(bar, rank), of another CTA of the cluster
  peer    a shared-memory place of another CTA of the cluster (`peer(buf[i], rank)`)
  u16     a u16 value (a multicast CTA mask; literals allowed)
  val     a scalar or vector value (literals typed u32 / f32)
  pred    a pred value (literals allowed)
  regs    a register array (`let acc: f32[128];`)
  mma_a   a wgmma A operand: a shared-memory place or a register array
  scope   a memory scope written as a bare word: cta, cluster, gpu or sys
Omitted optional operands are derived by the OpDef (`derive`) or left None.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import ir
from .. import types as T
from ..errors import Span
from ..opdef import OpDef
from .common import Lit, Operand

if TYPE_CHECKING:
    from .exprs import Expressions

KIND_TEXT = {
    "bar": "an mbarrier",
    "smem": "shared memory",
    "gref": "a global-memory place (ptr[offset])",
    "tmap": "a tensor map",
    "pipe": "a pipeline",
    "u32": "a u32 value",
    "async": "a one-shot load (async name { ... })",
    "rbar": "an mbarrier (or peer(bar, rank))",
    "peer": "shared memory of another CTA (peer(place, rank))",
    "regs": "a register array",
    "mma_a": "a shared-memory place, a register array or frag(p, k)",
}


def check_op(b: Expressions, d: OpDef, args: list, loc: Span | None) -> ir.Op | None:
    """The typed node of `d` applied to `args`, or None after reporting what is wrong."""
    spec = d.operands
    required = sum(1 for _, _, opt in spec if not opt)
    if not required <= len(args) <= len(spec):
        want = f"{required}" if required == len(spec) else f"{required} to {len(spec)}"
        b.diags.error(f"{d.syntax} takes {want} argument(s), got {len(args)}; usage: "
                      f"{d.signature()}", loc)
        return None
    values: dict[str, Any] = {name: None for name, _, _ in spec}
    ok = True
    for (name, kind, _), arg in zip(spec, args, strict=False):
        v = _operand(b, d, name, kind, arg, loc)
        ok = ok and v is not None
        values[name] = v
    if not ok:
        return None
    problem = d.derive(values, loc)
    if problem is not None:
        b.diags.error(problem, loc)
        return None
    node = d.node(loc=loc, **values)
    d.check(node, b.diags.error)
    return node


def _operand(b: Expressions, d: OpDef, name: str, kind: str, arg: Operand,
             loc: Span | None) -> Any:
    where = f"argument '{name}' of {d.syntax}"
    aloc = arg.loc if hasattr(arg, "loc") and arg.loc is not None else loc  # type: ignore[union-attr]
    if kind == "coords":
        if not isinstance(arg, list):
            b.diags.error(f"{where} must be a coordinate list [c0, c1, ...]", aloc)
            return None
        out = []
        for c in arg:
            e = b.value(c, T.s32 if isinstance(c, Lit) and c.type is None else None)
            if not isinstance(e.type, T.ErrorType) and e.type not in (T.s32, T.u32):
                b.diags.error(f"tensor coordinates are s32 or u32, got {e.type}", e.loc)
                return None
            out.append(e)
        return tuple(out)
    if kind == "scope":
        if isinstance(arg, str) and arg in ir.SCOPES:
            return str(arg)
        b.diags.error(f"{where} must be a scope ({', '.join(ir.SCOPES)})", aloc)
        return None
    if isinstance(arg, str):
        b.diags.error(f"{where} must be {KIND_TEXT.get(kind, 'a value')}, got the word "
                      f"'{arg}'", aloc)
        return None
    if isinstance(arg, list):
        b.diags.error(f"{where} cannot be a list", loc)
        return None
    if kind in ("u32", "u16", "pred"):
        e = b.value(arg, {"u32": T.u32, "u16": T.u16, "pred": T.pred}[kind])
        return None if isinstance(e.type, T.ErrorType) else e
    if kind == "val":
        e = b.value(arg)
        if isinstance(e.type, T.ErrorType):
            return None
        if not isinstance(e.type, (T.Scalar, T.Vector)) or e.type == T.pred:
            b.diags.error(f"{where} must be a value, got {e.type}", aloc)
            return None
        return e
    if kind == "const":
        if not isinstance(arg, Lit) or not isinstance(arg.value, int) or isinstance(
                arg.value, bool) or arg.value < 0:
            b.diags.error(f"{where} must be a non-negative integer constant", aloc)
            return None
        return b.lit_expr(arg, T.u32)
    if isinstance(arg, Lit):
        b.diags.error(f"{where} must be {KIND_TEXT[kind]}, got the literal {arg.value!r}", aloc)
        return None
    ty = arg.type
    if isinstance(ty, T.ErrorType):
        return None
    good = {
        "bar": isinstance(ty, T.BarrierRef) and ty.n == 0 and not isinstance(ty, T.PeerBarrier),
        "rbar": isinstance(ty, T.BarrierRef) and ty.n == 0,
        "smem": isinstance(ty, T.SharedRef) and not isinstance(ty, T.PeerShared),
        "peer": isinstance(ty, T.PeerShared),
        "gref": isinstance(ty, T.GlobalRef),
        "tmap": isinstance(ty, T.TensorMap),
        "pipe": isinstance(ty, T.PipelineRef),
        "async": isinstance(ty, T.AsyncRef),
        "regs": isinstance(ty, T.RegArray) and isinstance(arg, ir.Var),
        "mma_a": isinstance(ty, T.SharedRef) or (isinstance(ty, T.RegArray)
                                                 and isinstance(arg, (ir.Var, ir.Fragment))),
    }[kind]
    if not good:
        extra = ""
        if kind == "bar" and isinstance(ty, T.BarrierRef):
            extra = f"; index the array ({getattr(arg, 'name', 'x')}[i])"
        elif kind == "gref" and isinstance(ty, T.Ptr):
            extra = f"; write {getattr(arg, 'name', 'x')}[offset]"
        b.diags.error(f"{where} must be {KIND_TEXT[kind]}, got {ty}{extra}", aloc)
        return None
    return arg
