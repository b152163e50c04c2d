"""The intrinsic statements (ir.Op subclasses): one compiler per class in `HANDLERS`.

Adding an op is one decorated function here (and, if it reads shared memory through the
async proxy, `async_reads=True`, which turns on the proxy-fence tracking).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import numpy as np

from .. import ir
from .. import types as T
from .copies import AsyncLoad, AsyncStore
from .cta import Thread
from .errors import fail
from .program import GEN, PLAIN, Program, Step
from .scalar import wrapper
from .tensormap import TensorMapModel

HANDLERS: dict[type[ir.Op], Callable[[Program, Any], Step]] = {}
ASYNC_READERS: set[type[ir.Op]] = set()  # ops whose copies read shared memory


def handles(cls: type[ir.Op], async_reads: bool = False):
    """Register the decorated function as the compiler of `cls`."""

    def register(f: Callable[[Program, Any], Step]) -> Callable[[Program, Any], Step]:
        HANDLERS[cls] = f
        if async_reads:
            ASYNC_READERS.add(cls)
        return f

    return register


def _const(v: int) -> Callable[[Thread], int]:
    return lambda th: v


def _count(c: Program, e: ir.Expr | None, default: int) -> Callable[[Thread], int]:
    return c.expr(e) if e is not None else _const(default)


# ----------------------------------------------------------------------------- mbarriers


@handles(ir.MBarrierInit)
def _init(c: Program, s: ir.MBarrierInit) -> Step:
    bar = c.barrier_place(s.bar)
    base = s.bar.base if isinstance(s.bar, ir.Index) else s.bar
    count = _count(c, s.count, c.decls[base.name].count)  # type: ignore[attr-defined,union-attr]
    return PLAIN, True, lambda th: bar(th).init(th, count(th), s)


@handles(ir.MBarrierArrive)
def _arrive(c: Program, s: ir.MBarrierArrive) -> Step:
    bar, count = c.barrier_place(s.bar), _count(c, s.count, 1)

    return PLAIN, True, lambda th: bar(th).arrive(th, count(th), s)


@handles(ir.MBarrierArriveExpectTx)
def _arrive_expect_tx(c: Program, s: ir.MBarrierArriveExpectTx) -> Step:
    bar, nbytes = c.barrier_place(s.bar), c.expr(s.nbytes)

    def arrive(th: Thread) -> None:
        b = bar(th)
        b.expect_tx(th, nbytes(th), s)  # the expect-tx part happens before the arrive-on
        b.arrive(th, 1, s)

    return PLAIN, True, arrive


@handles(ir.MBarrierExpectTx)
def _expect_tx(c: Program, s: ir.MBarrierExpectTx) -> Step:
    bar, nbytes = c.barrier_place(s.bar), c.expr(s.nbytes)
    return PLAIN, True, lambda th: bar(th).expect_tx(th, nbytes(th), s)


@handles(ir.MBarrierWait)
def _wait(c: Program, s: ir.MBarrierWait) -> Step:
    bar, parity = c.barrier_place(s.bar), c.expr(s.parity)

    def wait(th: Thread) -> Generator:
        b, p = bar(th), parity(th)
        b.check_use(th, s, "waits on")
        if p not in (0, 1):
            fail("mbarrier", f"{th.name} waits on {b.label} for parity {p}; a parity is 0 or 1",
                 s)
        if not b.done(p):
            th.wait = (s, b, p)
            while not b.done(p):
                yield b
        b.acquire(th)

    return GEN, True, wait


@handles(ir.MBarrierInval)
def _inval(c: Program, s: ir.MBarrierInval) -> Step:
    bar = c.barrier_place(s.bar)
    return PLAIN, True, lambda th: bar(th).inval(th, s)


@handles(ir.FenceMBarrierInit)
def _fence_init(c: Program, s: ir.FenceMBarrierInit) -> Step:
    # Publication to other threads is modelled by the barrier that must follow the fence.
    return PLAIN, False, lambda th: th.fence_inits()


@handles(ir.FenceProxyAsync)
def _fence_proxy(c: Program, s: ir.FenceProxyAsync) -> Step:
    def fence(th: Thread) -> None:  # a full proxy fence also covers barrier inits
        th.fence_inits()
        if c.track_proxy:
            th.cta.smem.fence(th)

    return PLAIN, False, fence


# ----------------------------------------------------------------------------- named barriers


@handles(ir.BarSync)
def _bar_sync(c: Program, s: ir.BarSync) -> Step:
    bid = c.expr(s.id)
    count = c.expr(s.nthreads) if s.nthreads is not None else None

    def sync(th: Thread) -> Generator:
        nb = _named(th, bid(th), s)
        gen = nb.arrive(th, _bar_count(th, count(th), s) if count is not None
                        else th.cta.nthreads, s)
        if nb.generation == gen:
            th.wait = (s, nb, None)
            while nb.generation == gen:
                yield nb
        th.cta.clocks.acquire(th.tid, nb.released[gen])

    return GEN, True, sync


@handles(ir.BarArrive)
def _bar_arrive(c: Program, s: ir.BarArrive) -> Step:
    bid, count = c.expr(s.id), c.expr(s.nthreads)

    def arrive(th: Thread) -> None:
        _named(th, bid(th), s).arrive(th, _bar_count(th, count(th), s), s)

    return PLAIN, True, arrive


def _bar_count(th: Thread, count: int, node: Any) -> int:
    if count <= 0 or count % 32 or count > th.cta.nthreads:
        fail("barrier", f"{th.name}: a barrier thread count must be a positive multiple of 32 "
             f"no larger than the CTA ({th.cta.nthreads} threads), got {count}", node)
    return count


def _named(th: Thread, bid: int, node: Any) -> Any:
    if not 0 <= bid <= 15:
        fail("barrier", f"{th.name}: a named barrier id must be in [0, 15], got {bid}", node)
    return th.cta.named[bid]


# ----------------------------------------------------------------------------- bulk copies


def _check_bulk(th: Thread, s: Any, nbytes: int, off: int, view: int) -> None:
    if nbytes <= 0 or nbytes % 16:
        fail("copy", f"{th.name}: a bulk copy moves a positive multiple of 16 bytes, got "
             f"{nbytes}", s)
    if nbytes > view:
        fail("bounds", f"{th.name}: {s.syntax} moves {nbytes} bytes, but the shared-memory "
             f"operand holds {view}", s)
    _check_smem_aligned(th, s, off, 16)


def _check_smem_aligned(th: Thread, s: Any, off: int, align: int) -> None:
    addr = th.cta.smem.base + off
    if addr % align:
        fail("alignment", f"{th.name}: {s.syntax} needs {align}-byte aligned shared memory, but "
             f"{th.cta.smem.where(off)} may lie at shared-memory address {addr} (the kernel "
             f"aligns its shared memory to {th.cta.smem.layout.align} bytes)", s)


@handles(ir.BulkLoad)
def _bulk_load(c: Program, s: ir.BulkLoad) -> Step:
    (dst, view), (src, esize) = c.shared_place(s.dst), c.global_place(s.src)
    bar, nbytes = c.barrier_place(s.bar), c.expr(s.nbytes)

    def load(th: Thread) -> None:
        n, off, b = nbytes(th), dst(th), bar(th)
        _check_bulk(th, s, n, off, view)
        mv, goff = th.cta.gmem.locate(th, src(th), n, esize, s, "bulk_load source", align=16)
        b.check_async_use(th, s)
        def fetch() -> np.ndarray:
            return np.frombuffer(mv, np.uint8, n, goff).copy()

        th.cta.issue(th, AsyncLoad(th.cta, s, b, slice(off, off + n), n, fetch))

    return PLAIN, True, load


@handles(ir.BulkStore, async_reads=True)
def _bulk_store(c: Program, s: ir.BulkStore) -> Step:
    (dst, esize), (src, view) = c.global_place(s.dst), c.shared_place(s.src)
    nbytes = c.expr(s.nbytes)

    def store(th: Thread) -> None:
        n, off = nbytes(th), src(th)
        _check_bulk(th, s, n, off, view)
        mv, goff = th.cta.gmem.locate(th, dst(th), n, esize, s, "bulk_store destination",
                                      align=16)
        sel = slice(off, off + n)
        th.cta.smem.check_async_read(th, sel, s, s.syntax)

        def write(data: np.ndarray) -> None:
            mv[goff : goff + n] = data.data

        th.cta.issue(th, AsyncStore(th.cta, s, th, sel, write))

    return PLAIN, True, store


@handles(ir.BulkCommit)
def _commit(c: Program, s: ir.BulkCommit) -> Step:
    return PLAIN, True, lambda th: th.bulk.commit()


def _bulk_wait(c: Program, s: ir.BulkWait | ir.BulkWaitRead) -> Step:
    n, read = c.expr(s.n), isinstance(s, ir.BulkWaitRead)

    def wait(th: Thread) -> Generator:
        k, groups = n(th), th.bulk
        if not groups.done(k, read):
            th.wait = (s, groups, k)
            while not groups.done(k, read):
                yield groups
        groups.retire(k, read)

    return GEN, True, wait


handles(ir.BulkWait)(_bulk_wait)
handles(ir.BulkWaitRead)(_bulk_wait)


# ----------------------------------------------------------------------------- tensor copies

_S32 = wrapper(T.s32)


def _tensor_operands(c: Program, tmap: ir.Expr, coords: tuple[ir.Expr, ...], smem: ir.Expr):
    m, cs = c.expr(tmap), [c.expr(x) for x in coords]
    off, view = c.shared_place(smem)

    def operands(th: Thread, s: Any) -> tuple[TensorMapModel, list[int], Any]:
        model = m(th)
        o = off(th)
        if model.nbytes > view:
            fail("bounds", f"{th.name}: the box of {s.syntax} is {model.nbytes} bytes, but the "
                 f"shared-memory operand holds {view}", s)
        _check_smem_aligned(th, s, o, 128)
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


@handles(ir.TensorLoad)
def _tma_load(c: Program, s: ir.TensorLoad) -> Step:
    operands, bar = _tensor_operands(c, s.tmap, s.coords, s.dst), c.barrier_place(s.bar)

    def load(th: Thread) -> None:
        model, coords, sel = operands(th, s)
        b = bar(th)
        b.check_async_use(th, s)
        th.cta.issue(th, AsyncLoad(th.cta, s, b, sel, model.nbytes,
                                   lambda: model.read_box(coords)))

    return PLAIN, True, load


@handles(ir.TensorStore, async_reads=True)
def _tma_store(c: Program, s: ir.TensorStore) -> Step:
    operands = _tensor_operands(c, s.tmap, s.coords, s.src)

    def store(th: Thread) -> None:
        model, coords, sel = operands(th, s)
        if min(coords) < 0:
            fail("copy", f"{th.name}: tma_store coordinates must not be negative, got "
                 f"{coords}", s)
        th.cta.smem.check_async_read(th, sel, s, s.syntax)
        th.cta.issue(th, AsyncStore(th.cta, s, th, sel,
                                    lambda data: model.write_box(coords, data)))

    return PLAIN, True, store


@handles(ir.TensorMapPrefetch)
@handles(ir.TensorPrefetch)
def _prefetch(c: Program, s: ir.Op) -> Step:
    return PLAIN, False, lambda th: None  # a cache hint: no visible effect
