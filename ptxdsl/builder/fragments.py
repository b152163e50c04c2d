"""`frag(p, k)`: the A fragment of k-step k in a 16-bit register array (ir.Fragment), the
operand that hands a converted accumulator (attention's P) to the next wgmma from registers."""

from __future__ import annotations

from .. import ir
from .. import types as T
from ..errors import Span
from .common import Lit, Operand, describe, is_err
from .exprs import Expressions, register_calls


def fragment(b: Expressions, fn: str, args: list[Operand], loc: Span | None) -> Operand:
    """`frag(p, k)`: the k-th 8-element A fragment of a 16-bit register array."""
    if len(args) != 2:
        b.diags.error(f"frag() takes 2 argument(s), got {len(args)}", loc)
        return Lit(0, loc)
    p, kx = args
    ty = None if isinstance(p, Lit) else p.type
    if not isinstance(p, ir.Var) or not isinstance(ty, T.RegArray) or \
            ty.elem.nbytes != 2 or ty.n % 8:
        got = f"{describe(p)} of type {ty}" if isinstance(p, ir.Expr) else "a literal"
        return b.error("frag(p, k) takes a register array of bf16 or f16 whose length is a "
                       f"multiple of 8, got {got}", loc)
    k = b.unrolled_index(kx, ty.n // 8, loc, "frag(p, k): k = {v} is out of range "
                         f"[0, {ty.n // 8}) for {describe(p)}", "frag(p, k): k")
    if is_err(k.type):
        return k
    return ir.Fragment(vec=p, k=k, type=T.RegArray(ty.elem, (8,)), loc=loc)


register_calls(["frag"], fragment)
