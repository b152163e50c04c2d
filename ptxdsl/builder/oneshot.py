"""One-shot asynchronous loads in the builder: `async name { copies }` opens a block whose
copies complete on the load's derived barrier; `await(name)` (an operation) waits for it.
The name is visible in the whole kernel, so any role can await it."""

from __future__ import annotations

from .. import ir
from .. import types as T
from ..errors import Note, Span
from ..opdef import OpDef
from .common import KEYWORDS, VALUE_FUNCTIONS, Operand, Symbol
from .compiletime import CompileTime


class OneShot(CompileTime):
    """async blocks and the barrier operand their copies derive."""

    async_open: tuple[str, Span | None] | None = None

    def async_begin(self, name: str, loc: Span | None = None) -> tuple:
        if self.async_open is not None:
            self.diags.error(f"async '{name}' is inside async '{self.async_open[0]}'; one-shot "
                             "loads do not nest", loc)
        prev = self.lookup(name)
        if prev is not None:
            self.diags.error(f"'{name}' is already declared", loc,
                             Note(f"'{name}' was declared here", prev.loc))
        elif name in KEYWORDS or name in VALUE_FUNCTIONS:
            self.diags.error(f"'{name}' is a built-in name and cannot be declared", loc)
        else:  # kernel-wide: other roles await it
            self.frames[0].names[name] = Symbol("async", T.AsyncRef(), loc)
        outer = self.async_open
        self.async_open = (name, loc)
        self.push()
        return name, outer, loc

    def async_end(self, header: tuple, loc: Span | None = None) -> ir.Expr:
        name, outer, name_loc = header
        body = self.pop()
        self.async_open = outer
        self.emit(ir.AsyncLoad(name=name, body=body, loc=name_loc))
        return ir.AsyncObj(name=name, type=T.AsyncRef(), loc=name_loc)

    def async_operands(self, d: OpDef, args: list[Operand], loc: Span | None) -> list[Operand]:
        """Inside an async block, a copy's omitted barrier is the load's own."""
        if self.async_open is None:
            return args
        names = [n for n, kind, optional in d.operands if kind == "bar" and optional]
        if not names:
            return args
        at = [n for n, _, _ in d.operands].index(names[0])
        if len(args) > at:
            self.diags.error(f"inside async '{self.async_open[0]}', {d.syntax} completes on the "
                             "load's own barrier; leave out the barrier argument", loc)
            return args
        bar = ir.AsyncBarrier(name=self.async_open[0], type=T.BarrierRef(0), loc=loc)
        return [*args, bar] if len(args) == at else args
