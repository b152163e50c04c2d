"""Statements: assignment, stores, intrinsic operations, asm, control flow, and the finished
kernel."""

from __future__ import annotations

import difflib
import re
from math import prod

from .. import ir
from .. import types as T
from ..bounds import MAX_NESTING, MAX_UNROLLED, too_deep_ir
from ..errors import Note, Span
from ..opdef import BY_SYNTAX
from .common import (
    MAX_SMEM_BYTES,
    VALUE_FUNCTIONS,
    Lit,
    Operand,
    Symbol,
    describe,
    is_err,
    is_int,
)
from .named import LetValue
from .operands import check_op
from .turns import Turns


class Statements(Turns):
    """Statements, blocks and the finished kernel. Methods take IR expressions or `Lit`s and
    a span."""

    def assign(self, name: str, value: Operand, loc: Span | None = None,
               name_loc: Span | None = None) -> None:
        sym = self.lookup(name)
        if sym is None:
            hint = difflib.get_close_matches(name, [n for f in self.frames for n in f.names], n=1)
            more = f"; did you mean '{hint[0]}'?" if hint else \
                f"; declare a variable with 'let {name} = ...;' before assigning to it"
            self.diags.error(f"unknown name '{name}'{more}", name_loc or loc)
            return
        if sym.kind != "local":
            fix = ""
            if sym.kind == "param":
                fix = f"; parameters are read-only: copy it (let my_{name} = {name};) and " \
                      "assign the copy"
            elif sym.kind == "const":
                fix = "; a constant's value is fixed: declare a variable with 'let' instead"
            elif sym.kind == "loopvar":
                fix = "; the loop advances it (use 'step' to change how)"
            self.diags.error(f"cannot assign to {sym.kind} '{name}'{fix}", name_loc or loc,
                             Note(f"'{name}' was declared here", sym.loc))
            return
        if isinstance(sym.type, T.RegArray):
            self.diags.error(f"register array '{name}' is assigned element by element "
                             f"({name}[i] = ...)", name_loc or loc)
            return
        if not self.runtime_from_here(name, sym, name_loc or loc):
            return
        v = self.value(value, sym.type)
        self.emit(ir.Assign(name=name, value=v, loc=loc))

    def runtime_from_here(self, name: str, sym: Symbol, loc: Span | None) -> bool:
        """A write to local `name` at `loc`: from here on it is not compile-time; False (and
        said why) if it already served as a compile-time value."""
        known = sym.decl
        if not isinstance(known, LetValue):
            return True
        if known.used is not None:
            self.diags.error(f"cannot assign to '{name}': it is used as a compile-time value "
                             "(an index of registers), which must not change; assign a new "
                             "variable instead", loc, Note(f"'{name}' is used here", known.used))
            return False
        sym.decl = LetValue(None, "it is assigned", loc)
        return True

    def store(self, place: ir.Expr, value: Operand, loc: Span | None = None) -> None:
        ty = place.type
        if is_err(ty):
            return
        if isinstance(place, ir.Extract):
            vec = place.vec
            sym = self.lookup(vec.name) if isinstance(vec, ir.Var) else None
            if sym is None or sym.kind != "local":
                self.diags.error("only elements of local vector variables can be assigned",
                                 loc)
                return
            self.emit(ir.SetElem(name=vec.name, index=place.index,  # type: ignore[attr-defined]
                                 value=self.value(value, ty), loc=loc))
            return
        if isinstance(ty, T.SharedRef) and ty.shape == ():
            elem = ty.elem
        elif isinstance(ty, T.GlobalRef):
            elem = ty.elem
        else:
            self.diags.error(f"cannot store to {describe(place)} of type {ty}", loc)
            return
        if not isinstance(value, Lit):
            v = self.rvalue(value)
            if is_err(v.type):
                return
            if isinstance(v.type, T.Vector):
                if v.type.elem != elem:
                    self.diags.error(f"cannot store {v.type} into {elem} memory", loc)
                self.emit(ir.Store(ref=place, value=v, loc=loc))
                return
        v = self.value(value, elem)
        self.emit(ir.Store(ref=place, value=v, loc=loc))

    def op(self, syntax: str, args: list[Operand], loc: Span | None = None) -> None:
        """An intrinsic statement such as mbarrier_wait(bar, phase) or bulk_load(...)."""
        d = BY_SYNTAX.get(syntax)
        if d is None:
            hint = difflib.get_close_matches(syntax, list(BY_SYNTAX) + list(VALUE_FUNCTIONS), n=1)
            more = f"; did you mean '{hint[0]}'?" if hint else ""
            self.diags.error(f"unknown operation '{syntax}'{more}", loc)
            return
        if d.node is ir.RoleSync and self.current_role is None:
            self.diags.error("role_sync() synchronises the threads of a role; use it inside a "
                             "role", loc)
            return
        node = check_op(self, d, self.async_operands(d, args, loc), loc)
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
            if sym is None or sym.kind != "local" or not isinstance(sym.type, T.Scalar):
                self.diags.error(f"asm output '{name}' must be a local scalar variable",
                                 nloc or loc)
            else:
                self.runtime_from_here(name, sym, nloc or loc)
            names.append(name)
        vals = tuple(self.value(x) for x in ins)
        for v in vals:
            if not isinstance(v.type, (T.Scalar, T.Ptr, T.ErrorType)):
                self.diags.error(f"an asm operand is a scalar or a pointer (one register), "
                                 f"got {v.type}", v.loc or loc)
        n = len(names) + len(vals)
        for ref in sorted({int(m) for m in re.findall(r"\{(\d+)\}", template)}):
            if ref >= n:
                self.diags.error(f"asm template names operand {{{ref}}}, but there "
                                 f"{'is' if n == 1 else 'are'} {n} operand(s) ({{0}} .. "
                                 f"{{{n - 1}}}: the outputs, then the inputs)" if n else
                                 f"asm template names operand {{{ref}}}, but it has no "
                                 "operands", loc)
                break
        self.emit(ir.Asm(template=template, outs=tuple(names), ins=vals, loc=loc))

    def if_stmt(self, cond: Operand, then: tuple[ir.Stmt, ...], orelse: tuple[ir.Stmt, ...],
                loc: Span | None = None) -> None:
        c = self.value(cond, T.pred)
        self.emit(ir.If(cond=c, then=then, orelse=orelse, loc=loc))

    def for_header(self, var: str, start: Operand, stop: Operand, step: Operand | None,
                   loc: Span | None = None, unroll: bool = False) -> tuple:
        """Types the bounds and opens the body scope with the loop variable declared."""
        typed = next((x for x in (start, stop, step) if isinstance(x, ir.Expr)), None)
        const_ty = next((x.type for x in (start, stop, step) if isinstance(x, Lit) and x.type),
                        T.u32)
        ty = self.rvalue(typed).type if typed is not None else const_ty
        if not is_err(ty) and not is_int(ty):
            self.diags.error(f"loop bounds must be integers, got {ty}", loc)
            ty = T.error
        st = self.value(start, ty)
        sp = self.value(stop, ty)
        sc = self.value(step if step is not None else Lit(1, loc), ty)
        if isinstance(sc, ir.Const) and sc.value == 0 and not is_err(sc.type):
            self.diags.error("loop step must not be zero", sc.loc)
        unroll_count = 1  # copies of the body this loop makes
        if unroll and any(is_err(x.type) for x in (st, sp, sc)):
            pass  # already reported
        elif unroll:
            consts = [x for x in (st, sp, sc) if isinstance(x, ir.Const)]
            if len(consts) != 3:
                which = next(x for x in (st, sp, sc) if not isinstance(x, ir.Const))
                what = describe(which) if not isinstance(which, ir.Binary) else "a bound"
                self.diags.error(f"an 'unroll' loop needs constant bounds and step, but {what} "
                                 "is computed when the kernel runs; use numbers, constants or "
                                 "compile-time parameters (kernel k<N: u32>), or drop 'unroll'",
                                 loc)
            elif sc.value != 0:  # type: ignore[attr-defined]
                n = len(range(int(st.value), int(sp.value), int(sc.value)))  # type: ignore[attr-defined]
                copies = n * prod(self.unroll_counts)
                if n > 256:
                    self.diags.error("an 'unroll' loop may have at most 256 iterations", loc)
                elif copies > MAX_UNROLLED:
                    self.diags.error(f"nested 'unroll' loops would copy this body {copies} "
                                     f"times; at most {MAX_UNROLLED} (unroll the inner loops "
                                     "only)", loc)
                else:
                    unroll_count = n
        self.push()
        self.unroll_counts.append(max(1, unroll_count))
        self._declare(var, Symbol("loopvar", ty, loc, "unroll" if unroll else None))
        return st, sp, sc, ty, unroll

    def for_stmt(self, var: str, header: tuple, loc: Span | None = None) -> None:
        body = self.pop()
        self.unroll_counts.pop()
        st, sp, sc, ty, unroll = header
        self.emit(ir.For(var=var, var_type=ty, start=st, stop=sp, step=sc, body=body,
                         unroll=unroll, loc=loc))

    def while_stmt(self, cond: ir.Expr, body: tuple[ir.Stmt, ...], loc: Span | None) -> None:
        self.emit(ir.While(cond=cond, body=body, loc=loc))

    def finish(self) -> ir.Kernel:
        if len(self.frames) != 1:
            raise AssertionError("unbalanced blocks in the kernel builder")
        deep = too_deep_ir(tuple(self.frames[0].stmts))
        if deep is not None:  # the Python API nests as deep as a loop makes it
            self.diags.error(f"kernel '{self.kernel_name}' nests blocks or expressions more "
                             f"than {MAX_NESTING} levels deep; split the expression with "
                             "let", deep.loc or self.loc)
            self.frames[0].stmts.clear()
        if self.smem_total > MAX_SMEM_BYTES:
            self.diags.error(f"kernel '{self.kernel_name}' declares {self.smem_total} bytes of "
                             f"shared memory; a CTA has at most {MAX_SMEM_BYTES}", self.loc)
        return ir.Kernel(name=self.kernel_name, params=tuple(self.params), threads=self.threads,
                         cluster=self.cluster, nonportable=self.nonportable,
                         maxnreg=self.maxnreg, minctas=self.minctas,
                         body=tuple(self.frames[0].stmts), loc=self.loc)
