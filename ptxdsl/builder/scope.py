"""The builder's state: the kernel's launch shape, the scope stack and its declarations,
and the statement lists being built. Every error goes to a DiagnosticBag with its span."""

from __future__ import annotations

from math import prod
from typing import Any

from .. import ir
from .. import types as T
from ..errors import DiagnosticBag, Note, Span
from ..opdef import BY_SYNTAX
from ..target import PORTABLE_CLUSTER
from .common import (
    KEYWORDS,
    MATH_FUNCTIONS,
    REGION_CLOSER,
    REGION_OPENER,
    VALUE_FUNCTIONS,
    Frame,
    Symbol,
)
from .named import unread_lets_dropped

# names a kernel cannot declare; the math functions' (`log`, `exp`) stay free: a call is
# told from a name by its parentheses, and `log` is a common buffer name
RESERVED = KEYWORDS | (VALUE_FUNCTIONS - MATH_FUNCTIONS) | set(BY_SYNTAX)


class Scope:
    """Launch shape, scopes and statement lists; the base of KernelBuilder."""

    def __init__(
        self,
        name: str,
        *,
        threads: tuple[int, ...] | int,
        cluster: tuple[int, ...] | int | None = None,
        maxnreg: int | None = None,
        minctas: int | None = None,
        nonportable: bool = False,
        loc: Span | None = None,
        diags: DiagnosticBag | None = None,
    ):
        self.diags = diags if diags is not None else DiagnosticBag()
        self.kernel_name = name
        self.loc = loc
        self.params: list[ir.Param] = []
        self.frames: list[Frame] = [Frame()]
        self.roles: list[ir.Role] = []
        self.current_role: tuple[str, int, int] | None = None
        self.turn_open = False  # inside a turn { } block
        self.smem_total = 0
        self.unroll_counts: list[int] = []  # iterations of each enclosing 'unroll' loop
        self.threads = self._dims("threads", threads, loc, upper=1024) or (1, 1, 1)
        self.cluster = (self._dims("cluster", cluster, loc, upper=16)
                        if cluster is not None else None)
        self.maxnreg = maxnreg
        self.minctas = minctas
        self.nonportable = nonportable
        if self.threads[0] * self.threads[1] * self.threads[2] > 1024:
            self.diags.error(f"threads: a CTA has at most 1024 threads, got "
                             f"{self.threads[0] * self.threads[1] * self.threads[2]}", loc)
        if maxnreg is not None and not (24 <= maxnreg <= 255):
            self.diags.error(f"maxnreg must be in [24, 255], got {maxnreg}", loc)
        if minctas is not None and minctas < 1:
            self.diags.error(f"minctas must be at least 1, got {minctas}", loc)
        if self.cluster is not None and self.cluster[0] * self.cluster[1] * self.cluster[2] > 16:
            self.diags.error("cluster: at most 16 CTAs per cluster", loc)
        elif self.cluster is not None and prod(self.cluster) > PORTABLE_CLUSTER and \
                not nonportable:
            self.diags.error(f"cluster: {prod(self.cluster)} CTAs exceed the portable cluster "
                             f"size of {PORTABLE_CLUSTER}; mark the kernel nonportable (clusters "
                             "of up to 16 CTAs)", loc)

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
        if name in RESERVED:
            self.diags.error(f"'{name}' is a built-in name and cannot be declared", sym.loc)
            return False
        self.frames[-1].names[name] = sym
        return True

    def emit(self, stmt: ir.Stmt) -> None:
        self.frames[-1].stmts.append(stmt)

    def push(self) -> None:
        self.frames.append(Frame())

    def pop(self) -> tuple[ir.Stmt, ...]:
        frame = self.frames.pop()
        for pipe, (side, locs) in frame.regions.items():
            for loc in locs:
                self.diags.error(f"{REGION_OPENER[side]}({pipe}) is not closed by "
                                 f"{REGION_CLOSER[side]}({pipe}) in the same block", loc)
        return unread_lets_dropped(frame)

    @property
    def at_top(self) -> bool:
        return len(self.frames) == 1
