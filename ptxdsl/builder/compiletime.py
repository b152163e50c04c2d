"""Compile-time constants: `const NAME[: T] = expr;` at module or kernel scope, and the
values of compile-time kernel parameters (`kernel k<N: u32 = 8192>(...)`).

A constant is a `Lit`: it folds with other constants and becomes an immediate where it is
used, so a kernel written with `N` builds the same IR as one written with the number.
A typed constant (`const N: u32`) meets only operands of its type, like a register; an
untyped one takes the type of what it meets, like a literal.
"""

from __future__ import annotations

from .. import ir
from .. import types as T
from ..errors import Span
from .common import Lit, Operand, Symbol, describe
from .decls import Declarations
from .hints import source_text
from .literals import LiteralError, float_literal, int_literal
from .named import ALLOWED, inline, reason, runtime_operand


class CompileTime(Declarations):
    """Constant declarations and constant operands of declarations."""

    def const(self, name: str, ty: T.Type | None, value: Operand, loc: Span | None = None
              ) -> Lit | None:
        """Declare constant `name`; its value must fold at compile time, or (inside `unroll`
        loops) be an expression of their variables, which folds in each unrolled copy."""
        if isinstance(value, ir.Expr) and not isinstance(value.type, T.ErrorType):
            self.const_expr(name, ty, value, loc)
            return None
        lit = self.folded(value, f"the value of constant '{name}'", loc)
        if lit is not None and ty is not None:
            if not isinstance(ty, T.Scalar):
                self.diags.error(f"constant '{name}' has type {ty}; constants are scalars "
                                 "(u32, f32, pred, ...)", loc)
                lit = None
            else:
                lit = self.const_of(lit, ty)
        if lit is None:
            self.poison(name, loc)
            return None
        lit = Lit(lit.value, loc, lit.type)
        self._declare(name, Symbol("const", lit.type or T.void, loc, lit))
        return lit

    def const_expr(self, name: str, ty: T.Type | None, value: ir.Expr, loc: Span | None
                   ) -> None:
        """`const NAME = expr;` of a value not folded: compile-time if it uses only constants
        and `unroll` loop variables (each use is the expression), else said why not."""
        bad = runtime_operand(value, self.lookup)
        if bad is not None:
            why, notes = reason(bad, self.lookup)
            self.diags.error(f"const {name} must be computable at compile time: {ALLOWED}; "
                             f"{why}", bad.loc or loc, *notes)
        elif ty is not None and ty != value.type:
            self.diags.error(f"constant '{name}' is declared {ty}, but its value is "
                             f"{value.type} (convert it with 'as {ty}')", loc)
        else:
            self._declare(name, Symbol("const", value.type, loc, inline(value, self.lookup,
                                                                         None)))
            return
        self.poison(name, loc)

    def folded(self, value: Operand, what: str, loc: Span | None) -> Lit | None:
        """`value` as a constant, or None after saying why it is not one."""
        if isinstance(value, Lit):
            return value
        if isinstance(value, list):
            self.diags.error(f"{what} must be a number, not a list", loc)
            return None
        if isinstance(value, ir.Expr) and isinstance(value.type, T.ErrorType):
            return None
        where = value.loc if isinstance(value, ir.Expr) and value.loc is not None else loc
        text = source_text(where) if isinstance(value, ir.Expr) else None
        this = f"'{text}'" if text else describe(value)  # type: ignore[arg-type]
        self.diags.error(f"{what} must be known at compile time, but {this} is computed when "
                         "the kernel runs (use numbers, constants and compile-time parameters)",
                         where)
        return None

    def static_assert(self, cond: Operand, message: str | None, text: str,
                      loc: Span | None = None) -> None:
        """`assert cond, "message";`: a compile-time check of constants (of a kernel's
        compile-time parameters, say), reported at the assertion."""
        lit = self.folded(cond, "an assertion", loc)
        if lit is None:
            return
        if not isinstance(lit.value, bool):
            self.diags.error(f"an assertion needs a condition (true or false), got "
                             f"{_show(lit.value)}", loc)
        elif not lit.value:
            why = f"{message} " if message else ""
            self.diags.error(f"compile-time assertion failed: {why}({text} is false)", loc)

    def poison(self, name: str, loc: Span | None) -> None:
        """Declare `name` as something whose declaration was wrong (and reported): its uses
        are quietly erroneous, so one mistake gives one message."""
        if self.lookup(name) is None:
            self._declare(name, Symbol("const", T.error, loc, None))

    def const_int(self, value: Operand, what: str, loc: Span | None) -> int | None:
        """An integer constant operand of a declaration (a buffer dimension, a stage count,
        a thread count...), or None after an error."""
        lit = self.folded(value, what, loc)
        if lit is None:
            return None
        if not isinstance(lit.value, int) or isinstance(lit.value, bool):
            self.diags.error(f"{what} must be an integer, got {_show(lit.value)}",
                             lit.loc or loc)
            return None
        return lit.value

    def generic_value(self, name: str, ty: T.Type | None, given: object,
                      loc: Span | None) -> Lit | None:
        """The value of compile-time parameter `name` given from outside (a -D string from the
        command line, or a Python number), converted to its type."""
        if not isinstance(ty, T.Scalar):
            return None
        v: object = given
        if isinstance(given, str):
            text = given.strip()
            try:
                if ty.is_pred:
                    v = {"true": True, "false": False, "1": True, "0": False}[text.lower()]
                elif ty.is_float:
                    v = float_literal(text)
                else:
                    v = int_literal(text)
            except LiteralError as e:
                self.diags.error(f"-D {name}={given}: {e}", loc)
                return None
            except KeyError:
                self.diags.error(f"-D {name}={given}: expected {_kind(ty)} for '{name}: {ty}'",
                                 loc)
                return None
        if not isinstance(v, (bool, int, float)):
            self.diags.error(f"the value given for '{name}: {ty}' is a {type(v).__name__}; "
                             "expected a number", loc)
            return None
        return self.const_of(Lit(v, loc), ty)


def _kind(ty: T.Scalar) -> str:
    if ty.is_pred:
        return "true or false"
    return "a number" if ty.is_float else "an integer"


def _show(v: object) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else repr(v)
