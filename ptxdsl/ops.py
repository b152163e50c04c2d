"""Operand checking for the intrinsic statements (ir.Op subclasses).

Each op lists its operands as (field, kind, optional). Kinds:
  bar     one mbarrier (`b` or `bars[i]`)
  u32     a u32 value (literals allowed)
  const   a non-negative integer constant
  smem    a shared-memory place or view (a whole buffer, a stage `buf[s]`, an element)
  gref    a global-memory place `ptr[i]`
  tmap    a tensor-map parameter
  coords  a list `[c0, c1, ...]` of 32-bit integer coordinates, innermost first
Omitted byte counts are derived from the shared-memory operand.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import ir
from . import types as T
from .errors import Span

if TYPE_CHECKING:
    from .builder import KernelBuilder, Operand

SPECS: dict[type[ir.Op], tuple[tuple[str, str, bool], ...]] = {
    ir.MBarrierInit: (("bar", "bar", False), ("count", "u32", True)),
    ir.MBarrierArrive: (("bar", "bar", False), ("count", "u32", True)),
    ir.MBarrierArriveExpectTx: (("bar", "bar", False), ("nbytes", "u32", False)),
    ir.MBarrierExpectTx: (("bar", "bar", False), ("nbytes", "u32", False)),
    ir.MBarrierWait: (("bar", "bar", False), ("parity", "u32", False)),
    ir.MBarrierInval: (("bar", "bar", False),),
    ir.FenceProxyAsync: (),
    ir.FenceMBarrierInit: (),
    ir.BarSync: (("id", "u32", False), ("nthreads", "u32", True)),
    ir.BarArrive: (("id", "u32", False), ("nthreads", "u32", False)),
    ir.BulkLoad: (("dst", "smem", False), ("src", "gref", False), ("bar", "bar", True),
                  ("nbytes", "u32", True)),
    ir.BulkStore: (("dst", "gref", False), ("src", "smem", False), ("nbytes", "u32", True)),
    ir.BulkCommit: (),
    ir.BulkWait: (("n", "const", True),),
    ir.BulkWaitRead: (("n", "const", True),),
    ir.TensorLoad: (("dst", "smem", False), ("tmap", "tmap", False), ("coords", "coords", False),
                    ("bar", "bar", True)),
    ir.TensorStore: (("tmap", "tmap", False), ("coords", "coords", False), ("src", "smem", False)),
    ir.TensorMapPrefetch: (("tmap", "tmap", False),),
    ir.TensorPrefetch: (("tmap", "tmap", False), ("coords", "coords", False)),
    ir.Acquire: (("pipe", "pipe", False),),
    ir.Commit: (("pipe", "pipe", False),),
    ir.Wait: (("pipe", "pipe", False),),
    ir.Release: (("pipe", "pipe", False),),
    ir.RoleSync: (),
}


def signature(cls: type[ir.Op]) -> str:
    parts = [f"{name}?" if opt else name for name, _, opt in SPECS[cls]]
    return f"{cls.syntax}({', '.join(parts)})"


def check_op(b: KernelBuilder, cls: type[ir.Op], args: list, loc: Span | None) -> ir.Op | None:
    from .builder import Lit

    spec = SPECS[cls]
    required = sum(1 for _, _, opt in spec if not opt)
    if not required <= len(args) <= len(spec):
        want = f"{required}" if required == len(spec) else f"{required} to {len(spec)}"
        b.diags.error(f"{cls.syntax} takes {want} argument(s), got {len(args)}; usage: "
                      f"{signature(cls)}", loc)
        return None
    values: dict[str, object] = {}
    ok = True
    for (name, kind, _), arg in zip(spec, args, strict=False):
        v = _operand(b, cls, name, kind, arg, loc)
        ok = ok and v is not None
        values[name] = v
    if not ok:
        return None
    for name, kind, _ in spec[len(args):]:
        if kind == "const":
            values[name] = ir.Const(value=0, type=T.u32, loc=loc)
        elif name == "bar":
            dst = values.get("dst")
            if isinstance(dst, ir.StageBuf) and dst.side == "put":
                values[name] = ir.StageBarrier(pipe=dst.pipe, type=T.BarrierRef(0), loc=loc)
            else:
                b.diags.error(f"{cls.syntax} needs an mbarrier (only copies into a pipeline "
                              "stage, between acquire and commit, derive it)", loc)
                return None
        elif name == "nbytes":
            place = values.get("dst") if cls is ir.BulkLoad else values.get("src")
            values[name] = b.lit_expr(Lit(place.type.nbytes, loc), T.u32)  # type: ignore[union-attr]
        else:
            values[name] = None
    node = cls(loc=loc, **values)  # type: ignore[arg-type]
    _check_semantics(b, node)
    return node


def _operand(b: KernelBuilder, cls: type[ir.Op], name: str, kind: str, arg: Operand,
             loc: Span | None):
    from .builder import Lit

    where = f"argument '{name}' of {cls.syntax}"
    aloc = arg.loc if hasattr(arg, "loc") and arg.loc is not None else loc  # type: ignore[union-attr]
    if kind == "coords":
        if not isinstance(arg, list):
            b.diags.error(f"{where} must be a coordinate list [c0, c1, ...]", aloc)
            return None
        out = []
        for c in arg:
            e = b.value(c, T.s32) if isinstance(c, Lit) else b.rvalue(c)
            if not isinstance(e.type, T.ErrorType) and e.type not in (T.s32, T.u32):
                b.diags.error(f"tensor coordinates are s32 or u32, got {e.type}", e.loc)
                return None
            out.append(e)
        return tuple(out)
    if isinstance(arg, list):
        b.diags.error(f"{where} cannot be a list", loc)
        return None
    if kind == "u32":
        e = b.value(arg, T.u32)
        return None if isinstance(e.type, T.ErrorType) else e
    if kind == "const":
        if not isinstance(arg, Lit) or not isinstance(arg.value, int) or isinstance(
                arg.value, bool) or arg.value < 0:
            b.diags.error(f"{where} must be a non-negative integer constant", aloc)
            return None
        return b.lit_expr(arg, T.u32)
    if isinstance(arg, Lit):
        b.diags.error(f"{where} must be {_KIND_TEXT[kind]}, got the literal {arg.value!r}", aloc)
        return None
    ty = arg.type
    if isinstance(ty, T.ErrorType):
        return None
    good = {
        "bar": isinstance(ty, T.BarrierRef) and ty.n == 0,
        "smem": isinstance(ty, T.SharedRef),
        "gref": isinstance(ty, T.GlobalRef),
        "tmap": isinstance(ty, T.TensorMap),
        "pipe": isinstance(ty, T.PipelineRef),
    }[kind]
    if not good:
        extra = ""
        if kind == "bar" and isinstance(ty, T.BarrierRef):
            extra = f"; index the array ({_name(arg)}[i])"
        elif kind == "gref" and isinstance(ty, T.Ptr):
            extra = f"; write {_name(arg)}[offset]"
        b.diags.error(f"{where} must be {_KIND_TEXT[kind]}, got {ty}{extra}", aloc)
        return None
    return arg


def _name(e: ir.Expr) -> str:
    return getattr(e, "name", "x")


_KIND_TEXT = {
    "bar": "an mbarrier",
    "smem": "shared memory",
    "gref": "a global-memory place (ptr[offset])",
    "tmap": "a tensor map",
    "pipe": "a pipeline",
    "u32": "a u32 value",
}


def _const(e: object) -> int | None:
    if isinstance(e, ir.Const) and isinstance(e.value, int) and not isinstance(e.value, bool):
        return e.value
    return None


def _check_semantics(b: KernelBuilder, n: ir.Op) -> None:
    """Checks that need more than one operand or a constant value."""
    err = b.diags.error
    if isinstance(n, (ir.BulkLoad, ir.BulkStore)):
        smem = n.dst if isinstance(n, ir.BulkLoad) else n.src
        size = _const(n.nbytes)
        if size is not None:
            if size <= 0 or size % 16:
                err(f"a bulk copy moves a positive multiple of 16 bytes, got {size}",
                    n.nbytes.loc or n.loc)
            elif size > smem.type.nbytes:  # type: ignore[attr-defined]
                err(f"{n.syntax} moves {size} bytes but the shared-memory operand holds "
                    f"{smem.type.nbytes}", n.nbytes.loc or n.loc)  # type: ignore[attr-defined]
    elif isinstance(n, (ir.MBarrierArriveExpectTx, ir.MBarrierExpectTx)):
        size = _const(n.nbytes)
        if size is not None and size > (1 << 20) - 1:
            err(f"one mbarrier phase tracks at most {(1 << 20) - 1} bytes, got {size}",
                n.nbytes.loc or n.loc)
    elif isinstance(n, (ir.MBarrierInit, ir.MBarrierArrive)) and n.count is not None:
        c = _const(n.count)
        if c is not None and not 1 <= c <= (1 << 20) - 1:
            err(f"an mbarrier count must be in [1, {(1 << 20) - 1}], got {c}", n.count.loc or n.loc)
    elif isinstance(n, (ir.BarSync, ir.BarArrive)):
        i = _const(n.id)
        if i is not None and not 0 <= i <= 15:
            err(f"a named barrier id must be in [0, 15], got {i}", n.id.loc or n.loc)
        c = _const(n.nthreads) if n.nthreads is not None else None
        if c is not None and (c <= 0 or c % 32):
            err(f"a barrier thread count must be a positive multiple of 32, got {c}",
                n.nthreads.loc or n.loc)  # type: ignore[union-attr]
    elif isinstance(n, ir.TensorPrefetch) and isinstance(n.tmap.type, T.TensorMap) and \
            len(n.coords) != n.tmap.type.rank:
        err(f"tensor map '{_name(n.tmap)}' has rank {n.tmap.type.rank}, but {len(n.coords)} "
            "coordinate(s) were given", n.loc)
    elif isinstance(n, (ir.TensorLoad, ir.TensorStore)):
        tm = n.tmap.type
        smem = n.dst if isinstance(n, ir.TensorLoad) else n.src
        if isinstance(tm, T.TensorMap):
            if len(n.coords) != tm.rank:
                err(f"tensor map '{_name(n.tmap)}' has rank {tm.rank}, but {len(n.coords)} "
                    "coordinate(s) were given", n.loc)
            st = smem.type
            if isinstance(st, T.SharedRef) and st.elem.nbytes != tm.elem.nbytes:
                err(f"shared memory of {st.elem} cannot hold tiles of tensor map "
                    f"'{_name(n.tmap)}' ({tm.elem})", smem.loc or n.loc)
