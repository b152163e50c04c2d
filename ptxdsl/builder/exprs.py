"""Expressions: names, literals (untyped `Lit`s take the type of the other operand, as in
Go), operators with constant folding, conversions, indexing into places, built-in value
functions. An expression that failed gets the error type, so one mistake gives one message."""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Iterable
from typing import Any

from .. import ir
from .. import types as T
from ..errors import Span
from .common import (
    ARITH_OPS,
    BINARY_SYMBOL,
    BIT_OPS,
    COMPARE_SYMBOL,
    FLOAT_UNARY,
    HALF_OK,
    SHIFT_OPS,
    SHUFFLES,
    SPECIAL_REGS,
    UNARY_SYMBOL,
    Lit,
    Operand,
    compatible,
    describe,
    int_range,
    is_err,
    is_int,
    untyped,
)
from .hints import convert, convert_hint, function_hint, name_hint
from .literals import (
    LiteralError,
    float_fits,
    float_range_text,
    fold,
    int_fits_error,
    show_int,
    show_value,
)
from .named import inline, reason, runtime_operand
from .scope import Scope

# Families of built-in functions kept in modules of their own (atomic.py, cluster.py), and
# views whose indexing they define (cluster.py's peer()), register here when imported; the
# builder package imports them, so both tables are full before any kernel is built.
CallRule = Callable[["Expressions", str, list[Operand], Span | None], Operand]
IndexRule = Callable[["Expressions", Any, list[Operand], Span | None], ir.Expr]
CALLS: dict[str, CallRule] = {}
VIEWS: dict[type[ir.Expr], IndexRule] = {}


def register_calls(names: Iterable[str], rule: CallRule) -> None:
    """`rule(builder, fn, args, loc)` builds a call of each function in `names`."""
    for name in names:
        CALLS[name] = rule


def register_view(node: type[ir.Expr], rule: IndexRule) -> None:
    """`rule(builder, view, indices, loc)` indexes an expression of type `node`."""
    VIEWS[node] = rule


class Expressions(Scope):
    """Typing and construction of expressions."""

    def name(self, name: str, loc: Span | None = None) -> Operand:
        sym = self.lookup(name)
        if sym is None:
            known = [n for f in self.frames for n in f.names]
            hint = difflib.get_close_matches(name, known, n=1)
            more = name_hint(name) or (f"; did you mean '{hint[0]}'?" if hint else "")
            return self.error(f"unknown name '{name}'{more}", loc)
        if sym.kind == "shared":
            return ir.SharedBuf(name=name, type=sym.type, loc=loc)
        if sym.kind == "barrier":
            return ir.BarrierObj(name=name, type=sym.type, loc=loc)
        if sym.kind == "pipeline":
            return ir.PipelineObj(name=name, type=sym.type, loc=loc)
        if sym.kind == "const":
            if sym.decl is None:  # its value was wrong, and said so
                return ir.Const(value=0, type=T.error, loc=loc)
            if isinstance(sym.decl, ir.Expr):  # an expression of 'unroll' loop variables
                return dataclasses.replace(sym.decl, loc=loc)
            return Lit(sym.decl.value, loc, sym.decl.type)
        if sym.kind == "async":
            return ir.AsyncObj(name=name, type=sym.type, loc=loc)
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
        if lit.type is not None and lit.type != ty:
            return self.error(f"expected {ty}, got the {lit.type} constant {show_value(v)} "
                              f"(convert it with 'as {ty}')", loc)
        if ty.is_pred:
            if isinstance(v, bool):
                return ir.Const(value=v, type=ty, loc=loc)
            return self.error(f"expected a pred (true/false), got {v!r}", loc)
        if isinstance(v, bool):
            return self.error(f"expected {ty}, got {str(v).lower()}", loc)
        if ty.is_float:
            f = float(v) if isinstance(v, float) or abs(v) <= 1 << 1000 else math.inf
            if not float_fits(f, ty) or (math.isinf(f) and not isinstance(v, float)):
                return self.error(f"literal {show_value(v)} does not fit in {ty} "
                                  f"({float_range_text(ty)})", loc)
            return ir.Const(value=f, type=ty, loc=loc)
        if isinstance(v, float):
            return self.error(f"expected {ty}, got the float literal {v!r}", loc)
        lo, hi = int_range(ty)
        if not lo <= v <= hi:
            return self.error(f"literal {show_int(v)} does not fit in {ty} (range [{lo}, {hi}])",
                              loc)
        return ir.Const(value=v, type=ty, loc=loc)

    def default_type(self, lit: Lit) -> T.Scalar:
        if lit.type is not None:
            return lit.type
        if isinstance(lit.value, bool):
            return T.pred
        return T.f32 if isinstance(lit.value, float) else T.u32

    def value(self, x: Operand, want: T.Type | None = None) -> ir.Expr:
        """An rvalue: literals typed (as `want` or by default), places loaded."""
        if isinstance(x, Lit):
            return self.lit_expr(x, want if want is not None else self.default_type(x))
        x = self.rvalue(x)
        if want is not None and not compatible(x.type, want):
            return self.error(f"expected {want}, got {x.type}{convert_hint(x, want)}", x.loc)
        return x

    def rvalue(self, x: ir.Expr) -> ir.Expr:
        ty = x.type
        if isinstance(ty, T.SharedRef):
            if ty.shape == ():
                return ir.Load(ref=x, type=ty.elem, loc=x.loc)
            idx = ", ".join("i" if k == 0 else "j" if k == 1 else f"i{k}"
                            for k in range(len(ty.shape)))
            how = f" ({x.name}[{idx}])" if isinstance(x, ir.SharedBuf) else ""
            return self.error(f"{describe(x)} is a shared-memory view of shape "
                              f"{list(ty.shape)}; index it to read an element{how}", x.loc)
        if isinstance(ty, T.GlobalRef):
            return ir.Load(ref=x, type=ty.elem, loc=x.loc)
        if isinstance(ty, T.BarrierRef):
            return self.error(f"{describe(x)} is an mbarrier, not a value", x.loc)
        if isinstance(ty, T.TensorMap):
            return self.error(f"{describe(x)} is a tensor map; it is only an operand of "
                              "tma_* operations", x.loc)
        if isinstance(ty, T.RegArray):
            return self.error(f"{describe(x)} is a register array of type {ty}; index it with "
                              "constants (or unroll loop variables) to read an element", x.loc)
        return x

    def unify(self, a: Operand, b: Operand, what: str, loc: Span | None) -> tuple[Any, Any]:
        """Both operands typed alike; literals follow the typed side."""
        if isinstance(a, Lit) and isinstance(b, Lit):
            return a, b
        if isinstance(a, Lit):
            eb = self.rvalue(b)  # type: ignore[arg-type]
            if self._float_literal_meets_int(a, eb, what, loc):
                return ir.Const(value=0, type=T.error), eb
            return self.lit_expr(a, eb.type), eb
        if isinstance(b, Lit):
            ea = self.rvalue(a)
            if self._float_literal_meets_int(b, ea, what, loc):
                return ea, ir.Const(value=0, type=T.error)
            return ea, self.lit_expr(b, ea.type)
        ea, eb = self.rvalue(a), self.rvalue(b)
        if is_err(ea.type) or is_err(eb.type):
            return ea, eb
        if ea.type != eb.type:
            # convert the integer side to the float one, else the second to the first
            fix = ""
            if isinstance(ea.type, T.Scalar) and isinstance(eb.type, T.Scalar):
                ints_first = ea.type.is_int and eb.type.is_float
                x, ty = (ea, eb.type) if ints_first else (eb, ea.type)
                fix = convert(x, ty)
            how = f"; convert one: {fix}" if fix else " (convert one with 'as')"
            self.diags.error(f"operands of '{what}' have different types: {ea.type} and "
                             f"{eb.type}{how}", loc)
            return ir.Const(value=0, type=T.error), eb
        return ea, eb

    def _float_literal_meets_int(self, lit: Lit, e: ir.Expr, what: str, loc: Span | None
                                 ) -> bool:
        """`n * 0.5` with an integer `n`: say so, and how to compute in floats."""
        if not (untyped(lit) and isinstance(lit.value, float) and is_int(e.type)):
            return False
        fix = convert(e, T.f32)
        how = f"; to compute in floats, convert it first: {fix}" if fix else ""
        self.diags.error(f"'{what}' of {describe(e)} ({e.type}) and the float literal "
                         f"{lit.value!r}: an integer operation takes no fraction{how}", loc)
        return True

    def binary(self, op: str, a: Operand, b: Operand, loc: Span | None = None) -> Operand:
        sym = BINARY_SYMBOL.get(op, op)
        if isinstance(a, Lit) and isinstance(b, Lit):
            return self._fold(op, a, b, loc)
        # pointer arithmetic: ptr + integer (in elements)
        if op in ("add", "sub") and not isinstance(a, Lit) and isinstance(a.type, T.Ptr):
            off = self.value(b, T.u64 if untyped(b) else None)
            if not is_err(off.type) and not (isinstance(off.type, T.Scalar) and off.type.is_int):
                return self.error(f"a pointer offset must be an integer, got {off.type}", loc)
            return ir.Binary(op=op, a=a, b=off, type=a.type, loc=loc)
        if op in SHIFT_OPS:
            ea = self.value(a)
            eb = self.value(b, T.u32 if untyped(b) else None)
            for e in (ea, eb):
                if not is_err(e.type) and not is_int(e.type):
                    return self.error(f"operands of '{sym}' must be integers, got {e.type}", loc)
            if _byte(ea.type):
                return self.error(f"'{sym}' on {ea.type} is not supported; convert to u32", loc)
            if not is_err(eb.type) and eb.type != T.u32:
                eb = ir.Cast(x=eb, type=T.u32, loc=eb.loc)
            return ir.Binary(op=op, a=ea, b=eb, type=ea.type, loc=loc)
        ea, eb = self.unify(a, b, sym, loc)
        ty = ea.type
        if is_err(ty) or is_err(eb.type):
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
            if _byte(ty):
                return self.error(f"'{sym}' on {ty} is not supported; convert to u32", loc)
        elif op in ARITH_OPS:
            if ty.is_pred:
                return self.error(f"'{sym}' is not defined for pred", loc)
            if ty.nbytes == 2 and ty.is_float and op not in HALF_OK:
                return self.error(f"'{sym}' is not defined for {ty}; convert to f32 first", loc)
            if op == "rem" and ty.is_float:
                return self.error(f"'%' is not defined for {ty}", loc)
            if ty.nbytes == 1:
                return self.error(f"arithmetic on {ty} is not supported; convert to "
                                  f"{_wide(ty)}", loc)
        return ir.Binary(op=op, a=ea, b=eb, type=ty, loc=loc)

    def _fold(self, op: str, a: Lit, b: Lit, loc: Span | None) -> Lit:
        ty = self.const_type(a, b, op, loc)
        if isinstance(ty, bool):
            return Lit(0, loc)
        if ty is not None:  # the untyped side takes the type, as it would for a register
            ta = self.const_of(a, ty)
            tb = b if op in SHIFT_OPS else self.const_of(b, ty)
            if ta is None or tb is None:
                return Lit(0, loc)
            a, b = ta, tb
        r = self._fold_value(op, a, b, loc)
        if ty is None or op in ("land", "lor"):
            return r
        return self.const_of(Lit(r.value, loc), ty) or Lit(0, loc)

    def const_type(self, a: Lit, b: Lit, op: str, loc: Span | None) -> T.Scalar | None | bool:
        """The type of a constant expression of `a` and `b` (None: both untyped); False after
        reporting operands of different types."""
        if op in SHIFT_OPS:
            return a.type
        if a.type is not None and b.type is not None and a.type != b.type:
            self.diags.error(f"operands of '{BINARY_SYMBOL.get(op, op)}' have different types: "
                             f"{a.type} and {b.type} (convert one with 'as')", loc)
            return False
        return a.type or b.type

    def const_of(self, lit: Lit, ty: T.Scalar) -> Lit | None:
        """`lit` as a constant of type `ty` (range-checked), or None after an error."""
        v = lit.value
        if lit.type is None or lit.type == ty:
            e = self.lit_expr(Lit(v, lit.loc), ty)
        else:
            e = self.lit_expr(lit, ty)
        if not isinstance(e, ir.Const) or is_err(e.type):
            return None
        return Lit(e.value, lit.loc, ty)

    def _fold_value(self, op: str, a: Lit, b: Lit, loc: Span | None) -> Lit:
        try:
            return Lit(fold(op, BINARY_SYMBOL.get(op, op), a.value, b.value), loc)
        except LiteralError as e:
            self.diags.error(str(e), loc)
            return Lit(0, loc)

    def compare(self, op: str, a: Operand, b: Operand, loc: Span | None = None) -> Operand:
        if isinstance(a, Lit) and isinstance(b, Lit):
            import operator as o

            f = {"eq": o.eq, "ne": o.ne, "lt": o.lt, "le": o.le, "gt": o.gt, "ge": o.ge}[op]
            if self.const_type(a, b, op, loc) is False:
                return Lit(False, loc)
            return Lit(bool(f(a.value, b.value)), loc)
        ea, eb = self.unify(a, b, COMPARE_SYMBOL[op], loc)
        if is_err(ea.type) or is_err(eb.type):
            return ir.Const(value=False, type=T.error, loc=loc)
        if not isinstance(ea.type, T.Scalar):
            return self.error(f"cannot compare values of type {ea.type}", loc)
        if ea.type.is_pred and op not in ("eq", "ne"):
            return self.error(f"'{COMPARE_SYMBOL[op]}' is not defined for pred", loc)
        if ea.type.is_fp8:
            return self.error(f"'{COMPARE_SYMBOL[op]}' is not defined for {ea.type}; convert to "
                              "f32 first", loc)
        return ir.Compare(op=op, a=ea, b=eb, type=T.pred, loc=loc)

    def unary(self, op: str, x: Operand, loc: Span | None = None) -> Operand:
        if isinstance(x, Lit) and x.type is not None:
            if op == "neg" and (x.type.kind == "u" or x.type.is_pred or x.type.kind == "b"):
                return self.error(f"cannot negate {x.type}; only signed integers and floats", loc)
            r = self.unary(op, Lit(x.value, x.loc), loc)
            return self.const_of(r, x.type) or Lit(0, loc) if isinstance(r, Lit) else r
        if isinstance(x, Lit):
            v = x.value
            if op == "neg" and not isinstance(v, bool):
                if isinstance(v, int) and (why := int_fits_error(-v)) is not None:
                    return self.error(f"the constant -{show_int(v)}: its value {why}", loc)
                return Lit(-v, loc)
            if op == "not" and isinstance(v, bool):
                return Lit(not v, loc)
            if op == "not" and isinstance(v, int):
                return Lit(~v, loc)
            return self.error(f"cannot apply '{UNARY_SYMBOL[op]}' to {v!r}", loc)
        e = self.rvalue(x)
        ty = e.type
        if is_err(ty):
            return e
        if not isinstance(ty, T.Scalar):
            return self.error(f"cannot apply '{UNARY_SYMBOL[op]}' to {ty}", loc)
        if op == "neg" and (ty.kind == "u" or ty.is_pred or ty.kind == "b"):
            return self.error(f"cannot negate {ty}; only signed integers and floats", loc)
        if op == "not" and ty.is_float:
            return self.error(f"cannot apply '!' or '~' to {ty}", loc)
        if _byte(ty):
            return self.error(f"'{UNARY_SYMBOL[op]}' on {ty} is not supported; convert to "
                              f"{_wide(ty)}", loc)
        return ir.Unary(op=op, x=e, type=ty, loc=loc)

    def cast(self, x: Operand, ty: T.Type | None, loc: Span | None = None) -> Operand:
        if ty is None:
            return ir.Const(value=0, type=T.error, loc=loc)
        if isinstance(x, Lit):
            return self.cast_const(x, ty, loc)
        e = self.rvalue(x)
        if is_err(e.type):
            return e
        if not isinstance(ty, T.Scalar) or not isinstance(e.type, T.Scalar):
            return self.error(f"cannot convert {e.type} to {ty}", loc)
        if ty.is_pred:
            return self.error(f"cannot convert {e.type} to pred; compare it instead "
                              "(x != 0)", loc)
        if e.type == ty:
            return e
        return ir.Cast(x=e, type=ty, loc=loc)

    def cast_const(self, x: Lit, ty: T.Type, loc: Span | None) -> Operand:
        """A constant converted at compile time: still a constant, now typed `ty` (a float
        becomes an integer by truncation, as `cvt.rzi` would)."""
        if not isinstance(ty, T.Scalar):
            return self.error(f"cannot convert a constant to {ty}", loc)
        v = x.value
        if ty.is_int and isinstance(v, float) and x.type is not None:
            v = int(v)
        r = self.const_of(Lit(v, x.loc), ty)
        return Lit(r.value, loc, ty) if r is not None else ir.Const(value=0, type=T.error,
                                                                   loc=loc)

    def index(self, base: ir.Expr, idx: list[Operand], loc: Span | None = None) -> ir.Expr:
        ty = base.type
        if is_err(ty):
            return base
        view = VIEWS.get(type(base))
        if view is not None:
            return view(self, base, idx, loc)
        if isinstance(ty, T.SharedRef):
            if len(idx) > len(ty.shape):
                return self.error(f"{describe(base)} has {len(ty.shape)} dimension(s), "
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
            ix = idx[0]
            e = self.lit_expr(ix, ix.type or (T.u32 if 0 <= ix.value < 2**32 else T.u64)) \
                if isinstance(ix, Lit) and isinstance(ix.value, int) else self.value(ix)
            if not is_err(e.type) and not is_int(e.type):
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
        if isinstance(ty, T.RegArray):
            return self.reg_element(base, ty, idx, loc)
        if isinstance(ty, T.Vector):
            vx = idx[0] if len(idx) == 1 else None
            if isinstance(vx, Lit) and isinstance(vx.value, int) and 0 <= vx.value < ty.n:
                return ir.Extract(vec=base, index=self.lit_expr(vx, T.u32), type=ty.elem,
                                  loc=loc)
            if vx is not None and not isinstance(vx, Lit):
                ix = self.unrolled_index(vx, ty.n, loc, "", "a vector element index")
                return ix if is_err(ix.type) else \
                    ir.Extract(vec=base, index=ix, type=ty.elem, loc=loc)
            return self.error(f"a vector element index must be a constant in [0, {ty.n - 1}] "
                              "or an expression of 'unroll' loop variables", loc)
        e = self.rvalue(base)
        if is_err(e.type):
            return e
        return self.error(f"{describe(base)} of type {ty} cannot be indexed", loc)

    def unrolled_index(self, x: Operand, size: int, loc: Span | None, out_of_range: str,
                       what: str) -> ir.Expr:
        """An index into registers: a constant in [0, size) (else `out_of_range`, its {v} the
        value) or an expression of unrolled loop variables (registers have no address)."""
        if isinstance(x, Lit):
            v = x.value
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < size:
                return self.error(out_of_range.format(v=repr(v)), x.loc or loc)
            return self.lit_expr(x, T.u32)
        e = self.value(x, T.u32)
        if is_err(e.type):
            return e
        bad = runtime_operand(e, self.lookup)
        if bad is not None:
            why, notes = reason(bad, self.lookup)
            return self.error(f"{what} must be a constant or an expression of 'unroll' loop "
                              f"variables; {why}", x.loc or loc, *notes)
        return inline(e, self.lookup, x.loc or loc)

    def reg_element(self, base: ir.Expr, ty: T.RegArray, idx: list[Operand],
                    loc: Span | None) -> ir.Expr:
        """Element of a register array: one index per dimension, or one flat index; each a
        constant or an expression of unrolled loop variables (registers have no address)."""
        dims = ty.shape if len(idx) == len(ty.shape) else (ty.n,) if len(idx) == 1 else None
        if dims is None:
            return self.error(f"{describe(base)} has {len(ty.shape)} dimension(s), indexed "
                              f"with {len(idx)}", loc)
        flat: ir.Expr | None = None
        for x, dim in zip(idx, dims, strict=True):
            e = self.unrolled_index(x, dim, loc, "index {v} is out of range for a register array "
                                    f"dimension of size {dim}", "a register array index")
            if is_err(e.type):
                return e
            if flat is None:
                flat = e
            elif isinstance(flat, ir.Const) and isinstance(e, ir.Const):
                flat = ir.Const(value=int(flat.value) * dim + int(e.value), type=T.u32)
            else:
                scaled = ir.Binary(op="mul", a=flat, b=ir.Const(value=dim, type=T.u32),
                                   type=T.u32)
                flat = ir.Binary(op="add", a=scaled, b=e, type=T.u32)
        return ir.Extract(vec=base, index=flat, type=ty.elem, loc=loc)  # type: ignore[arg-type]

    def _index_value(self, x: Operand) -> ir.Expr:
        e = self.value(x, T.u32 if untyped(x) else None)
        if not is_err(e.type) and e.type not in (T.u32, T.s32):
            return self.error(f"a shared-memory index must be u32 or s32, got {e.type}", e.loc)
        return e

    def sizeof(self, x: ir.Expr, loc: Span | None = None) -> Operand:
        ty = x.type
        if isinstance(ty, T.SharedRef):
            return Lit(ty.nbytes, loc)
        if isinstance(ty, (T.Scalar, T.Vector)):
            return Lit(ty.nbytes, loc)
        if is_err(ty):
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

        rule = CALLS.get(fn)
        if rule is not None:
            return rule(self, fn, args, loc)
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
        if fn in FLOAT_UNARY:
            if not arity(1):
                return Lit(0, loc)
            x = self.value(args[0], T.f32 if untyped(args[0]) else None)
            ok = (T.f32, T.f64) if fn in ("sqrt", "rcp") else (T.f32,)
            if not is_err(x.type) and x.type not in ok:
                return self.error(f"{fn}() takes {' or '.join(map(str, ok))}, got {x.type}", loc)
            return ir.Call(fn=fn, args=(x,), type=x.type, loc=loc)
        if fn == "abs":
            if not arity(1):
                return Lit(0, loc)
            x = self.value(args[0])
            if not is_err(x.type) and (not isinstance(x.type, T.Scalar) or x.type.kind == "u"
                                        or x.type.is_pred or x.type.is_fp8):
                return self.error(f"abs() takes a signed integer or float, got {x.type}", loc)
            return ir.Call(fn=fn, args=(x,), type=x.type, loc=loc)
        if fn == "fma":
            if not arity(3):
                return Lit(0, loc)
            typed = next((a for a in args if not untyped(a)), None)
            want: T.Type = T.f32
            if isinstance(typed, Lit):
                want = typed.type or T.f32
            elif typed is not None:
                want = self.rvalue(typed).type
            xs = tuple(self.value(a, want) for a in args)
            if not is_err(want) and (not isinstance(want, T.Scalar) or not want.is_float
                                     or want.is_fp8):
                return self.error(f"fma() takes f16, bf16, f32 or f64, got {want}", loc)
            return ir.Call(fn=fn, args=xs, type=want, loc=loc)
        if fn in SHUFFLES:
            if not arity(2):
                return Lit(0, loc)
            v = self.value(args[0])
            lane = self.value(args[1], T.u32)
            if not is_err(v.type) and v.type not in (T.u32, T.s32, T.f32, T.b32):
                return self.error(f"{fn}() moves 32-bit values, got {v.type}", loc)
            return ir.Call(fn=fn, args=(v, lane), type=v.type, loc=loc)
        if (vt := T.parse_type_name(fn)) is not None and isinstance(vt, T.Vector):
            if not arity(vt.n):
                return Lit(0, loc)
            elems = tuple(self.value(a, vt.elem) for a in args)
            return ir.Pack(elems=elems, type=vt, loc=loc)
        return self.error(f"unknown function '{fn}'{function_hint(fn)}", loc)


def _byte(t: T.Type) -> bool:
    """An 8-bit integer or fp8 float: a memory type, loaded into and stored from 16-bit
    registers; it computes only after conversion."""
    return isinstance(t, T.Scalar) and t.nbytes == 1 and not t.is_pred


def _wide(t: T.Scalar) -> str:
    """The type to compute a byte type in."""
    return "f32" if t.is_float else "u32"
