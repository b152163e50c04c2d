"""`frag(p, k)`: the A fragment of k-step k in a 16-bit or fp8 register array (ir.Fragment),
the operand that hands a converted accumulator (attention's P) to the next wgmma from
registers."""

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
            not (ty.elem.nbytes == 2 or ty.elem.is_fp8) or ty.n % ir.fragment_elems(ty.elem):
        got = f"{describe(p)} of type {ty}" if isinstance(p, ir.Expr) else "a literal"
        return b.error("frag(p, k) takes a register array of bf16 or f16 whose length is a "
                       f"multiple of 8, or of e4m3 or e5m2 a multiple of 16, got {got}", loc)
    per = ir.fragment_elems(ty.elem)
    k = b.unrolled_index(kx, ty.n // per, loc, "frag(p, k): k = {v} is out of range "
                         f"[0, {ty.n // per}) for {describe(p)}", "frag(p, k): k")
    if is_err(k.type):
        return k
    return ir.Fragment(vec=p, k=k, type=T.RegArray(ty.elem, (per,)), loc=loc)


register_calls(["frag"], fragment)
