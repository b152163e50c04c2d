"""Tensor (TMA) copies through tensor maps: tile loads, stores and prefetches."""

from __future__ import annotations

from typing import Any

from .. import ir
from .. import types as T
from ..interp.copies import AsyncLoad, AsyncStore
from ..interp.cta import Thread
from ..interp.errors import fail
from ..interp.program import PLAIN, Program, Step
from ..interp.scalar import wrapper
from ..interp.tensormap import TensorMapModel
from ..opdef import Effect, ErrorFn, OpDef, register
from ..swizzle import swizzle_align, tma_name, tma_swizzle_bytes
from .bulk import check_smem_aligned, stage_barrier

_S32 = wrapper(T.s32)


def _name(e: ir.Expr) -> str:
    return getattr(e, "name", "x")


def check_rank(n: Any, err: ErrorFn) -> None:
    tm = n.tmap.type
    if isinstance(tm, T.TensorMap) and len(n.coords) != tm.rank:
        err(f"tensor map '{_name(n.tmap)}' has rank {tm.rank}, but {len(n.coords)} "
            "coordinate(s) were given", n.loc)


def check_tile(n: Any, smem: ir.Expr, err: ErrorFn) -> None:
    """Rank of the coordinates and element size of the shared operand against the map."""
    tm = n.tmap.type
    check_rank(n, err)
    if not isinstance(tm, T.TensorMap):
        return
    st = smem.type
    if isinstance(st, T.SharedRef) and st.elem.nbytes != tm.elem.nbytes:
        err(f"shared memory of {st.elem} cannot hold tiles of tensor map '{_name(n.tmap)}' "
            f"({tm.elem})", smem.loc or n.loc)


def tmap_operand(e: Any, tmap: ir.Expr, coords: tuple[ir.Expr, ...]) -> str:
    cs = ", ".join(e.ev(c) for c in coords)
    return f"[{e.ev(tmap)}, {{{cs}}}]"


def tensor_operands(c: Program, tmap: ir.Expr, coords: tuple[ir.Expr, ...], smem: ir.Expr):
    """Interpreter: (model, coordinates, shared-memory selection) of a tile copy."""
    m, cs = c.expr(tmap), [c.expr(x) for x in coords]
    off, view = c.shared_place(smem)
    buf = smem
    while isinstance(buf, ir.Index):
        buf = buf.base
    declared = getattr(c.decls.get(getattr(buf, "name", "")), "swizzle", 0)

    def operands(th: Thread, s: Any) -> tuple[TensorMapModel, list[int], Any]:
        model = m(th)
        if declared and model.swizzle != tma_name(declared):
            fail("copy", f"{th.name}: the tensor map of {s.syntax} has swizzle {model.swizzle}, "
                 f"but buffer '{getattr(buf, 'name', '?').split('.')[-1]}' declares swizzle "
                 f"{declared}; TMA would lay the tile out differently from what the kernel "
                 "reads", s)
        o = off(th)
        if model.nbytes > view:
            fail("bounds", f"{th.name}: the box of {s.syntax} is {model.nbytes} bytes, but the "
                 f"shared-memory operand holds {view}", s)
        check_smem_aligned(th, s, o, swizzle_align(tma_swizzle_bytes(model.swizzle)))
        base = th.cta.smem.base
        swizzled = model.smem_index(base + o)
        if swizzled is None:
            return model, [_S32(f(th)) for f in cs], slice(o, o + model.nbytes)
        sel = swizzled - base
        if sel.min() < o or sel.max() >= o + view:
            fail("bounds", f"{th.name}: the swizzled box of {s.syntax} reaches outside its "
                 "shared-memory operand", s)
        return model, [_S32(f(th)) for f in cs], sel

    return operands


@register
class TensorLoad(OpDef):
    node = ir.TensorLoad
    effect = Effect(complete="bar", async_write="dst", tma=True, one_thread=True)
    sm80 = "copy"
    operands = (("dst", "smem", False), ("tmap", "tmap", False), ("coords", "coords", False),
                ("bar", "bar", True))

    def derive(self, values: dict[str, Any], loc: Any) -> str | None:
        return stage_barrier(values, loc, self.syntax) if values.get("bar") is None else None

    def omitted(self, n: ir.TensorLoad, name: str) -> bool:
        return isinstance(n.bar, (ir.StageBarrier, ir.AsyncBarrier))

    def check(self, n: ir.TensorLoad, err: ErrorFn) -> None:
        check_tile(n, n.dst, err)

    def emit(self, e, n: ir.TensorLoad) -> None:
        _, dst = e.addr(n.dst)
        e.w.instr(f"cp.async.bulk.tensor.{len(n.coords)}d.shared::cluster.global.tile"
                  ".mbarrier::complete_tx::bytes", dst, tmap_operand(e, n.tmap, n.coords),
                  e.bar_addr(n.bar))

    def interp(self, c: Program, n: ir.TensorLoad) -> Step:
        operands, bar = tensor_operands(c, n.tmap, n.coords, n.dst), c.barrier_place(n.bar)

        def load(th: Thread) -> None:
            model, coords, sel = operands(th, n)
            inner = int(coords[0]) * model.array.itemsize
            if inner % 16:  # the H200 traps (CUDA_ERROR_ILLEGAL_INSTRUCTION) on such a load
                fail("copy", f"{th.name}: the innermost coordinate of {n.syntax} is "
                     f"{int(coords[0])}, {inner} bytes into a row of tensor map "
                     f"'{_name(n.tmap)}': a TMA load must start on a 16-byte boundary of the "
                     f"row (a multiple of {16 // model.array.itemsize} elements here)", n)
            b = bar(th)
            b.check_async_use(th, n)
            th.cta.issue(th, AsyncLoad(th.cta, n, b, sel, model.nbytes,
                                       lambda: model.read_box(coords)))

        return PLAIN, True, load


@register
class TensorStore(OpDef):
    node = ir.TensorStore
    effect = Effect(async_read="src", tma=True, one_thread=True)
    sm80 = "copy"
    operands = (("tmap", "tmap", False), ("coords", "coords", False), ("src", "smem", False))
    async_reads = True

    def check(self, n: ir.TensorStore, err: ErrorFn) -> None:
        check_tile(n, n.src, err)

    def emit(self, e, n: ir.TensorStore) -> None:
        _, src = e.addr(n.src)
        e.w.instr(f"cp.async.bulk.tensor.{len(n.coords)}d.global.shared::cta.tile.bulk_group",
                  tmap_operand(e, n.tmap, n.coords), src)

    def interp(self, c: Program, n: ir.TensorStore) -> Step:
        operands = tensor_operands(c, n.tmap, n.coords, n.src)

        def store(th: Thread) -> None:
            model, coords, sel = operands(th, n)
            if min(coords) < 0:
                fail("copy", f"{th.name}: tma_store coordinates must not be negative, got "
                     f"{coords}", n)
            th.cta.smem.check_async_read(th, sel, n, n.syntax)
            th.cta.issue(th, AsyncStore(th.cta, n, th, sel,
                                        lambda data: model.write_box(coords, data),
                                        model.dest(coords, n.tmap.name)))  # type: ignore[attr-defined]

        return PLAIN, True, store


@register
class TensorMapPrefetch(OpDef):
    node = ir.TensorMapPrefetch
    sm80 = "drop"
    operands = (("tmap", "tmap", False),)

    def emit(self, e, n: ir.TensorMapPrefetch) -> None:
        e.w.instr("prefetch.tensormap", f"[{e.ev(n.tmap)}]")

    def interp(self, c: Program, n: ir.TensorMapPrefetch) -> Step:
        return PLAIN, False, lambda th: None  # a cache hint: no visible effect


@register
class TensorPrefetch(OpDef):
    node = ir.TensorPrefetch
    sm80 = "drop"
    operands = (("tmap", "tmap", False), ("coords", "coords", False))

    def check(self, n: ir.TensorPrefetch, err: ErrorFn) -> None:
        check_rank(n, err)

    def emit(self, e, n: ir.TensorPrefetch) -> None:
        e.w.instr(f"cp.async.bulk.prefetch.tensor.{len(n.coords)}d.L2.global.tile",
                  tmap_operand(e, n.tmap, n.coords))

    def interp(self, c: Program, n: ir.TensorPrefetch) -> Step:
        return PLAIN, False, lambda th: None  # a cache hint: no visible effect
