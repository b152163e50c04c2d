"""The operation registry: one `OpDef` per intrinsic statement (an `ir.Op` subclass).

An OpDef declares, in one class, everything the compiler knows about one operation:
- `operands`: its signature, `(name, kind, optional)` in call order (kinds are checked by the
  builder, see `builder.operands`); the printer writes calls from it;
- `check(node, err)`: the semantic rules that need more than one operand or a constant;
- `emit(e, node)`: its PTX, through the emitter `e` (`e.w.instr(...)`, `e.ev(...)`, ...);
- `interp(c, node)`: its CPU-interpreter semantics, compiled once into a `Step`;
- `async_reads`: whether its copies read shared memory through the async proxy.

The families live in `ptxdsl/ops/` and register themselves when `ptxdsl` is imported. This
module sits below the builder, printer, emitter and interpreter, which consult `REGISTRY`
and never import the families: the dependency points one way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from . import ir

if TYPE_CHECKING:
    from .errors import Span

Operand = tuple[str, str, bool]  # (field name, kind, optional)
ErrorFn = Callable[..., Any]  # err(message, span, *notes)


class OpDef:
    """Base class of an operation's definition; subclasses set `node` and override what
    applies. `emit` and `interp` default to errors for nodes that lowering removes."""

    node: ClassVar[type[ir.Op]]
    operands: ClassVar[tuple[Operand, ...]] = ()
    async_reads: ClassVar[bool] = False

    @property
    def syntax(self) -> str:
        return self.node.syntax

    def signature(self) -> str:
        parts = [f"{name}?" if opt else name for name, _, opt in self.operands]
        return f"{self.syntax}({', '.join(parts)})"

    def derive(self, values: dict[str, Any], loc: Span | None) -> str | None:
        """Fill omitted optional operands that are derived from others (a byte count from
        the shared operand, say); return an error message if one cannot be derived."""
        return None

    def check(self, node: Any, err: ErrorFn) -> None:
        """Semantic rules on a well-typed node; report with err(message, span)."""

    def omitted(self, node: Any, name: str) -> bool:
        """Whether the printer may leave operand `name` out (it equals what derive gives)."""
        return getattr(node, name) is None

    def emit(self, e: Any, node: Any) -> None:
        raise TypeError(f"{self.syntax} is removed by lowering and has no PTX of its own")

    def interp(self, c: Any, node: Any) -> Any:
        raise TypeError(f"{self.syntax} is removed by lowering; the interpreter runs the "
                        "lowered kernel")


REGISTRY: dict[type[ir.Op], OpDef] = {}
BY_SYNTAX: dict[str, OpDef] = {}


def register(cls: type[OpDef]) -> type[OpDef]:
    """Class decorator: make `cls` the definition of `cls.node`."""
    d = cls()
    if cls.node in REGISTRY or d.syntax in BY_SYNTAX:
        raise AssertionError(f"operation {d.syntax} is defined twice")
    names = [n for n, _, _ in cls.operands]
    fields = [f.name for f in dataclasses.fields(cls.node) if f.name != "loc"]
    if names != fields[: len(names)]:
        raise AssertionError(f"{d.syntax}: operands {names} must start the fields {fields}")
    REGISTRY[cls.node] = d
    BY_SYNTAX[d.syntax] = d
    return cls


class ExprDef:
    """Definition of a value-producing intrinsic that is an expression node of its own
    (an atomic, an acquire load): its PTX (`emit` returns the result register) and its
    interpreter semantics (`interp` returns a closure `f(thread) -> value`)."""

    node: ClassVar[type[ir.Expr]]

    def emit(self, e: Any, node: Any) -> str:
        raise NotImplementedError

    def interp(self, c: Any, node: Any) -> Callable[[Any], Any]:
        raise NotImplementedError


EXPR_REGISTRY: dict[type[ir.Expr], ExprDef] = {}


def register_expr(cls: type[ExprDef]) -> type[ExprDef]:
    """Class decorator: make `cls` the definition of the expression class `cls.node`."""
    if cls.node in EXPR_REGISTRY:
        raise AssertionError(f"expression {cls.node.__name__} is defined twice")
    EXPR_REGISTRY[cls.node] = cls()
    return cls


def definition(node: ir.Op | type[ir.Op]) -> OpDef:
    cls = node if isinstance(node, type) else type(node)
    try:
        return REGISTRY[cls]
    except KeyError:
        raise TypeError(f"no operation definition for {cls.__name__}") from None


def const_int(e: object) -> int | None:
    """The value of an integer constant expression, else None."""
    if isinstance(e, ir.Const) and isinstance(e.value, int) and not isinstance(e.value, bool):
        return e.value
    return None
