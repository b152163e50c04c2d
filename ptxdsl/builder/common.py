"""What every part of the builder shares: untyped literals, symbols, scopes, name tables and
small type predicates."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .. import ir
from .. import types as T
from ..errors import Span
from ..target import MAX_SMEM_BYTES, MBARRIER_MAX_COUNT

__all__ = ["MAX_SMEM_BYTES", "MBARRIER_MAX_COUNT"]

MAX_REG_ARRAY = 256  # elements of one register array (a thread has at most 255 registers)


@dataclass(frozen=True)
class Lit:
    """A compile-time value (int, float or bool) and where it was written: an untyped literal,
    or, with `type`, a typed constant (a `const`, a compile-time kernel parameter, a cast
    literal). Constants fold; a typed one meets only operands of its own type."""

    value: int | float | bool
    loc: Span | None = None
    type: T.Scalar | None = None


Operand = ir.Expr | Lit


def untyped(x: object) -> bool:
    """Whether `x` is a literal (or untyped constant) that takes its type from its context."""
    return isinstance(x, Lit) and x.type is None

SPECIAL_REGS: dict[str, T.Scalar] = {
    **{f"{r}.{d}": T.u32 for r in ("tid", "ntid", "ctaid", "nctaid") for d in "xyz"},
    **{f"{r}.{d}": T.u32 for r in ("clusterid", "nclusterid", "cluster_ctaid", "cluster_nctaid")
       for d in "xyz"},
    "laneid": T.u32, "warp": T.u32, "cluster_ctarank": T.u32, "cluster_nctarank": T.u32,
    "dynamic_smem_size": T.u32, "clock": T.u32, "clock64": T.u64, "globaltimer": T.u64,
}  # fmt: skip

# Value intrinsics: name -> (number of arguments, kinds accepted for the first argument).
FLOAT_UNARY = {"ex2", "lg2", "rsqrt", "sqrt", "rcp", "sin", "cos", "tanh"}
# composed from FLOAT_UNARY and arithmetic (fastmath.py); erf only says what to write instead
MATH_FUNCTIONS = {"exp", "exp2", "log", "log2", "sigmoid", "silu", "gelu", "erf"}
SHUFFLES = {"shfl_xor", "shfl_down", "shfl_up", "shfl_idx"}
VALUE_FUNCTIONS = FLOAT_UNARY | MATH_FUNCTIONS | SHUFFLES
VALUE_FUNCTIONS |= {"abs", "min", "max", "fma", "elect", "select", "vload", "sizeof", "frag"}
VALUE_FUNCTIONS |= {"peer", "cta_mask", "cluster_mask", "cluster_row_mask", "cluster_col_mask"}
VALUE_FUNCTIONS |= ir.ATOMIC_FUNCTIONS

ARITH_OPS = {"add", "sub", "mul", "div", "rem", "min", "max"}
BIT_OPS = {"and", "or", "xor"}
SHIFT_OPS = {"shl", "shr"}
HALF_OK = {"add", "sub", "mul", "min", "max"}

KEYWORDS = {"kernel", "ptr", "tmap", "shared", "align", "mbarrier", "count", "let", "if", "else",
            "for", "in", "step", "while", "return", "asm", "as", "true", "false", "pipeline",
            "stages", "role", "warps", "regs", "unroll", "const", "async", "assert",
            "turn", "schedule", "fn"}

BINARY_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/", "rem": "%", "and": "&",
                 "or": "|", "xor": "^", "shl": "<<", "shr": ">>", "land": "&&", "lor": "||",
                 "min": "min", "max": "max"}
COMPARE_SYMBOL = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
UNARY_SYMBOL = {"neg": "-", "not": "!"}

REGION_OPS = {"acquire": ("put", True), "commit": ("put", False), "wait": ("get", True),
              "release": ("get", False)}
REGION_CLOSER = {"put": "commit", "get": "release"}
REGION_OPENER = {"put": "acquire", "get": "wait"}


@dataclass
class Symbol:
    kind: str  # param | local | loopvar | shared | barrier | pipeline
    type: T.Type
    loc: Span | None
    decl: Any = None


@dataclass
class Frame:
    stmts: list[ir.Stmt] = field(default_factory=list)
    names: dict[str, Symbol] = field(default_factory=dict)
    # open pipeline regions of this block: pipeline -> (side, where each was opened, oldest
    # first); a consumer may hold several waited stages at once (a lagging release)
    regions: dict[str, tuple[str, list[Span | None]]] = field(default_factory=dict)


_PTX_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*|_[A-Za-z0-9_]+")


def ptx_name_ok(name: str) -> bool:
    """Whether `name` may name a kernel: a PTX identifier (a lone `_` is not one)."""
    return _PTX_NAME.fullmatch(name) is not None


def int_range(t: T.Scalar) -> tuple[int, int]:
    if t.is_signed:
        return -(1 << (t.nbits - 1)), (1 << (t.nbits - 1)) - 1
    return (-(1 << (t.nbits - 1)) if t.kind == "b" else 0), (1 << t.nbits) - 1


def is_err(t: T.Type) -> bool:
    return isinstance(t, T.ErrorType)


def is_int(t: T.Type) -> bool:
    return isinstance(t, T.Scalar) and t.is_int


def compatible(have: T.Type, want: T.Type) -> bool:
    return is_err(have) or is_err(want) or have == want


def describe(e: ir.Expr) -> str:
    if isinstance(e, (ir.SharedBuf, ir.BarrierObj, ir.Var)):
        return f"'{e.name}'"
    if isinstance(e, ir.Index):
        return f"{describe(e.base)}[...]"
    return "this expression"
