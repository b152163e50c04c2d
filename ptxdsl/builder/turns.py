"""Turns in the builder: `turn [if C] { ... }` inside a role of several warpgroups, whose
warpgroups then run the block one at a time (ir.Turn; lowering derives its barriers)."""

from __future__ import annotations

from .. import ir
from ..errors import Span
from .common import Operand
from .oneshot import OneShot


class Turns(OneShot):
    """turn blocks: checked here, lowered by `ptxdsl.lower.turns`."""

    def turn_begin(self, cond: Operand | None, loc: Span | None = None) -> tuple:
        """`turn [if C] { ... }`: the warpgroups of the enclosing role run the block one at a
        time (ir.Turn); with a compile-time condition that is false, a plain block."""
        on = True
        if cond is not None:
            lit = self.folded(cond, "the condition of 'turn if'", loc)
            on = lit is None or bool(lit.value)
        role = self.current_role
        if on and role is None:
            self.diags.error("turn { } belongs in a role: the role's warpgroups take turns", loc)
        elif on and role is not None:
            name, start, stop = role
            if start % 4 or stop % 4 or stop - start < 8:
                self.diags.error(f"turn {{ }} needs a role of two or more whole warpgroups to "
                                 f"take turns; role '{name}' has warps {start} .. {stop}", loc)
        if on and self.turn_open:
            self.diags.error("turn blocks do not nest", loc)
        outer = self.turn_open
        self.turn_open = self.turn_open or on
        self.push()
        return on, outer, loc

    def turn_end(self, header: tuple) -> None:
        on, outer, loc = header
        body = self.pop()
        self.turn_open = outer
        if on:
            self.emit(ir.Turn(body=body, loc=loc))
        else:
            for s in body:
                self.emit(s)
