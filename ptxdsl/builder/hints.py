"""The 'what to write' of error messages: conversions spelled in the language the user wrote
(`x as f32` in .ptxdsl text, `x.to(ptxdsl.f32)` in Python), and the names newcomers bring
from C, CUDA and Python."""

from __future__ import annotations

import difflib
import re
from typing import Any

from .. import ir
from .. import types as T
from ..errors import Source, Span
from .common import FLOAT_UNARY, MATH_FUNCTIONS, VALUE_FUNCTIONS

# type names from C / CUDA / Python / numpy and the ptxdsl name they mean
TYPE_ALIASES = {
    "float": "f32", "float32": "f32", "double": "f64", "float64": "f64", "half": "f16",
    "float16": "f16", "bfloat16": "bf16", "__nv_bfloat16": "bf16", "int": "s32",
    "int32": "s32", "int32_t": "s32", "i32": "s32", "long": "s64", "int64": "s64",
    "int64_t": "s64", "i64": "s64", "unsigned": "u32", "uint": "u32", "uint32": "u32",
    "uint32_t": "u32", "uint64": "u64", "uint64_t": "u64", "size_t": "u64", "bool": "pred",
    "char": "s8", "int8": "s8", "uint8": "u8", "uint8_t": "u8", "int16": "s16",
    "uint16": "u16", "short": "s16",
}  # fmt: skip

# names from other languages that the language spells differently
NAME_ALIASES = {"True": "true", "False": "false", "None": None, "nullptr": None,
                "threadIdx": "%tid", "blockIdx": "%ctaid", "blockDim": "%ntid",
                "gridDim": "%nctaid", "__syncthreads": "bar_sync(0)"}

# words of other languages that the grammar meets where an operator would go
WORD_OPERATORS = {"and": "&&", "or": "||", "not": "!"}


def type_hint(name: str) -> str:
    """'; did you mean f32?' for a C or Python type name, else ''."""
    alias = TYPE_ALIASES.get(name)
    return f"; did you mean '{alias}'?" if alias else ""


def name_hint(name: str) -> str:
    alias = NAME_ALIASES.get(name, "")
    if alias:
        return f"; did you mean '{alias}'?"
    return ""


def function_hint(name: str) -> str:
    """'; did you mean 'exp'?' (the closest known functions) and the math functions, for an
    unknown function `name` (`expf`, `sigmod`, `__expf`)."""
    close = difflib.get_close_matches(name.strip("_").removesuffix("f") or name,
                                      sorted(VALUE_FUNCTIONS), n=3, cutoff=0.6)
    close = close or difflib.get_close_matches(name, sorted(VALUE_FUNCTIONS), n=3, cutoff=0.6)
    mean = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    maths = " ".join(sorted((FLOAT_UNARY | MATH_FUNCTIONS) - {"erf"}))
    return f"{mean} (the math functions: {maths})"


def source_text(loc: Span | None) -> str | None:
    if loc is None:
        return None
    text = loc.source.text[loc.start:loc.end]
    return text if text and "\n" not in text and len(text) <= 40 else None


def in_python(loc: Span | None) -> bool:
    return loc is not None and loc.source.name.endswith(".py")


def convert(e: ir.Expr, ty: T.Type) -> str:
    """How to write `e` converted to `ty`: `n as f32` or, in Python, `n.to(ptxdsl.f32)`;
    '' when the expression's text is not at hand."""
    if in_python(e.loc):
        name = e.name if isinstance(e, ir.Var) else None
        return f"{name}.to(ptxdsl.{ty})" if name else ""
    text = source_text(e.loc)
    if text is None:
        return ""
    simple = text.replace("_", "").replace(".", "").replace("%", "").isalnum()
    return f"{text if simple else f'({text})'} as {ty}"


def convert_hint(e: ir.Expr, ty: T.Type) -> str:
    """The fix for a value of the wrong scalar type: '; convert it: n as f32'."""
    if not isinstance(e.type, T.Scalar) or not isinstance(ty, T.Scalar):
        if isinstance(e.type, T.Ptr) and isinstance(ty, T.Scalar) and \
                e.type.elem == ty and (text := source_text(e.loc)):
            return f"; read an element through the pointer: {text}[i]"
        return ""
    if ty.is_pred:
        text = source_text(e.loc)
        return f"; compare it instead: {text} != 0" if text and not in_python(e.loc) else ""
    fix = convert(e, ty)
    return f"; convert it: {fix}" if fix else " (convert it with 'as')"


def syntax_fix(source: Source, tok: Any, expected: list[str]) -> tuple[str, Span | None] | None:
    """Syntax errors with one obvious fix: habits from C and Python, a missing ';'."""
    text = str(tok)
    start = tok.start_pos or 0
    after_expr = "';'" in expected or "'{'" in expected
    if text == "=" and after_expr:
        return "unexpected '='; to compare, write '=='", None
    if text in WORD_OPERATORS and tok.type == "NAME" and after_expr:
        return f"unexpected name '{text}'; write '{WORD_OPERATORS[text]}'", None
    if text in ("+", "-") and source.text[start + 1 : start + 2] == text:
        name = re.search(r"([A-Za-z_][A-Za-z_0-9]*)\s*$", source.text[:start])
        target = f"{name.group(1)} " if name else ""
        return (f"there is no '{text * 2}' operator; write '{target}{text}= 1;'",
                Span(source, start, start + 2))
    if "';'" in expected and tok.type != "$END":
        # the statement before ended at a line break: point there, not at the next line
        before = source.text[:start].rstrip()
        if "\n" in source.text[len(before) : start] and before and before[-1] not in ";{}":
            return "expected ';' at the end of this statement", Span(source, len(before) - 1,
                                                                      len(before))
    return None
