"""Walking the IR: the blocks of any statement, found from its fields, and the one walker
over statements (`sites`, `walk`) and over the expressions a node holds (`node_fields`,
`has_expr`). A statement class with a field typed `tuple[Stmt, ...]` is a block kind that
every pass enters without a change here."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import fields, replace
from typing import Any, TypeVar, get_type_hints

from .core import Expr, For, If, Node, Stmt, Var, While

_S = TypeVar("_S", bound=Stmt)
_E = TypeVar("_E", bound=Node)

_BLOCK_FIELDS: dict[type, tuple[str, ...]] = {}


def block_fields(cls: type[Stmt]) -> tuple[str, ...]:
    """The fields of a statement class that hold nested statements (`tuple[Stmt, ...]`): its
    blocks. Found from the declared field types, so a new block kind is entered by every
    walker without a change here."""
    names = _BLOCK_FIELDS.get(cls)
    if names is None:
        hints = get_type_hints(cls)
        names = _BLOCK_FIELDS[cls] = tuple(f.name for f in fields(cls)
                                           if hints[f.name] == tuple[Stmt, ...])
    return names


def blocks(s: Stmt) -> tuple[tuple[Stmt, ...], ...]:
    """The nested statement lists of `s` (if/else arms, loop, role, turn and async bodies)."""
    return tuple(getattr(s, name) for name in block_fields(type(s)))


def with_blocks(s: _S, rewrite: Callable[[tuple[Stmt, ...]], tuple[Stmt, ...]]) -> _S:
    """`s` with each of its blocks replaced by `rewrite(block)`; `s` itself if it has none."""
    names = block_fields(type(s))
    if not names:
        return s
    new: dict[str, Any] = {name: rewrite(getattr(s, name)) for name in names}
    return replace(s, **new)


Path = tuple[tuple[Expr, bool], ...]  # the conditions of the ifs around a statement, each
# with the arm taken (True: `then`)


def sites(stmts: tuple[Stmt, ...], *, enter: Callable[[Stmt], bool] | None = None,
          path: Path = (), loop: Stmt | None = None
          ) -> Iterator[tuple[Stmt, Path, Stmt | None]]:
    """Every statement of `stmts` and of every block nested in them, in source order (each
    before its blocks), as (statement, its path, the innermost For or While around it). A
    walk stops where its consumer stops reading. `enter(s)` False keeps the walk out of the
    blocks of `s` (`s` itself is still met). Plain tuples: the verifier walks often."""
    for s in stmts:
        yield s, path, loop
        names = _BLOCK_FIELDS.get(type(s))
        if names is None:
            names = block_fields(type(s))
        if not names or (enter is not None and not enter(s)):
            continue
        inner = s if isinstance(s, (For, While)) else loop
        for name in names:
            arm = ((s.cond, name == "then"),) if isinstance(s, If) else ()
            yield from sites(getattr(s, name), enter=enter, path=path + arm, loop=inner)


def walk(stmts: tuple[Stmt, ...], *, enter: Callable[[Stmt], bool] | None = None
         ) -> Iterator[Stmt]:
    """The statements of `sites(stmts, enter=enter)`, without their surroundings."""
    return (site[0] for site in sites(stmts, enter=enter))


_NODE_FIELDS: dict[type, tuple[str, ...]] = {}


def node_fields(x: Node) -> tuple[str, ...]:
    """The fields of a node that may hold expressions (not `loc`, types or nested bodies)."""
    names = _NODE_FIELDS.get(type(x))
    if names is None:
        nested = block_fields(type(x)) if isinstance(x, Stmt) else ()
        names = tuple(f for f in x.__dataclass_fields__
                      if f not in ("loc", "type", *nested))
        _NODE_FIELDS[type(x)] = names
    return names


def has_expr(x: object, cls: type | tuple[type, ...]) -> bool:
    """Whether a node (or a tuple of them) holds an expression of class `cls`."""
    if isinstance(x, tuple):
        return any(has_expr(y, cls) for y in x)
    if not isinstance(x, Node):
        return False
    if isinstance(x, cls):
        return True
    return any(has_expr(getattr(x, name), cls) for name in node_fields(x))


def exprs_of(x: object, cls: type[_E]) -> list[_E]:
    """Every expression of class `cls` a node holds (or a tuple of them): a statement's own
    expressions, its nested blocks left out; inside a match too."""
    out: list[_E] = []
    stack = [x]
    while stack:
        y = stack.pop()
        if isinstance(y, tuple):
            stack.extend(y)
        elif isinstance(y, Node):
            if isinstance(y, cls):
                out.append(y)
            stack.extend(getattr(y, name) for name in node_fields(y))
    return out


def free_names(x: object) -> set[str]:
    """The variables a node reads: an expression's, or a statement's own expressions (its
    nested blocks left out), or those of a tuple of nodes."""
    out: set[str] = set()
    stack = [x]
    while stack:
        y = stack.pop()
        if isinstance(y, Var):
            out.add(y.name)
        elif isinstance(y, tuple):
            stack.extend(y)
        elif isinstance(y, Node):
            stack.extend(getattr(y, name) for name in node_fields(y))
    return out
