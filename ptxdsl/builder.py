"""The kernel builder: the one place that type-checks and constructs IR.

Both frontends call it: the lark Transformer (`frontend.py`) and the Python API (`api.py`).
It never raises on the first problem; every error goes to a DiagnosticBag with its span,
and an expression that failed gets the error type so that one mistake gives one message.
Untyped literals (`Lit`) take the type of the other operand, as in Go.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from . import ir
from . import types as T
from .errors import DiagnosticBag, Note, Span

MAX_SMEM_BYTES = 232448
MBARRIER_MAX_COUNT = (1 << 20) - 1


@dataclass(frozen=True)
class Lit:
    """An untyped literal (int, float or bool) and where it was written."""

    value: int | float | bool
    loc: Span | None = None


Operand = ir.Expr | Lit

SPECIAL_REGS: dict[str, T.Scalar] = {
    **{f"{r}.{d}": T.u32 for r in ("tid", "ntid", "ctaid", "nctaid") for d in "xyz"},
    **{f"{r}.{d}": T.u32 for r in ("clusterid", "nclusterid", "cluster_ctaid", "cluster_nctaid")
       for d in "xyz"},
    "laneid": T.u32, "warp": T.u32, "cluster_ctarank": T.u32, "cluster_nctarank": T.u32,
    "dynamic_smem_size": T.u32, "clock": T.u32, "clock64": T.u64, "globaltimer": T.u64,
}  # fmt: skip

# Value intrinsics: name -> (number of arguments, kinds accepted for the first argument).
FLOAT_UNARY = {"ex2", "lg2", "rsqrt", "sqrt", "rcp", "sin", "cos", "tanh"}
SHUFFLES = {"shfl_xor", "shfl_down", "shfl_up", "shfl_idx"}
VALUE_FUNCTIONS = FLOAT_UNARY | SHUFFLES | {"abs", "min", "max", "fma", "elect", "select",
                                            "vload", "sizeof"}

ARITH_OPS = {"add", "sub", "mul", "div", "rem", "min", "max"}
BIT_OPS = {"and", "or", "xor"}
SHIFT_OPS = {"shl", "shr"}
HALF_OK = {"add", "sub", "mul", "min", "max"}


@dataclass
class Symbol:
    kind: str  # param | local | loopvar | shared | barrier
    type: T.Type
    loc: Span | None
    decl: Any = None


@dataclass
class _Frame:
    stmts: list[ir.Stmt] = field(default_factory=list)
    names: dict[str, Symbol] = field(default_factory=dict)
    # open pipeline regions of this block: pipeline -> (side, where it was opened)
    regions: dict[str, tuple[str, Span | None]] = field(default_factory=dict)


_REGION_OPS = {"acquire": ("put", True), "commit": ("put", False), "wait": ("get", True),
               "release": ("get", False)}
_REGION_CLOSER = {"put": "commit", "get": "release"}
_REGION_OPENER = {"put": "acquire", "get": "wait"}


class KernelBuilder:
    """Builds one ir.Kernel. Methods take IR expressions or `Lit`s and a span."""

    def __init__(
        self,
        name: str,
        *,
        threads: tuple[int, ...] | int,
        cluster: tuple[int, ...] | int | None = None,
        maxnreg: int | None = None,
        minctas: int | None = None,
        loc: Span | None = None,
        diags: DiagnosticBag | None = None,
    ):
        self.diags = diags if diags is not None else DiagnosticBag()
        self.kernel_name = name
        self.loc = loc
        self.params: list[ir.Param] = []
        self.frames: list[_Frame] = [_Frame()]
        self.roles: list[ir.Role] = []
        self.current_role: tuple[str, int, int] | None = None
        self.smem_total = 0
        self.threads = self._dims("threads", threads, loc, upper=1024) or (1, 1, 1)
        self.cluster = (self._dims("cluster", cluster, loc, upper=16)
                        if cluster is not None else None)
        self.maxnreg = maxnreg
        self.minctas = minctas
        if self.threads[0] * self.threads[1] * self.threads[2] > 1024:
            self.diags.error(f"threads: a CTA has at most 1024 threads, got "
                             f"{self.threads[0] * self.threads[1] * self.threads[2]}", loc)
        if maxnreg is not None and not (24 <= maxnreg <= 255):
            self.diags.error(f"maxnreg must be in [24, 255], got {maxnreg}", loc)
        if minctas is not None and minctas < 1:
            self.diags.error(f"minctas must be at least 1, got {minctas}", loc)
        if self.cluster is not None and self.cluster[0] * self.cluster[1] * self.cluster[2] > 16:
            self.diags.error("cluster: at most 16 CTAs per cluster", loc)

    # ------------------------------------------------------------------ helpers

    def _dims(self, what: str, v: Any, loc: Span | None, upper: int) -> tuple[int, int, int] | None:
        dims = (v,) if isinstance(v, int) else tuple(v)
        if not 1 <= len(dims) <= 3 or not all(isinstance(d, int) for d in dims):
            self.diags.error(f"{what} takes 1 to 3 integers, got {v!r}", loc)
            return None
        for d in dims:
            if not 1 <= d <= upper:
                self.diags.error(f"{what}: each dimension must be in [1, {upper}], got {d}", loc)
                return None
        return (dims + (1, 1))[:3]  # type: ignore[return-value]

    def error(self, message: str, loc: Span | None, *notes: Note) -> ir.Expr:
        self.diags.error(message, loc, *notes)
        return ir.Const(value=0, type=T.error, loc=loc)

    def lookup(self, name: str) -> Symbol | None:
        for frame in reversed(self.frames):
            if name in frame.names:
                return frame.names[name]
        return None

    def _declare(self, name: str, sym: Symbol) -> bool:
        prev = self.lookup(name)
        if prev is not None:
            self.diags.error(f"'{name}' is already declared", sym.loc,
                             Note(f"'{name}' was declared here", prev.loc))
            return False
        if name in KEYWORDS or name in VALUE_FUNCTIONS or name in ir.OPS:
            self.diags.error(f"'{name}' is a built-in name and cannot be declared", sym.loc)
            return False
        self.frames[-1].names[name] = sym
        return True

    def emit(self, stmt: ir.Stmt) -> None:
        self.frames[-1].stmts.append(stmt)

    def push(self) -> None:
        self.frames.append(_Frame())

    def pop(self) -> tuple[ir.Stmt, ...]:
        frame = self.frames.pop()
        for pipe, (side, loc) in frame.regions.items():
            self.diags.error(f"{_REGION_OPENER[side]}({pipe}) is not closed by "
                             f"{_REGION_CLOSER[side]}({pipe}) in the same block", loc)
        return tuple(frame.stmts)

    @property
    def at_top(self) -> bool:
        return len(self.frames) == 1

    # ------------------------------------------------------------------ declarations

    def param(self, name: str, ty: T.Type | None, loc: Span | None = None) -> None:
        if ty is None:
            return
        if not isinstance(ty, (T.Scalar, T.Ptr, T.TensorMap)):
            self.diags.error(f"parameter '{name}' has type {ty}; parameters are scalars, "
                             "ptr<T> or tmap<T, rank>", loc)
            return
        if isinstance(ty, T.TensorMap) and not 1 <= ty.rank <= 5:
            self.diags.error(f"tensor map rank must be in [1, 5], got {ty.rank}", loc)
        p = ir.Param(name=name, type=ty, loc=loc)
        if self._declare(name, Symbol("param", ty, loc, p)):
            self.params.append(p)

    def shared(self, name: str, elem: T.Type | None, shape: tuple[int, ...], align: int | None,
               loc: Span | None = None) -> ir.Expr:
        if not self.at_top:
            return self.error("shared memory is declared at the top level of the kernel body",
                              loc)
        if not isinstance(elem, T.Scalar) or elem.is_pred:
            return self.error(f"shared buffer '{name}' needs a scalar element type, got "
                              f"{elem}", loc)
        align = 128 if align is None else align
        if align < 1 or align & (align - 1) or align > 1024:
            return self.error(f"alignment must be a power of two in [1, 1024], got {align}", loc)
        if align < elem.nbytes:
            return self.error(f"alignment {align} is smaller than the element size "
                              f"{elem.nbytes} of {elem}", loc)
        if not shape or any((not isinstance(d, int)) or d < 1 for d in shape):
            return self.error(f"shared buffer '{name}' needs positive dimensions, got "
                              f"{list(shape)}", loc)
        decl = ir.SharedDecl(name=name, elem=elem, shape=tuple(shape), align=align, loc=loc)
        if decl.nbytes > MAX_SMEM_BYTES:
            return self.error(f"shared buffer '{name}' is {decl.nbytes} bytes; a CTA has at "
                              f"most {MAX_SMEM_BYTES}", loc)
        self.smem_total += decl.nbytes
        ty = T.SharedRef(elem, tuple(shape))
        if not self._declare(name, Symbol("shared", ty, loc, decl)):
            return ir.Const(value=0, type=T.error, loc=loc)
        self.emit(decl)
        return ir.SharedBuf(name=name, type=ty, loc=loc)

    def mbarrier(self, name: str, n: int, count: int, loc: Span | None = None) -> ir.Expr:
        if not self.at_top:
            return self.error("mbarriers are declared at the top level of the kernel body", loc)
        if not 1 <= count <= MBARRIER_MAX_COUNT:
            return self.error(f"mbarrier arrival count must be in [1, {MBARRIER_MAX_COUNT}], "
                              f"got {count}", loc)
        if n < 0 or n > 4096:
            return self.error(f"mbarrier array size must be in [1, 4096], got {n}", loc)
        decl = ir.BarrierDecl(name=name, n=n, count=count, loc=loc)
        ty = T.BarrierRef(n)
        if not self._declare(name, Symbol("barrier", ty, loc, decl)):
            return ir.Const(value=0, type=T.error, loc=loc)
        self.emit(decl)
        return ir.BarrierObj(name=name, type=ty, loc=loc)

    def pipeline(self, name: str, stages: int, buffers: list[tuple], loc: Span | None = None
                 ) -> ir.Expr:
        """`pipeline name stages N { buf: T[dims] align A; ... }`."""
        if not self.at_top:
            return self.error("pipelines are declared at the top level of the kernel body", loc)
        if not 1 <= stages <= 64:
            return self.error(f"a pipeline has 1 to 64 stages, got {stages}", loc)
        if not buffers:
            return self.error(f"pipeline '{name}' declares no stage buffer", loc)
        decls = []
        seen: set[str] = set()
        for bname, elem, shape, align, bloc in buffers:
            if bname in seen:
                self.diags.error(f"pipeline '{name}' declares buffer '{bname}' twice", bloc)
                continue
            seen.add(bname)
            align = 128 if align is None else align
            if not isinstance(elem, T.Scalar) or elem.is_pred or not shape or \
                    any(d < 1 for d in shape) or align < 16 or align & (align - 1) or align > 1024:
                self.diags.error(f"stage buffer '{bname}' needs a scalar element type, positive "
                                 "dimensions and a power-of-two alignment in [16, 1024]", bloc)
                continue
            d = ir.SharedDecl(name=bname, elem=elem, shape=tuple(shape), align=align, loc=bloc)
            if d.nbytes % align:
                self.diags.error(f"stage buffer '{bname}' is {d.nbytes} bytes, not a multiple of "
                                 f"its alignment {align}, so later stages would be misaligned",
                                 bloc)
            decls.append(d)
            self.smem_total += d.nbytes * stages
        decl = ir.PipelineDecl(name=name, stages=stages, buffers=tuple(decls), loc=loc)
        ty = T.PipelineRef(stages)
        if not self._declare(name, Symbol("pipeline", ty, loc, decl)):
            return ir.Const(value=0, type=T.error, loc=loc)
        self.emit(decl)
        return ir.PipelineObj(name=name, type=ty, loc=loc)

    def member(self, base: ir.Expr, attr: str, loc: Span | None = None) -> ir.Expr:
        """`ring.buf` (the current stage of a pipeline buffer) or `ring.stage`."""
        if _is_err(base.type):
            return base
        if not isinstance(base, ir.PipelineObj):
            return self.error(f"{_describe(base)} of type {base.type} has no member '{attr}'",
                              loc)
        sym = self.lookup(base.name)
        decl: ir.PipelineDecl = sym.decl  # type: ignore[union-attr]
        side = self.region_side(base.name)
        if side is None:
            return self.error(f"'{base.name}.{attr}' names the current stage, which exists only "
                              f"between acquire({base.name}) and commit({base.name}) or "
                              f"wait({base.name}) and release({base.name})", loc)
        if attr == "stage":
            return ir.StageIndex(pipe=base.name, side=side, type=T.u32, loc=loc)
        for d in decl.buffers:
            if d.name == attr:
                return ir.StageBuf(pipe=base.name, buf=attr, side=side, loc=loc,
                                   type=T.SharedRef(d.elem, d.shape))
        names = ", ".join(d.name for d in decl.buffers)
        return self.error(f"pipeline '{base.name}' has no buffer '{attr}' (buffers: {names})",
                          loc)

    def region_side(self, pipe: str) -> str | None:
        for frame in reversed(self.frames):
            if pipe in frame.regions:
                return frame.regions[pipe][0]
        return None

    def pipeline_op(self, cls: type[ir.Op], pipe: ir.Expr, loc: Span | None) -> None:
        side, opens = _REGION_OPS[cls.syntax]
        name = pipe.name  # type: ignore[attr-defined]
        current = self.region_side(name)
        frame = self.frames[-1]
        if opens:
            if current is not None:
                self.diags.error(f"{cls.syntax}({name}) inside an open "
                                 f"{_REGION_OPENER[current]}({name}) region", loc)
                return
            frame.regions[name] = (side, loc)
        else:
            if frame.regions.get(name, ("", None))[0] != side:
                self.diags.error(f"{cls.syntax}({name}) without a matching "
                                 f"{_REGION_OPENER[side]}({name}) earlier in the same block", loc)
                return
            del frame.regions[name]
        self.emit(cls(pipe=pipe, loc=loc))  # type: ignore[call-arg]

    def role_begin(self, name: str, start: int, stop: int, regs: int | None,
                   loc: Span | None = None) -> tuple:
        nwarps = (self.threads[0] * self.threads[1] * self.threads[2] + 31) // 32
        if not self.at_top:
            self.diags.error("roles are declared at the top level of the kernel body", loc)
        elif not 0 <= start < stop <= nwarps:
            self.diags.error(f"role '{name}' covers warps {start} .. {stop}; this CTA has warps "
                             f"0 .. {nwarps}", loc)
        else:
            for r in self.roles:
                if start < r.warp_stop and r.warp_start < stop:
                    from .errors import Note

                    self.diags.error(f"role '{name}' overlaps role '{r.name}' (warps "
                                     f"{r.warp_start} .. {r.warp_stop})", loc,
                                     Note(f"role '{r.name}' is declared here", r.loc))
        if regs is not None:
            if not 24 <= regs <= 256 or regs % 8:
                self.diags.error(f"regs must be a multiple of 8 in [24, 256] (setmaxnreg), got "
                                 f"{regs}", loc)
            if start % 4 or stop % 4:
                self.diags.error(f"role '{name}' sets regs, so it must cover whole warpgroups "
                                 f"(warps multiple of 4), got warps {start} .. {stop}", loc)
        self.current_role = (name, start, stop)
        self.push()
        return (name, start, stop, regs, loc)

    def role_end(self, header: tuple, loc: Span | None = None) -> None:
        name, start, stop, regs, name_loc = header
        body = self.pop()
        self.current_role = None
        role = ir.Role(name=name, warp_start=start, warp_stop=stop, regs=regs, body=body,
                       loc=name_loc)
        self.roles.append(role)
        self.emit(role)

    def let(self, name: str, ty: T.Type | None, value: Operand | None,
            loc: Span | None = None) -> ir.Expr:
        init: ir.Expr | None = None
        if value is not None:
            init = self.value(value, ty)
            if ty is None:
                ty = init.type
        if ty is None:
            self.diags.error(f"'{name}' needs a type or an initial value", loc)
            ty = T.error
        if isinstance(ty, (T.SharedRef, T.GlobalRef, T.BarrierRef, T.TensorMap, T.Void)):
            self.diags.error(f"a local variable cannot hold a {ty}", loc)
            ty = T.error
        self._declare(name, Symbol("local", ty, loc))
        self.emit(ir.Let(name=name, var_type=ty, value=init, loc=loc))
        return ir.Var(name=name, type=ty, loc=loc)

    # ------------------------------------------------------------------ expressions

    def name(self, name: str, loc: Span | None = None) -> ir.Expr:
        sym = self.lookup(name)
        if sym is None:
            known = [n for f in self.frames for n in f.names]
            hint = difflib.get_close_matches(name, known, n=1)
            more = f"; did you mean '{hint[0]}'?" if hint else ""
            return self.error(f"unknown name '{name}'{more}", loc)
        if sym.kind == "shared":
            return ir.SharedBuf(name=name, type=sym.type, loc=loc)
        if sym.kind == "barrier":
            return ir.BarrierObj(name=name, type=sym.type, loc=loc)
        if sym.kind == "pipeline":
            return ir.PipelineObj(name=name, type=sym.type, loc=loc)
        return ir.Var(name=name, type=sym.type, loc=loc)

    def sreg(self, name: str, loc: Span | None = None) -> ir.Expr:
        ty = SPECIAL_REGS.get(name)
        if ty is None:
            hint = difflib.get_close_matches(name, list(SPECIAL_REGS), n=1)
            more = f"; did you mean '%{hint[0]}'?" if hint else ""
            return self.error(f"unknown special register '%{name}'{more}", loc)
        return ir.SReg(name=name, type=ty, loc=loc)

    def lit_expr(self, lit: Lit, ty: T.Type) -> ir.Expr:
        """A typed constant from an untyped literal, range-checked."""
        v, loc = lit.value, lit.loc
        if isinstance(ty, T.ErrorType):
            return ir.Const(value=0, type=T.error, loc=loc)
        if not isinstance(ty, T.Scalar):
            return self.error(f"a literal cannot be used as {ty}", loc)
        if ty.is_pred:
            if isinstance(v, bool):
                return ir.Const(value=v, type=ty, loc=loc)
            return self.error(f"expected a pred (true/false), got {v!r}", loc)
        if isinstance(v, bool):
            return self.error(f"expected {ty}, got {str(v).lower()}", loc)
        if ty.is_float:
            return ir.Const(value=float(v), type=ty, loc=loc)
        if isinstance(v, float):
            return self.error(f"expected {ty}, got the float literal {v!r}", loc)
        lo, hi = _int_range(ty)
        if not lo <= v <= hi:
            return self.error(f"literal {v} does not fit in {ty} (range [{lo}, {hi}])", loc)
        return ir.Const(value=v, type=ty, loc=loc)

    def default_type(self, lit: Lit) -> T.Scalar:
        if isinstance(lit.value, bool):
            return T.pred
        return T.f32 if isinstance(lit.value, float) else T.u32

    def value(self, x: Operand, want: T.Type | None = None) -> ir.Expr:
        """An rvalue: literals typed (as `want` or by default), places loaded."""
        if isinstance(x, Lit):
            return self.lit_expr(x, want if want is not None else self.default_type(x))
        x = self.rvalue(x)
        if want is not None and not _compatible(x.type, want):
            return self.error(f"expected {want}, got {x.type}", x.loc)
        return x

    def rvalue(self, x: ir.Expr) -> ir.Expr:
        ty = x.type
        if isinstance(ty, T.SharedRef):
            if ty.shape == ():
                return ir.Load(ref=x, type=ty.elem, loc=x.loc)
            return self.error(f"{_describe(x)} is a shared-memory view of shape "
                              f"{list(ty.shape)}; index it to read an element", x.loc)
        if isinstance(ty, T.GlobalRef):
            return ir.Load(ref=x, type=ty.elem, loc=x.loc)
        if isinstance(ty, T.BarrierRef):
            return self.error(f"{_describe(x)} is an mbarrier, not a value", x.loc)
        if isinstance(ty, T.TensorMap):
            return self.error(f"{_describe(x)} is a tensor map; it is only an operand of "
                              "tma_* operations", x.loc)
        return x

    def unify(self, a: Operand, b: Operand, what: str, loc: Span | None) -> tuple[Any, Any]:
        """Both operands typed alike; literals follow the typed side."""
        if isinstance(a, Lit) and isinstance(b, Lit):
            return a, b
        if isinstance(a, Lit):
            eb = self.rvalue(b)  # type: ignore[arg-type]
            return self.lit_expr(a, eb.type), eb
        if isinstance(b, Lit):
            ea = self.rvalue(a)
            return ea, self.lit_expr(b, ea.type)
        ea, eb = self.rvalue(a), self.rvalue(b)
        if _is_err(ea.type) or _is_err(eb.type):
            return ea, eb
        if ea.type != eb.type:
            self.diags.error(f"operands of '{what}' have different types: {ea.type} and "
                             f"{eb.type} (convert one with 'as')", loc)
            return ir.Const(value=0, type=T.error), eb
        return ea, eb

    def binary(self, op: str, a: Operand, b: Operand, loc: Span | None = None) -> Operand:
        sym = BINARY_SYMBOL.get(op, op)
        if isinstance(a, Lit) and isinstance(b, Lit):
            return self._fold(op, a, b, loc)
        # pointer arithmetic: ptr + integer (in elements)
        if op in ("add", "sub") and not isinstance(a, Lit) and isinstance(a.type, T.Ptr):
            off = self.value(b, None if not isinstance(b, Lit) else T.u64)
            if not _is_err(off.type) and not (isinstance(off.type, T.Scalar) and off.type.is_int):
                return self.error(f"a pointer offset must be an integer, got {off.type}", loc)
            return ir.Binary(op=op, a=a, b=off, type=a.type, loc=loc)
        if op in SHIFT_OPS:
            ea = self.value(a)
            eb = self.value(b, T.u32) if isinstance(b, Lit) else self.rvalue(b)
            for e in (ea, eb):
                if not _is_err(e.type) and not _is_int(e.type):
                    return self.error(f"operands of '{sym}' must be integers, got {e.type}", loc)
            if not _is_err(eb.type) and eb.type != T.u32:
                eb = ir.Cast(x=eb, type=T.u32, loc=eb.loc)
            return ir.Binary(op=op, a=ea, b=eb, type=ea.type, loc=loc)
        ea, eb = self.unify(a, b, sym, loc)
        ty = ea.type
        if _is_err(ty) or _is_err(eb.type):
            return ir.Const(value=0, type=T.error, loc=loc)
        if op in ("land", "lor"):
            if ty != T.pred:
                return self.error(f"operands of '{sym}' must be pred, got {ty}", loc)
            op = "and" if op == "land" else "or"
        elif not isinstance(ty, T.Scalar):
            return self.error(f"'{sym}' is not defined for {ty}", loc)
        elif op in BIT_OPS:
            if ty.is_float:
                return self.error(f"operands of '{sym}' must be integers or pred, got {ty}", loc)
        elif op in ARITH_OPS:
            if ty.is_pred:
                return self.error(f"'{sym}' is not defined for pred", loc)
            if ty.nbytes == 2 and ty.is_float and op not in HALF_OK:
                return self.error(f"'{sym}' is not defined for {ty}; convert to f32 first", loc)
            if op == "rem" and ty.is_float:
                return self.error(f"'%' is not defined for {ty}", loc)
            if ty.nbytes == 1:
                return self.error(f"arithmetic on {ty} is not supported; convert to u32", loc)
        return ir.Binary(op=op, a=ea, b=eb, type=ty, loc=loc)

    def _fold(self, op: str, a: Lit, b: Lit, loc: Span | None) -> Lit:
        x, y = a.value, b.value
        try:
            if op == "add":
                r = x + y
            elif op == "sub":
                r = x - y
            elif op == "mul":
                r = x * y
            elif op == "div":
                if isinstance(x, int) and isinstance(y, int):
                    r = abs(x) // abs(y) * (1 if (x >= 0) == (y >= 0) else -1)
                else:
                    r = x / y
            elif op == "rem":
                r = x - y * int(x / y)  # type: ignore[operator]
            elif op in ("min", "max"):
                r = min(x, y) if op == "min" else max(x, y)
            elif op in ("and", "or", "xor", "shl", "shr", "land", "lor") and \
                    isinstance(x, int) and isinstance(y, int):
                r = {"and": x & y, "or": x | y, "xor": x ^ y, "shl": x << y, "shr": x >> y,
                     "land": bool(x and y), "lor": bool(x or y)}[op]
            else:
                self.diags.error(f"'{BINARY_SYMBOL.get(op, op)}' is not defined for "
                                 f"{x!r} and {y!r}", loc)
                return Lit(0, loc)
        except ZeroDivisionError:
            self.diags.error("division by zero in a constant expression", loc)
            return Lit(0, loc)
        return Lit(r, loc)

    def compare(self, op: str, a: Operand, b: Operand, loc: Span | None = None) -> Operand:
        if isinstance(a, Lit) and isinstance(b, Lit):
            import operator as o

            f = {"eq": o.eq, "ne": o.ne, "lt": o.lt, "le": o.le, "gt": o.gt, "ge": o.ge}[op]
            return Lit(bool(f(a.value, b.value)), loc)
        ea, eb = self.unify(a, b, COMPARE_SYMBOL[op], loc)
        if _is_err(ea.type) or _is_err(eb.type):
            return ir.Const(value=False, type=T.error, loc=loc)
        if not isinstance(ea.type, T.Scalar):
            return self.error(f"cannot compare values of type {ea.type}", loc)
        if ea.type.is_pred and op not in ("eq", "ne"):
            return self.error(f"'{COMPARE_SYMBOL[op]}' is not defined for pred", loc)
        return ir.Compare(op=op, a=ea, b=eb, type=T.pred, loc=loc)

    def unary(self, op: str, x: Operand, loc: Span | None = None) -> Operand:
        if isinstance(x, Lit):
            v = x.value
            if op == "neg" and not isinstance(v, bool):
                return Lit(-v, loc)
            if op == "not" and isinstance(v, bool):
                return Lit(not v, loc)
            if op == "not" and isinstance(v, int):
                return Lit(~v, loc)
            return self.error(f"cannot apply '{UNARY_SYMBOL[op]}' to {v!r}", loc)
        e = self.rvalue(x)
        ty = e.type
        if _is_err(ty):
            return e
        if not isinstance(ty, T.Scalar):
            return self.error(f"cannot apply '{UNARY_SYMBOL[op]}' to {ty}", loc)
        if op == "neg" and (ty.kind == "u" or ty.is_pred or ty.kind == "b"):
            return self.error(f"cannot negate {ty}; only signed integers and floats", loc)
        if op == "not" and ty.is_float:
            return self.error(f"cannot apply '!' or '~' to {ty}", loc)
        return ir.Unary(op=op, x=e, type=ty, loc=loc)

    def cast(self, x: Operand, ty: T.Type | None, loc: Span | None = None) -> ir.Expr:
        if ty is None:
            return ir.Const(value=0, type=T.error, loc=loc)
        if isinstance(x, Lit):
            return self.lit_expr(x, ty) if isinstance(ty, T.Scalar) else self.error(
                f"cannot convert a literal to {ty}", loc)
        e = self.rvalue(x)
        if _is_err(e.type):
            return e
        if not isinstance(ty, T.Scalar) or not isinstance(e.type, T.Scalar):
            return self.error(f"cannot convert {e.type} to {ty}", loc)
        if ty.is_pred:
            return self.error(f"cannot convert {e.type} to pred; compare it instead "
                              "(x != 0)", loc)
        if e.type == ty:
            return e
        return ir.Cast(x=e, type=ty, loc=loc)

    def index(self, base: ir.Expr, idx: list[Operand], loc: Span | None = None) -> ir.Expr:
        ty = base.type
        if _is_err(ty):
            return base
        if isinstance(ty, T.SharedRef):
            if len(idx) > len(ty.shape):
                return self.error(f"{_describe(base)} has {len(ty.shape)} dimension(s), "
                                  f"indexed with {len(idx)}", loc)
            exprs = []
            for i, (x, dim) in enumerate(zip(idx, ty.shape, strict=False)):
                if isinstance(x, Lit) and isinstance(x.value, int) and not 0 <= x.value < dim:
                    self.diags.error(f"index {x.value} is out of range for dimension {i} of "
                                     f"size {dim}", x.loc)
                exprs.append(self._index_value(x))
            return ir.Index(base=base, indices=tuple(exprs), loc=loc,
                            type=T.SharedRef(ty.elem, ty.shape[len(idx):]))
        if isinstance(ty, T.Ptr):
            if len(idx) != 1:
                return self.error(f"a pointer takes one index, got {len(idx)}", loc)
            i = idx[0]
            e = self.lit_expr(i, T.u32 if 0 <= i.value < 2**32 else T.u64) \
                if isinstance(i, Lit) and isinstance(i.value, int) else self.value(i)
            if not _is_err(e.type) and not _is_int(e.type):
                return self.error(f"an index must be an integer, got {e.type}", e.loc)
            return ir.Index(base=base, indices=(e,), type=T.GlobalRef(ty.elem), loc=loc)
        if isinstance(ty, T.BarrierRef) and ty.n > 0:
            if len(idx) != 1:
                return self.error(f"mbarrier array takes one index, got {len(idx)}", loc)
            x = idx[0]
            if isinstance(x, Lit) and isinstance(x.value, int) and not 0 <= x.value < ty.n:
                self.diags.error(f"index {x.value} is out of range for mbarrier array of "
                                 f"size {ty.n}", x.loc)
            return ir.Index(base=base, indices=(self._index_value(x),), type=T.BarrierRef(0),
                            loc=loc)
        if isinstance(ty, T.Vector):
            x = idx[0] if len(idx) == 1 else None
            if isinstance(x, Lit) and isinstance(x.value, int) and 0 <= x.value < ty.n:
                return ir.Extract(vec=base, index=self.lit_expr(x, T.u32), type=ty.elem, loc=loc)
            if x is not None and not isinstance(x, Lit) and self._unrolled(x):
                return ir.Extract(vec=base, index=self.value(x, T.u32), type=ty.elem, loc=loc)
            return self.error(f"a vector element index must be a constant in [0, {ty.n - 1}] "
                              "or an expression of 'unroll' loop variables", loc)
        e = self.rvalue(base)
        if _is_err(e.type):
            return e
        return self.error(f"{_describe(base)} of type {ty} cannot be indexed", loc)

    def _unrolled(self, e: ir.Expr) -> bool:
        """Whether `e` depends only on constants and variables of unrolled loops."""
        if isinstance(e, ir.Const):
            return True
        if isinstance(e, ir.Var):
            sym = self.lookup(e.name)
            return sym is not None and sym.kind == "loopvar" and sym.decl == "unroll"
        if isinstance(e, ir.Binary):
            return self._unrolled(e.a) and self._unrolled(e.b)
        return False

    def _index_value(self, x: Operand) -> ir.Expr:
        e = self.value(x, T.u32) if isinstance(x, Lit) else self.rvalue(x)
        if not _is_err(e.type) and e.type not in (T.u32, T.s32):
            return self.error(f"a shared-memory index must be u32 or s32, got {e.type}", e.loc)
        return e

    def sizeof(self, x: ir.Expr, loc: Span | None = None) -> Operand:
        ty = x.type
        if isinstance(ty, T.SharedRef):
            return Lit(ty.nbytes, loc)
        if isinstance(ty, (T.Scalar, T.Vector)):
            return Lit(ty.nbytes, loc)
        if _is_err(ty):
            return Lit(0, loc)
        return self.error(f"sizeof is not defined for {ty}", loc)

    def call(self, fn: str, args: list[Operand], loc: Span | None = None) -> Operand:
        """A value-producing built-in function."""
        n = len(args)

        def arity(k: int) -> bool:
            if n != k:
                self.diags.error(f"{fn}() takes {k} argument(s), got {n}", loc)
                return False
            return True

        if fn in ("min", "max"):
            return self.binary(fn, args[0], args[1], loc) if arity(2) else Lit(0, loc)
        if fn == "select":
            if not arity(3):
                return Lit(0, loc)
            c = self.value(args[0], T.pred)
            a, b = self.unify(args[1], args[2], "select", loc)
            if isinstance(a, Lit):
                a, b = self.value(a), self.value(b)
            return ir.Select(cond=c, a=a, b=b, type=a.type, loc=loc)
        if fn == "sizeof":
            if not arity(1) or isinstance(args[0], Lit):
                return self.error("sizeof() takes a shared buffer or a value", loc)
            return self.sizeof(args[0], loc)
        if fn == "elect":
            return ir.Call(fn=fn, args=(), type=T.pred, loc=loc) if arity(0) else Lit(0, loc)
        if fn == "vload":
            if not arity(2) or isinstance(args[0], Lit):
                return self.error("vload(place, n) takes a shared or global element and a "
                                  "vector width", loc)
            return self.vload(args[0], args[1], loc)
        if fn in FLOAT_UNARY:
            if not arity(1):
                return Lit(0, loc)
            x = self.value(args[0], T.f32 if isinstance(args[0], Lit) else None)
            ok = (T.f32, T.f64) if fn in ("sqrt", "rcp") else (T.f32,)
            if not _is_err(x.type) and x.type not in ok:
                return self.error(f"{fn}() takes {' or '.join(map(str, ok))}, got {x.type}", loc)
            return ir.Call(fn=fn, args=(x,), type=x.type, loc=loc)
        if fn == "abs":
            if not arity(1):
                return Lit(0, loc)
            x = self.value(args[0])
            if not _is_err(x.type) and (not isinstance(x.type, T.Scalar) or x.type.kind == "u"
                                        or x.type.is_pred):
                return self.error(f"abs() takes a signed integer or float, got {x.type}", loc)
            return ir.Call(fn=fn, args=(x,), type=x.type, loc=loc)
        if fn == "fma":
            if not arity(3):
                return Lit(0, loc)
            typed = next((a for a in args if not isinstance(a, Lit)), None)
            want = self.rvalue(typed).type if typed is not None else T.f32
            xs = tuple(self.value(a, want) for a in args)
            if not _is_err(want) and (not isinstance(want, T.Scalar) or not want.is_float):
                return self.error(f"fma() takes floats, got {want}", loc)
            return ir.Call(fn=fn, args=xs, type=want, loc=loc)
        if fn in SHUFFLES:
            if not arity(2):
                return Lit(0, loc)
            v = self.value(args[0])
            lane = self.value(args[1], T.u32)
            if not _is_err(v.type) and v.type not in (T.u32, T.s32, T.f32, T.b32):
                return self.error(f"{fn}() moves 32-bit values, got {v.type}", loc)
            return ir.Call(fn=fn, args=(v, lane), type=v.type, loc=loc)
        if (vt := T.parse_type_name(fn)) is not None and isinstance(vt, T.Vector):
            if not arity(vt.n):
                return Lit(0, loc)
            elems = tuple(self.value(a, vt.elem) for a in args)
            return ir.Pack(elems=elems, type=vt, loc=loc)
        return self.error(f"unknown function '{fn}'", loc)

    def vload(self, place: ir.Expr, width: Operand, loc: Span | None) -> ir.Expr:
        ty = place.type
        if not isinstance(width, Lit) or not isinstance(width.value, int):
            return self.error("the vector width of vload must be a constant", loc)
        if isinstance(ty, T.SharedRef) and ty.shape == ():
            elem = ty.elem
        elif isinstance(ty, T.GlobalRef):
            elem = ty.elem
        else:
            return self.error(f"vload needs one element of shared or global memory, got {ty}",
                              loc)
        vt = T.vector_type(elem, width.value)
        if vt is None:
            return self.error(f"no {width.value}-wide vector of {elem}: a vector is 4, 8 or 16 "
                              "bytes", loc)
        return ir.Load(ref=place, type=vt, loc=loc)

    # ------------------------------------------------------------------ statements

    def assign(self, name: str, value: Operand, loc: Span | None = None,
               name_loc: Span | None = None) -> None:
        sym = self.lookup(name)
        if sym is None:
            self.name(name, name_loc or loc)
            return
        if sym.kind != "local":
            self.diags.error(f"cannot assign to {sym.kind} '{name}'", name_loc or loc,
                             Note(f"'{name}' was declared here", sym.loc))
            return
        v = self.value(value, sym.type)
        self.emit(ir.Assign(name=name, value=v, loc=loc))

    def store(self, place: ir.Expr, value: Operand, loc: Span | None = None) -> None:
        ty = place.type
        if _is_err(ty):
            return
        if isinstance(place, ir.Extract):
            vec = place.vec
            sym = self.lookup(vec.name) if isinstance(vec, ir.Var) else None
            if sym is None or sym.kind != "local":
                self.diags.error("only elements of local vector variables can be assigned",
                                 loc)
                return
            self.emit(ir.SetElem(name=vec.name, index=place.index,  # type: ignore[union-attr]
                                 value=self.value(value, ty), loc=loc))
            return
        if isinstance(ty, T.SharedRef) and ty.shape == ():
            elem = ty.elem
        elif isinstance(ty, T.GlobalRef):
            elem = ty.elem
        else:
            self.diags.error(f"cannot store to {_describe(place)} of type {ty}", loc)
            return
        if not isinstance(value, Lit):
            v = self.rvalue(value)
            if isinstance(v.type, T.Vector):
                if v.type.elem != elem:
                    self.diags.error(f"cannot store {v.type} into {elem} memory", loc)
                self.emit(ir.Store(ref=place, value=v, loc=loc))
                return
        v = self.value(value, elem)
        self.emit(ir.Store(ref=place, value=v, loc=loc))

    def op(self, syntax: str, args: list[Operand], loc: Span | None = None) -> None:
        """An intrinsic statement such as mbarrier_wait(bar, phase) or bulk_load(...)."""
        cls = ir.OPS.get(syntax)
        if cls is None:
            hint = difflib.get_close_matches(syntax, list(ir.OPS) + list(VALUE_FUNCTIONS), n=1)
            more = f"; did you mean '{hint[0]}'?" if hint else ""
            self.diags.error(f"unknown operation '{syntax}'{more}", loc)
            return
        from .ops import check_op

        if cls is ir.RoleSync and self.current_role is None:
            self.diags.error("role_sync() synchronises the threads of a role; use it inside a "
                             "role", loc)
            return
        node = check_op(self, cls, args, loc)
        if isinstance(node, (ir.Acquire, ir.Commit, ir.Wait, ir.Release)):
            self.pipeline_op(type(node), node.pipe, loc)
            return
        if node is not None:
            self.emit(node)

    def asm(self, template: str, outs: list[tuple[str, Span | None]], ins: list[Operand],
            loc: Span | None = None) -> None:
        names = []
        for name, nloc in outs:
            sym = self.lookup(name)
            if sym is None or sym.kind != "local":
                self.diags.error(f"asm output '{name}' must be a local variable", nloc or loc)
            names.append(name)
        vals = tuple(self.value(x) for x in ins)
        self.emit(ir.Asm(template=template, outs=tuple(names), ins=vals, loc=loc))

    # control flow: callers bracket bodies with push()/pop()

    def if_stmt(self, cond: Operand, then: tuple[ir.Stmt, ...], orelse: tuple[ir.Stmt, ...],
                loc: Span | None = None) -> None:
        c = self.value(cond, T.pred)
        self.emit(ir.If(cond=c, then=then, orelse=orelse, loc=loc))

    def for_header(self, var: str, start: Operand, stop: Operand, step: Operand | None,
                   loc: Span | None = None, unroll: bool = False) -> tuple:
        """Types the bounds and opens the body scope with the loop variable declared."""
        typed = next((x for x in (start, stop, step) if isinstance(x, ir.Expr)), None)
        ty = self.rvalue(typed).type if typed is not None else T.u32
        if not _is_err(ty) and not _is_int(ty):
            self.diags.error(f"loop bounds must be integers, got {ty}", loc)
            ty = T.error
        st = self.value(start, ty)
        sp = self.value(stop, ty)
        sc = self.value(step if step is not None else Lit(1, loc), ty)
        if isinstance(sc, ir.Const) and sc.value == 0 and not _is_err(sc.type):
            self.diags.error("loop step must not be zero", sc.loc)
        if unroll:
            consts = [x for x in (st, sp, sc) if isinstance(x, ir.Const)]
            if len(consts) != 3:
                self.diags.error("an 'unroll' loop needs constant bounds and step", loc)
            elif len(range(int(st.value), int(sp.value), int(sc.value))) > 256:  # type: ignore[union-attr]
                self.diags.error("an 'unroll' loop may have at most 256 iterations", loc)
        self.push()
        self._declare(var, Symbol("loopvar", ty, loc, "unroll" if unroll else None))
        return st, sp, sc, ty, unroll

    def for_stmt(self, var: str, header: tuple, loc: Span | None = None) -> None:
        body = self.pop()
        st, sp, sc, ty, unroll = header
        self.emit(ir.For(var=var, var_type=ty, start=st, stop=sp, step=sc, body=body,
                         unroll=unroll, loc=loc))

    def while_stmt(self, cond: ir.Expr, body: tuple[ir.Stmt, ...], loc: Span | None) -> None:
        self.emit(ir.While(cond=cond, body=body, loc=loc))

    def finish(self) -> ir.Kernel:
        if len(self.frames) != 1:
            raise AssertionError("unbalanced blocks in the kernel builder")
        if self.smem_total > MAX_SMEM_BYTES:
            self.diags.error(f"kernel '{self.kernel_name}' declares {self.smem_total} bytes of "
                             f"shared memory; a CTA has at most {MAX_SMEM_BYTES}", self.loc)
        return ir.Kernel(name=self.kernel_name, params=tuple(self.params), threads=self.threads,
                         cluster=self.cluster, maxnreg=self.maxnreg, minctas=self.minctas,
                         body=tuple(self.frames[0].stmts), loc=self.loc)


KEYWORDS = {"kernel", "ptr", "tmap", "shared", "align", "mbarrier", "count", "let", "if", "else",
            "for", "in", "step", "while", "return", "asm", "as", "true", "false", "pipeline",
            "stages", "role", "warps", "regs", "unroll"}

BINARY_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/", "rem": "%", "and": "&",
                 "or": "|", "xor": "^", "shl": "<<", "shr": ">>", "land": "&&", "lor": "||",
                 "min": "min", "max": "max"}
COMPARE_SYMBOL = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
UNARY_SYMBOL = {"neg": "-", "not": "!"}


def _int_range(t: T.Scalar) -> tuple[int, int]:
    if t.is_signed:
        return -(1 << (t.nbits - 1)), (1 << (t.nbits - 1)) - 1
    return (-(1 << (t.nbits - 1)) if t.kind == "b" else 0), (1 << t.nbits) - 1


def _is_err(t: T.Type) -> bool:
    return isinstance(t, T.ErrorType)


def _is_int(t: T.Type) -> bool:
    return isinstance(t, T.Scalar) and t.is_int


def _compatible(have: T.Type, want: T.Type) -> bool:
    return _is_err(have) or _is_err(want) or have == want


def _describe(e: ir.Expr) -> str:
    if isinstance(e, (ir.SharedBuf, ir.BarrierObj, ir.Var)):
        return f"'{e.name}'"
    if isinstance(e, ir.Index):
        return f"{_describe(e.base)}[...]"
    return "this expression"
