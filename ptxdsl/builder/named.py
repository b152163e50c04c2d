"""Named compile-time values inside `unroll` loops: a `let` (until it is assigned) or a
`const` whose value is an expression of constants, compile-time parameters and `unroll` loop
variables is itself compile-time there, so it may index a register array.

Such an expression folds in each unrolled copy of the body; where a compile-time value is
needed the name is replaced by its expression, so `let a = q / 2; tv[a]` builds the IR of
`tv[q / 2]`. A `let` stays a register for every other use (its PTX does not change), and
one that served only as compile-time values is dropped when its block ends (no register, no
`mov`); a `const` is its expression everywhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from .. import ir
from ..errors import Note, Span
from .common import Frame, Symbol
from .hints import source_text

Lookup = Callable[[str], Symbol | None]

ALLOWED = "it may use constants, compile-time parameters and 'unroll' loop variables"


@dataclass
class LetValue:
    """What a scalar `let` is known to hold: `value`, its compile-time expression (only loop
    variables and constants left), while it has one; else `why` it has none and where that
    is (the operand read, or the assignment). `used`: where it first served as a
    compile-time value, after which it may no longer be assigned."""

    value: ir.Expr | None
    why: str = ""
    where: Span | None = None
    used: Span | None = None


def runtime_operand(e: ir.Expr, lookup: Lookup) -> ir.Expr | None:
    """The first operand of `e` that is not known at compile time, or None when `e` is an
    expression (+ - * / % & | ^ << >> min max) of constants, `unroll` loop variables and
    compile-time lets."""
    if isinstance(e, ir.Const):
        return None
    if isinstance(e, ir.Var):
        sym = lookup(e.name)
        if sym is not None and sym.kind == "loopvar" and sym.decl == "unroll":
            return None
        if sym is not None and isinstance(sym.decl, LetValue) and sym.decl.value is not None:
            return None
        return e
    if isinstance(e, ir.Binary):
        return runtime_operand(e.a, lookup) or runtime_operand(e.b, lookup)
    return e


def reason(e: ir.Expr, lookup: Lookup) -> tuple[str, tuple[Note, ...]]:
    """Why operand `e` (from runtime_operand) is not compile-time, and notes locating it."""
    text = source_text(e.loc)
    shown = f"'{text}'" if text else "this expression"
    if isinstance(e, ir.SReg):
        return f"'%{e.name}' is a special register, read when the kernel runs", ()
    if isinstance(e, ir.Load):
        return f"{shown} reads memory when the kernel runs", ()
    if not isinstance(e, ir.Var):
        return f"{shown} is computed when the kernel runs", ()
    sym = lookup(e.name)
    if sym is None:
        return f"'{e.name}' is computed when the kernel runs", ()
    if sym.kind == "param":
        return f"'{e.name}' is a kernel parameter, known only when the kernel runs", ()
    if sym.kind == "loopvar":
        return f"'{e.name}' is the variable of a loop without 'unroll'", ()
    if isinstance(sym.decl, LetValue):
        notes = (Note(f"'{e.name}' is assigned here", sym.decl.where),) \
            if sym.decl.why == "it is assigned" else ()
        return f"'{e.name}' is a 'let' that is not compile-time: {sym.decl.why}", notes
    return f"'{e.name}' is a register computed when the kernel runs", ()


def let_value(init: ir.Expr, lookup: Lookup) -> LetValue:
    """What a `let` initialised with `init` is known to hold."""
    bad = runtime_operand(init, lookup)
    if bad is None:
        return LetValue(inline(init, lookup, None))
    return LetValue(None, reason(bad, lookup)[0], bad.loc)


def inline(e: ir.Expr, lookup: Lookup, use: Span | None) -> ir.Expr:
    """Compile-time expression `e` with each compile-time let replaced by its expression;
    `use`, where it is used, marks those lets as used at compile time."""
    if isinstance(e, ir.Var):
        sym = lookup(e.name)
        if sym is not None and isinstance(sym.decl, LetValue) and sym.decl.value is not None:
            if use is not None and sym.decl.used is None:
                sym.decl.used = use
            return sym.decl.value
        return e
    if isinstance(e, ir.Binary):
        a, b = inline(e.a, lookup, use), inline(e.b, lookup, use)
        return e if a is e.a and b is e.b else dataclasses.replace(e, a=a, b=b)
    return e


def unread_lets_dropped(frame: Frame) -> tuple[ir.Stmt, ...]:
    """The statements of a finished block, less the `let`s that served only as compile-time
    values: read nowhere as registers (each use became its expression), and used as an index
    or named in such a dropped `let`. A `let` no index ever used stays, as it was."""
    known = {n: s.decl for n, s in frame.names.items()
             if isinstance(s.decl, LetValue) and s.decl.value is not None}
    dropped: set[str] = set()
    while any(v.used is not None for v in known.values()):  # else nothing served as one
        kept: set[str] = set()
        by_dropped: set[str] = set()
        for s in frame.stmts:
            into = by_dropped if isinstance(s, ir.Let) and s.name in dropped else kept
            for t in ir.walk((s,)):
                into |= ir.free_names(t)
        more = {n for n, v in known.items() if n not in dropped and n not in kept
                and (v.used is not None or n in by_dropped)}
        if not more:
            break
        dropped |= more
    return tuple(s for s in frame.stmts if not (isinstance(s, ir.Let) and s.name in dropped))

