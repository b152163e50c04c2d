"""The operation registry: one `OpDef` per intrinsic statement (an `ir.Op` subclass).

An OpDef declares, in one class, everything the compiler knows about one operation:
- `operands`: its signature, `(name, kind, optional)` in call order (kinds are checked by the
  builder, see `builder.operands`); the printer writes calls from it;
- `check(node, err)`: the semantic rules that need more than one operand or a constant;
- `emit(e, node)`: its PTX, through the emitter `e` (`e.w.instr(...)`, `e.ev(...)`, ...);
- `interp(c, node)`: its CPU-interpreter semantics, compiled once into a `Step`;
- `async_reads`: whether its copies read shared memory through the async proxy;
- `effect`: what it does to barriers and shared memory, in operand roles (`Effect`), which
  the verifier's checks read, and the kinds of statement that checks and lowerings single out
  (a multicast, a cluster barrier, a wgmma, an Ampere cp.async);
- `sm80`: what the sm_80 lowering does with it where it is not rewritten there;
- `needs`: the feature a target must have to emit it (`ptxdsl.target.Target`).

The families live in `ptxdsl/ops/` and register themselves when `ptxdsl` is imported. This
module sits below the builder, printer, emitter and interpreter, which consult `REGISTRY`
and never import the families: the dependency points one way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from . import ir

if TYPE_CHECKING:
    from .errors import Span

Operand = tuple[str, str, bool]  # (field name, kind, optional)
ErrorFn = Callable[..., Any]  # err(message, span, *notes)


@dataclass(frozen=True)
class Effect:
    """What an operation does to barriers and shared memory, as the verifier sees it. Each
    role names a field of the IR node (or is None); the checks read operands through these
    roles, never from the operation classes themselves."""

    arrive: str | None = None  # arrives on this barrier (once, or `count` times)
    count: str | None = None  # arrivals per thread for `arrive`, expected ones for `init`
    expect: str | None = None  # raises this barrier's tx count by `size` bytes
    complete: str | None = None  # the copy completes its bytes on this barrier
    wait: str | None = None
    parity: str | None = None
    init: str | None = None
    inval: str | None = None
    async_read: str | None = None  # shared operand read by the async proxy (bulk group)
    async_write: str | None = None  # shared operand written by the async proxy
    global_operand: str | None = None
    size: str | None = None  # byte count; a copy without one moves its whole shared view
    tma: bool = False  # tensor copy: 128-byte aligned shared operand, box limits
    one_thread: bool = False  # meant to be issued by one thread
    multicast: bool = False  # writes its bytes into every CTA of a mask (and arrives there)
    peer: bool = False  # writes another CTA's shared memory (the cluster checks follow it)
    cluster_barrier: str | None = None  # "arrive", "wait", or "sync" (both) at the cluster barrier
    wgmma: bool = False  # a step of the warpgroup MMA protocol (fence, mma, commit, wait)
    cp_async: str | None = None  # Ampere cp.async: "copy", or "completes" (a wait or arrive-on)
    pipeline: bool = False  # acquire, commit, wait or release: lowered to the stage barriers
    named_barrier: str | None = None  # bar.sync / bar.arrive on the named barrier this names
    publishes: bool = False  # makes the thread's fenced shared-memory writes visible to others

    @property
    def barrier_fields(self) -> tuple[str, ...]:
        return tuple(f for f in (self.arrive, self.expect, self.complete, self.wait, self.init,
                                 self.inval) if f is not None)

    @property
    def shared_operand(self) -> str | None:
        return self.async_read or self.async_write

    @property
    def loads_global(self) -> bool:
        """A copy from global memory into this CTA's shared memory (TMA or bulk)."""
        return self.complete is not None and (self.tma or self.global_operand is not None)

    @property
    def cluster_wait(self) -> bool:
        """Waits until every CTA of the cluster has arrived (cluster_sync, cluster_wait)."""
        return self.cluster_barrier in ("wait", "sync")


NO_EFFECT = Effect()


class OpDef:
    """Base class of an operation's definition; subclasses set `node` and override what
    applies. `emit` and `interp` default to errors for nodes that lowering removes."""

    node: ClassVar[type[ir.Op]]
    operands: ClassVar[tuple[Operand, ...]] = ()
    async_reads: ClassVar[bool] = False
    effect: ClassVar[Effect] = NO_EFFECT
    # on sm_80, where the sm80 lowering does not rewrite it: "keep" (as it is), "keep_one"
    # (as it is, on the one thread of a block widened to its warp), "drop" (it has no work
    # there); "" refuses it
    sm80: ClassVar[str] = ""
    needs: ClassVar[str] = ""  # the `Target` feature flag it needs ("wgmma", ...), "" none

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


def defined(s: ir.Stmt) -> OpDef | None:
    """The definition of a statement's operation; None for a statement of the core IR."""
    return REGISTRY.get(type(s))  # type: ignore[arg-type]


def effect(s: ir.Stmt) -> Effect:
    """The effect of a statement: its operation's, or none (a statement of the core IR)."""
    d = defined(s)
    return NO_EFFECT if d is None else d.effect


def const_int(e: object) -> int | None:
    """The value of an integer constant expression, else None."""
    if isinstance(e, ir.Const) and isinstance(e.value, int) and not isinstance(e.value, bool):
        return e.value
    return None
