"""Cluster value functions: `peer(place, rank)` (a place in another CTA of the cluster) and
the multicast rank masks `cta_mask(r, ...)`, `cluster_mask()`, `cluster_row_mask()`,
`cluster_col_mask()` (the CTAs of this CTA's cluster row / column)."""

from __future__ import annotations

from math import prod

from .. import ir
from .. import types as T
from ..errors import Span
from .common import Lit, Operand, describe, is_err
from .exprs import Expressions, register_calls, register_view

CLUSTER_FUNCTIONS = {"peer", "cta_mask", "cluster_mask", "cluster_row_mask", "cluster_col_mask"}


def cluster_shape(b: Expressions) -> tuple[int, int, int]:
    return b.cluster if b.cluster is not None else (1, 1, 1)  # type: ignore[attr-defined]


def cluster_call(b: Expressions, fn: str, args: list[Operand], loc: Span | None) -> Operand:
    n = prod(cluster_shape(b))
    if fn == "peer":
        if len(args) != 2:
            return b.error(f"peer() takes a shared place or mbarrier and a cluster rank, got "
                           f"{len(args)} argument(s)", loc)
        return peer(b, args[0], args[1], loc)
    if fn == "cta_mask":
        if not args:
            return b.error("cta_mask() takes one or more cluster ranks", loc)
        mask: Operand = Lit(0, loc)
        for r in args:
            if isinstance(r, Lit):
                if not isinstance(r.value, int) or isinstance(r.value, bool) or \
                        not 0 <= r.value < n:
                    return b.error(f"cluster rank {r.value!r} is outside the cluster of {n} "
                                   "CTA(s)", r.loc or loc)
                bit: Operand = Lit(1 << r.value, r.loc)
            else:
                bit = b.binary("shl", Lit(1, loc), b.value(r, T.u32), loc)
            mask = b.binary("or", mask, bit, loc)
        return _u16(b, mask, loc)
    if args:
        return b.error(f"{fn}() takes no arguments, got {len(args)}", loc)
    nx, ny, _ = cluster_shape(b)
    if fn == "cluster_mask":
        return Lit((1 << n) - 1, loc)
    y, z = b.sreg("cluster_ctaid.y", loc), b.sreg("cluster_ctaid.z", loc)
    if fn == "cluster_row_mask":  # ranks (y + z*ny)*nx + [0, nx)
        first = b.binary("mul", b.binary("add", y, b.binary("mul", z, Lit(ny, loc), loc), loc),
                         Lit(nx, loc), loc)
        return _u16(b, b.binary("shl", Lit((1 << nx) - 1, loc), first, loc), loc)
    # cluster_col_mask: ranks x + z*nx*ny + nx*[0, ny)
    pattern = sum(1 << (i * nx) for i in range(ny))
    first = b.binary("add", b.sreg("cluster_ctaid.x", loc),
                     b.binary("mul", z, Lit(nx * ny, loc), loc), loc)
    return _u16(b, b.binary("shl", Lit(pattern, loc), first, loc), loc)


def _u16(b: Expressions, mask: Operand, loc: Span | None) -> Operand:
    if isinstance(mask, Lit):
        return mask
    return b.cast(mask, T.u16, loc)


def peer(b: Expressions, place: Operand, rank: Operand, loc: Span | None) -> ir.Expr:
    if isinstance(place, Lit):
        return b.error("peer() needs a shared-memory place or an mbarrier, got a literal", loc)
    ty = place.type
    if is_err(ty):
        return place
    if isinstance(ty, (T.PeerShared, T.PeerBarrier)):
        return b.error(f"{describe(place)} is already a place in another CTA", loc)
    n = prod(cluster_shape(b))
    if isinstance(rank, Lit) and isinstance(rank.value, int) and not 0 <= rank.value < n:
        b.diags.error(f"cluster rank {rank.value} is outside the cluster of {n} CTA(s) "
                      f"(ranks 0..{n - 1})", rank.loc or loc)
    r = b.value(rank, T.u32)
    if isinstance(ty, T.SharedRef):
        pt: T.Type = T.PeerShared(ty.elem, ty.shape)
    elif isinstance(ty, T.BarrierRef) and ty.n == 0:
        pt = T.PeerBarrier(0)
    else:
        return b.error(f"peer() needs a shared-memory place or one mbarrier, got {ty}", loc)
    return ir.Peer(ref=place, rank=r, type=pt, loc=loc)


def peer_index(b: Expressions, base: ir.Peer, idx: list[Operand], loc: Span | None) -> ir.Expr:
    """`peer(buf, r)[i]` is `peer(buf[i], r)`: the view stays outermost."""
    inner = b.index(base.ref, idx, loc)
    if is_err(inner.type):
        return inner
    st = inner.type
    assert isinstance(st, T.SharedRef)
    return ir.Peer(ref=inner, rank=base.rank, type=T.PeerShared(st.elem, st.shape), loc=loc)


register_calls(CLUSTER_FUNCTIONS, cluster_call)
register_view(ir.Peer, peer_index)
