"""Source spans, diagnostics and their rendering.

A span is a pair of character offsets into a `Source`; it becomes `file:line:col` and a
caret underline only when a diagnostic is printed.
"""

from __future__ import annotations

import linecache
import os
from dataclasses import dataclass, field


@dataclass(frozen=True, eq=False)
class Source:
    """The text of one input file (a .ptxdsl file or the Python file of an API call)."""

    name: str
    text: str

    def line_col(self, offset: int) -> tuple[int, int]:
        """1-based line and column of a character offset."""
        offset = max(0, min(offset, len(self.text)))
        line = self.text.count("\n", 0, offset) + 1
        start = self.text.rfind("\n", 0, offset) + 1
        return line, offset - start + 1

    def line_text(self, line: int) -> str:
        lines = self.text.split("\n")
        return lines[line - 1] if 0 < line <= len(lines) else ""

    def offset(self, line: int, col: int) -> int:
        """Character offset of a 1-based line and 0-based column."""
        lines = self.text.split("\n")
        return sum(len(x) + 1 for x in lines[: line - 1]) + col


_python_sources: dict[str, Source] = {}


def python_source(path: str) -> Source:
    """The Source of a Python file, cached, for spans of Python-API calls."""
    src = _python_sources.get(path)
    if src is None:
        src = Source(path, "".join(linecache.getlines(path)))
        _python_sources[path] = src
    return src


@dataclass(frozen=True, eq=False)
class Span:
    """A half-open range [start, end) of character offsets in a Source."""

    source: Source
    start: int
    end: int

    @property
    def line(self) -> int:
        return self.source.line_col(self.start)[0]

    @property
    def col(self) -> int:
        return self.source.line_col(self.start)[1]

    def __str__(self) -> str:
        line, col = self.source.line_col(self.start)
        return f"{_display_name(self.source.name)}:{line}:{col}"


def _display_name(name: str) -> str:
    if os.path.isabs(name):
        try:
            rel = os.path.relpath(name)
        except ValueError:
            return name
        return rel if not rel.startswith("..") else name
    return name


@dataclass(frozen=True)
class Note:
    message: str
    span: Span | None = None


@dataclass(frozen=True)
class Diagnostic:
    """One user-facing problem: a message, where it is, and notes pointing at related sites."""

    message: str
    span: Span | None = None
    notes: tuple[Note, ...] = ()
    severity: str = "error"

    def render(self) -> str:
        out = [_render_one(self.severity, self.message, self.span)]
        for note in self.notes:
            out.append(_render_one("note", note.message, note.span))
        return "\n".join(out)


_EXCERPT = 160  # characters of a source line shown under a diagnostic


def _render_one(severity: str, message: str, span: Span | None) -> str:
    if span is None:
        return f"{severity}: {message}"
    line, col = span.source.line_col(span.start)
    text = span.source.line_text(line).rstrip("\r")
    if not text.strip():  # a file-level problem (empty or unreadable file): no excerpt
        return f"{span}: {severity}: {message}"
    end_line, end_col = span.source.line_col(max(span.start, span.end))
    width = (end_col - col) if end_line == line else (len(text) - col + 1)
    width = max(1, width)
    if len(text) > _EXCERPT:  # a very long line (generated code): the part around the caret
        first = max(0, col - 1 - _EXCERPT // 3)
        last = min(len(text), first + _EXCERPT)
        text = ("..." if first else "") + text[first:last] + ("..." if last < len(text) else "")
        col = col - first + (3 if first else 0)
        width = min(width, len(text) - col + 1)
    # Keep tabs so the caret lines up under the same glyphs.
    pad = "".join("\t" if ch == "\t" else " " for ch in text[: col - 1])
    caret = pad + "^" + "~" * (width - 1)
    return f"{span}: {severity}: {message}\n{text}\n{caret}"


class PtxdslError(Exception):
    """Base of every error ptxdsl raises for bad input; carries located diagnostics."""

    def __init__(self, diagnostics: list[Diagnostic] | Diagnostic | str):
        if isinstance(diagnostics, str):
            diagnostics = [Diagnostic(diagnostics)]
        elif isinstance(diagnostics, Diagnostic):
            diagnostics = [diagnostics]
        self.diagnostics: list[Diagnostic] = list(diagnostics)
        super().__init__(self.render())

    def render(self) -> str:
        body = "\n".join(d.render() for d in self.diagnostics)
        n = sum(1 for d in self.diagnostics if d.severity == "error")
        if n > 1:
            body += f"\n{n} errors generated."
        return body

    def __str__(self) -> str:
        return self.render()


class CompileError(PtxdslError):
    """The input (text or Python-API calls) is not a valid ptxdsl kernel."""


class LaunchError(PtxdslError):
    """Arguments, tensor maps or launch settings do not fit the kernel or the device."""


class DeviceError(PtxdslError):
    """A CUDA driver call failed, or the GPU reported a fault or a hang."""


@dataclass
class DiagnosticBag:
    """Collects diagnostics so that every problem of an input is reported at once."""

    items: list[Diagnostic] = field(default_factory=list)

    def error(self, message: str, span: Span | None = None, *notes: Note) -> None:
        self.items.append(Diagnostic(message, span, tuple(notes)))


    def __bool__(self) -> bool:
        return any(d.severity == "error" for d in self.items)

    def raise_if_any(self, cls: type[PtxdslError] = CompileError) -> None:
        if self:
            raise cls(sorted(self.items, key=_order))


def _order(d: Diagnostic) -> tuple[str, int]:
    if d.span is None:
        return ("", -1)
    return (d.span.source.name, d.span.start)
