"""Syntax errors of the .ptxdsl text: a lark parse error as one located diagnostic that says
what was found, what was expected, and (builder.hints) the usual fix."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import lark

from ..builder.hints import syntax_fix
from ..errors import Diagnostic, Source, Span

_TERMINAL_NAMES = {
    "NAME": "a name", "INT": "an integer", "FLOAT": "a number", "STRING": "a string",
    "SREG": "a special register (%tid.x, ...)", "COMPOUND": "a compound assignment",
    "$END": "end of file",
}  # fmt: skip


def _terminal_text(name: str, terminals: Collection[Any]) -> str:
    if name in _TERMINAL_NAMES:
        return _TERMINAL_NAMES[name]
    for t in terminals:
        if t.name == name:
            pat = t.pattern
            if isinstance(pat, lark.lexer.PatternStr):
                return f"'{pat.value}'"
    return name


def syntax_error(source: Source, e: lark.UnexpectedInput, terminals: Collection[Any]
                 ) -> Diagnostic:
    """The located diagnostic of a lark parse error; `terminals` the parser's, to name what
    was expected."""
    pos = getattr(e, "pos_in_stream", None)
    if isinstance(e, lark.UnexpectedToken):
        tok = e.token
        if tok.type == "$END":
            start = len(source.text.rstrip())
            span = Span(source, max(0, start - 1), start)
            what = "unexpected end of file"
        else:
            start = tok.start_pos if tok.start_pos is not None else 0
            span = Span(source, start, tok.end_pos or start + 1)
            kind = {"NAME": "name ", "INT": "integer ", "FLOAT": "number ", "STRING": "string ",
                    "SREG": "special register "}.get(tok.type, "")
            what = f"unexpected {kind}{str(tok)!r}"
        expected = sorted({_terminal_text(x, terminals) for x in e.expected})
        fix = syntax_fix(source, tok, expected)
        if fix is not None:
            what, span = fix[0], fix[1] or span
        elif tok.type == "$END" and "'}'" in expected:
            what += "; expected '}' (a block is not closed)"
        elif "';'" in expected and len(expected) > 3:
            # after a complete expression LALR also accepts every operator; name the usual fix
            what += "; expected ';' (or an operator)"
        elif expected:
            what += "; expected " + (expected[0] if len(expected) == 1 else
                                     "one of: " + ", ".join(expected))
        return Diagnostic(what, span)
    if isinstance(e, lark.UnexpectedCharacters):
        start = pos if pos is not None else 0
        ch = source.text[start : start + 1]
        return Diagnostic(f"unexpected character {ch!r}", Span(source, start, start + 1))
    start = pos or 0
    return Diagnostic("syntax error", Span(source, start, start + 1))
