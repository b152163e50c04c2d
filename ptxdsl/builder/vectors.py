"""`vload(place, n)`: n consecutive elements of shared or global memory loaded as one vector
(a 4-, 8- or 16-byte access)."""

from __future__ import annotations

from .. import ir
from .. import types as T
from ..errors import Span
from .common import Lit, Operand, is_err
from .exprs import Expressions, register_calls


def vload(b: Expressions, fn: str, args: list[Operand], loc: Span | None) -> Operand:
    place = args[0] if len(args) == 2 else None
    if not isinstance(place, ir.Expr):
        return b.error("vload(place, n) takes a shared or global element and a vector width",
                       loc)
    width = args[1]
    ty = place.type
    if is_err(ty):
        return ir.Const(value=0, type=T.error, loc=loc)
    if not isinstance(width, Lit) or not isinstance(width.value, int):
        return b.error("the vector width of vload must be a constant", loc)
    if isinstance(ty, T.SharedRef) and ty.shape == ():
        elem = ty.elem
    elif isinstance(ty, T.GlobalRef):
        elem = ty.elem
    else:
        return b.error(f"vload needs one element of shared or global memory, got {ty}", loc)
    vt = T.vector_type(elem, width.value)
    if vt is None:
        return b.error(f"no {width.value}-wide vector of {elem}: a vector is 4, 8 or 16 bytes",
                       loc)
    return ir.Load(ref=place, type=vt, loc=loc)


register_calls(["vload"], vload)
