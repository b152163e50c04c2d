"""What every check needs about one kernel, computed once; and the sink of diagnostics."""

from __future__ import annotations

import functools

from .. import ir
from ..codegen.layout import Layout, layout_kernel
from ..errors import Diagnostic, DiagnosticBag, Note, Span
from ..printer import expr_text
from ..target import Target
from .threads import Trace, interpret
from .unroll import Unroller


class Facts:
    def __init__(self, k: ir.Kernel, target: Target):
        self.kernel = k
        self.target = target
        self.n = k.nthreads
        asm = " ".join(s.template for s in ir.walk(k.body) if isinstance(s, ir.Asm))
        # Raw PTX may arrive on barriers or commit bulk groups behind the checks' back.
        self.asm_barriers = "mbarrier" in asm
        self.asm_bulk = "cp.async.bulk" in asm

    @functools.cached_property
    def layout(self) -> Layout:
        return layout_kernel(self.kernel)

    @functools.cached_property
    def statements(self) -> list[ir.Stmt]:
        """Every statement of the body, nested ones included, in source order."""
        return list(ir.walk(self.kernel.body))

    @functools.cached_property
    def trace(self) -> Trace:
        return interpret(self.kernel)

    @functools.cached_property
    def unroller(self) -> Unroller:
        return Unroller(self.trace)


class Report:
    """Adds diagnostics to a bag once each (a statement is visited once per loop pass)."""

    def __init__(self, diags: DiagnosticBag):
        self.diags = diags
        self.seen: set[tuple[str, str, int | None]] = set()

    def error(self, message: str, span: Span | None, *notes: Note) -> None:
        self._add("error", message, span, notes)

    def warning(self, message: str, span: Span | None, *notes: Note) -> None:
        self._add("warning", message, span, notes)

    def _add(self, severity: str, message: str, span: Span | None,
             notes: tuple[Note, ...]) -> None:
        key = (severity, message, span.start if span is not None else None)
        if key in self.seen:
            return
        self.seen.add(key)
        self.diags.items.append(Diagnostic(message, span, notes, severity))


def text(e: ir.Expr) -> str:
    """An expression as the user wrote it (canonical form). A pipeline stage is shown as the
    author wrote it, without the stage index the lowering added (its variable has a dot,
    which no user name has)."""
    if isinstance(e, ir.Index) and isinstance(e.indices[0], ir.Var) and "." in e.indices[0].name:
        rest = e.indices[1:]
        return text(e.base) if not rest else text(ir.Index(base=e.base, indices=rest,
                                                           type=e.type))
    return expr_text(e)
