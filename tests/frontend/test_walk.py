"""The one statement walker (`ir.walk` / `ir.sites`) enters every block of every statement
class, found here from the field annotations, so a new block kind cannot be missed."""

import dataclasses
import typing

import ptxdsl  # noqa: F401  (every IR module loaded)
from ptxdsl import ir
from ptxdsl import types as T


def _statement_classes() -> list[type]:
    out, todo = [], [ir.Stmt]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return out


def _holds_statements(annotation: object) -> bool:
    """Any annotation that names statements (a tuple, a list, an optional one...): looser than
    the walker's own rule, so a block the walker cannot see fails here."""
    return "Stmt" in str(annotation)


def _marked(cls: type) -> tuple[ir.Stmt, list[ir.Stmt]]:
    """An instance of `cls` whose every statement-holding field holds a marker of its own."""
    hints = typing.get_type_hints(cls)
    markers, values = [], {}
    for f in dataclasses.fields(cls):
        if _holds_statements(hints[f.name]):
            marker = ir.Assign(name=f"{cls.__name__}.{f.name}", value=ir.Const(value=0,
                                                                             type=T.u32))
            markers.append(marker)
            values[f.name] = (marker,)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            values[f.name] = ir.Const(value=1, type=T.pred) if f.name == "cond" else None
    return cls(**values), markers


def test_the_walker_enters_every_block_of_every_statement_class():
    kinds = [c for c in _statement_classes()
             if any(_holds_statements(h) for h in typing.get_type_hints(c).values())]
    # the block kinds of today, so the discovery above is known to work
    assert {ir.If, ir.For, ir.While, ir.Role, ir.Turn, ir.AsyncLoad} <= set(kinds)
    for cls in kinds:
        s, markers = _marked(cls)
        inner = ir.If(cond=ir.Const(value=1, type=T.pred), then=(s,))
        seen = list(ir.walk((inner,)))
        for m in markers:
            assert any(x is m for x in seen), f"ir.walk does not enter {m.name}"
        assert len(ir.blocks(s)) == len(markers), cls.__name__


def test_sites_give_paths_and_loops_and_enter_and_early_exit_hold():
    p = ir.Var(name="p", type=T.pred)
    a, b, c = (ir.Assign(name=n, value=ir.Const(value=0, type=T.u32)) for n in "abc")
    zero = ir.Const(value=0, type=T.u32)
    loop = ir.For(var="i", var_type=T.u32, start=zero, stop=zero, step=zero,
                  body=(ir.If(cond=p, then=(a,), orelse=(b,)),))
    role = ir.Role(name="r", warp_start=0, warp_stop=1, regs=None, body=(loop, c))
    found = {s.name: (path, lp) for s, path, lp in ir.sites((role,)) if isinstance(s, ir.Assign)}
    assert found == {"a": (((p, True),), loop), "b": (((p, False),), loop), "c": ((), None)}
    # `enter` keeps the walk out of a statement's blocks, not away from the statement
    assert list(ir.walk((role,), enter=lambda s: not isinstance(s, ir.Role))) == [role]
    # a walk is lazy: stopping early reads no further
    walk = ir.walk((role,))
    assert next(walk) is role and next(walk) is loop


def test_with_blocks_rewrites_every_block_and_keeps_the_rest():
    a = ir.Assign(name="a", value=ir.Const(value=0, type=T.u32))
    s = ir.If(cond=ir.Var(name="p", type=T.pred), then=(a,), orelse=(a, a))
    out = ir.with_blocks(s, lambda b: b[:1])
    assert out == ir.If(cond=s.cond, then=(a,), orelse=(a,))
    assert ir.with_blocks(a, lambda b: ()) is a
