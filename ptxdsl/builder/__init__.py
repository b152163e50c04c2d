"""The kernel builder: the one place that type-checks and constructs IR.

Both frontends call it: the tree walker of the text frontend (`frontend/parser.py`) and the
Python API (`api.py`). It never raises on the first problem; every error goes to a
DiagnosticBag with its span.
Layers, each a module of one concept: `scope` (state and names) <- `exprs` (typing of
expressions) <- `decls` (declarations, pipeline regions, roles) <- `stmts` (statements and
the finished kernel) <- `schedule` (tile schedules, desugared into statements; the
`KernelBuilder` of both frontends). `operands` checks the operands of intrinsic operations
against their OpDef. `atomic`, `cluster` and `fastmath` sit above `exprs`: they register their
built-in functions (and `peer()` views) with it, which never imports them.
"""

# The function families register with the expression builder (exprs.CALLS) when imported.
from . import atomic, cluster, fastmath, fragments, vectors  # noqa: F401
from .common import (
    BINARY_SYMBOL,
    COMPARE_SYMBOL,
    KEYWORDS,
    MAX_SMEM_BYTES,
    MBARRIER_MAX_COUNT,
    SPECIAL_REGS,
    UNARY_SYMBOL,
    VALUE_FUNCTIONS,
    Lit,
    Operand,
    Symbol,
)
from .schedule import KernelBuilder

__all__ = ["BINARY_SYMBOL", "COMPARE_SYMBOL", "KEYWORDS", "MAX_SMEM_BYTES", "MBARRIER_MAX_COUNT",
           "SPECIAL_REGS", "UNARY_SYMBOL", "VALUE_FUNCTIONS", "KernelBuilder", "Lit", "Operand",
           "Symbol"]
