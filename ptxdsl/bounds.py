"""Bounds on the compiler's own resources: an input that would exhaust the stack, the time
or the memory of a compile gets a located error instead.

- Nesting: blocks and expressions nested more than MAX_NESTING levels deep (a chain of
  thousands of `+`, ten thousand nested `if`s). The frontend measures its parse tree and the
  builder the IR of each kernel, iteratively, before any recursive pass walks them; the
  passes run with stack room for that depth (`stack_room`).
- Unrolling: nested `unroll` loops copy their innermost body at most MAX_UNROLLED times.
- Output: one kernel's PTX has at most MAX_PTX_LINES lines.
- Input: a source file has at most MAX_SOURCE_BYTES bytes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterator

from . import ir

MAX_NESTING = 256
MAX_UNROLLED = 4096
MAX_PTX_LINES = 2_000_000
MAX_SOURCE_BYTES = 64 << 20

# Python frames a pass may use per level of nesting, and for everything around it
_FRAMES_PER_LEVEL = 12
_FRAMES_BASE = 2000


@contextlib.contextmanager
def stack_room() -> Iterator[None]:
    """Run a recursive pass with recursion room for MAX_NESTING levels."""
    need = _FRAMES_BASE + _FRAMES_PER_LEVEL * MAX_NESTING
    old = sys.getrecursionlimit()
    if old >= need:
        yield
        return
    sys.setrecursionlimit(need)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def too_deep_ir(body: tuple[ir.Stmt, ...]) -> ir.Node | None:
    """The first IR node nested more than MAX_NESTING levels deep in `body`, or None."""
    stack: list[tuple[ir.Node, int]] = [(s, 1) for s in reversed(body)]
    while stack:
        node, depth = stack.pop()
        children = list(_children(node))
        if children and depth >= MAX_NESTING:
            return node  # the deepest level allowed: its operation is where to split
        stack.extend((child, depth + 1) for child in children)
    return None


def _children(node: ir.Node) -> Iterator[ir.Node]:
    if not dataclasses.is_dataclass(node):
        return
    for f in dataclasses.fields(node):
        if f.name == "loc":
            continue
        v = getattr(node, f.name)
        if isinstance(v, ir.Node):
            yield v
        elif isinstance(v, tuple):
            yield from (x for x in v if isinstance(x, ir.Node))
