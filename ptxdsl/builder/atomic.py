"""Value functions on global memory for grid-level synchronisation:
`atomic_<op>(place, value[, order][, scope])`, `atomic_cas(place, compare, new[, order]
[, scope])`, `ld_acquire(place[, scope])` and `ld_relaxed(place[, scope])`. The order and
scope are bare words (`acq_rel`, `gpu`); in the Python API, strings."""

from __future__ import annotations

from .. import ir
from .. import types as T
from ..errors import Span
from .common import Lit, Operand, is_err
from .exprs import Expressions, register_calls

ATOMIC_FUNCTIONS = ir.ATOMIC_FUNCTIONS
WORDS = frozenset(ir.ORDERS + ir.SCOPES)
WORD_OPS = frozenset({"st_release"})  # statements with a scope operand


class Word(str):
    """A memory order or scope written as a bare word in a call (`acq_rel`, `gpu`)."""

    loc: Span | None = None


def word(text: str, loc: Span | None) -> Word:
    w = Word(text)
    w.loc = loc
    return w


def split_words(b: Expressions, fn: str, args: list, loc: Span | None,
                orders: tuple[str, ...]) -> tuple[list, str, str] | None:
    """(value arguments, order, scope): the trailing words taken off `args` (an order from
    `orders`, if any are allowed, then a scope); None after an error."""
    values = list(args)
    words: list[str] = []
    while values and isinstance(values[-1], str):
        words.insert(0, values.pop())
    if any(isinstance(x, str) for x in values):
        b.diags.error(f"{fn}(): the order and scope come last, after the values", loc)
        return None
    order, scope = "relaxed", "gpu"
    if words and orders and words[0] in orders:
        order = str(words.pop(0))
    if words and words[0] in ir.SCOPES:
        scope = str(words.pop(0))
    if words:
        want = f"an order ({', '.join(orders)}) then a scope" if orders else "a scope"
        b.diags.error(f"{fn}() takes {want} ({', '.join(ir.SCOPES)}) after its values, got "
                      f"'{words[0]}'", getattr(words[0], "loc", None) or loc)
        return None
    return values, order, scope


def global_element(b: Expressions, fn: str, x: Operand | str, loc: Span | None) -> ir.Expr | None:
    if isinstance(x, (Lit, str, list)) or not isinstance(getattr(x, "type", None), T.GlobalRef):
        if not isinstance(x, (Lit, str, list)) and is_err(x.type):
            return None
        got = f", got {x.type}" if isinstance(x, ir.Expr) else ""
        b.diags.error(f"{fn}() takes one element of global memory (ptr[i]) first{got}",
                      getattr(x, "loc", None) or loc)
        return None
    return x


def atomic_call(b: Expressions, fn: str, args: list, loc: Span | None) -> Operand:
    bad = ir.Const(value=0, type=T.error, loc=loc)
    if fn in ("ld_acquire", "ld_relaxed"):
        split = split_words(b, fn, args, loc, ())
        if split is None:
            return bad
        values, _, scope = split
        if len(values) != 1:
            b.diags.error(f"{fn}() takes a global element and an optional scope, got "
                          f"{len(values)} value(s)", loc)
            return bad
        ref = global_element(b, fn, values[0], loc)
        if ref is None:
            return bad
        elem = ref.type.elem  # type: ignore[attr-defined]
        if not isinstance(elem, T.Scalar) or elem.nbytes not in (4, 8) or elem.is_pred:
            b.diags.error(f"{fn}() loads 32- or 64-bit scalars, got {elem}", loc)
            return bad
        return ir.AtomicLoad(ref=ref, sem=fn[3:], scope=scope, type=elem, loc=loc)
    op = fn.removeprefix("atomic_")
    split = split_words(b, fn, args, loc, ir.ORDERS)
    if split is None:
        return bad
    values, order, scope = split
    want = 3 if op == "cas" else 2
    if len(values) != want:
        usage = "place, compare, new" if op == "cas" else "place, value"
        b.diags.error(f"{fn}() takes ({usage}[, order][, scope]), got {len(values)} value(s)",
                      loc)
        return bad
    ref = global_element(b, fn, values[0], loc)
    if ref is None:
        return bad
    elem = ref.type.elem  # type: ignore[attr-defined]
    types = ir.ATOMIC_TYPES[op]
    if elem.name not in types:
        b.diags.error(f"{fn}() cannot update {elem} elements; {op} takes "
                      f"{', '.join(types)}", ref.loc or loc)
        return bad
    operands = tuple(b.value(v, elem) for v in values[1:])
    if any(is_err(v.type) for v in operands):
        return bad
    return ir.Atomic(op=op, ref=ref, args=operands, sem=order, scope=scope, type=elem, loc=loc)


register_calls(ATOMIC_FUNCTIONS, atomic_call)
