"""Cluster operations: the cluster barrier, stores and copies into a peer CTA's shared memory
that complete on its mbarrier, and multicast loads delivered to several CTAs at once."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import numpy as np

from .. import ir
from .. import types as T
from ..interp import scalar
from ..interp.cluster import Cluster, issue_remote
from ..interp.cta import Thread
from ..interp.errors import fail
from ..interp.program import GEN, PLAIN, Program, Step
from ..opdef import Effect, ErrorFn, OpDef, const_int, register
from .bulk import check_smem_aligned, smem_bytes, stage_barrier
from .tensor import check_tile, tensor_operands, tmap_operand

MASK_BITS = 16


def cluster_of(th: Thread) -> Cluster:
    """The thread's cluster; a kernel without one runs in clusters of one CTA."""
    cta = th.cta
    return cta.cluster if cta.cluster is not None else Cluster([cta], 0, 0)


# ----------------------------------------------------------------------------- barrier


def _arrive(release: bool, n: Any) -> Callable[[Thread], None]:
    return lambda th: cluster_of(th).barrier.arrive(th, release, n)


def _wait(n: Any) -> Callable[[Thread], Generator]:
    def wait(th: Thread) -> Generator:
        bar = cluster_of(th).barrier
        if th.cluster_gen < 0:
            fail("barrier", f"{th.name} waits on the cluster barrier without having arrived "
                 "(cluster_arrive() first)", n)
        if not bar.done(th):
            th.wait = (n, bar, None)
            while not bar.done(th):
                yield bar
        bar.acquire(th)

    return wait


@register
class ClusterArrive(OpDef):
    node = ir.ClusterArrive
    effect = Effect(cluster_barrier="arrive")

    def emit(self, e, n: ir.ClusterArrive) -> None:
        e.w.instr("barrier.cluster.arrive.release")

    def interp(self, c: Program, n: ir.ClusterArrive) -> Step:
        return PLAIN, True, _arrive(True, n)


@register
class ClusterArriveRelaxed(OpDef):
    node = ir.ClusterArriveRelaxed
    effect = Effect(cluster_barrier="arrive")

    def emit(self, e, n: ir.ClusterArriveRelaxed) -> None:
        e.w.instr("barrier.cluster.arrive.relaxed")

    def interp(self, c: Program, n: ir.ClusterArriveRelaxed) -> Step:
        return PLAIN, True, _arrive(False, n)


@register
class ClusterWait(OpDef):
    node = ir.ClusterWait
    effect = Effect(cluster_barrier="wait")

    def emit(self, e, n: ir.ClusterWait) -> None:
        e.w.instr("barrier.cluster.wait.acquire")

    def interp(self, c: Program, n: ir.ClusterWait) -> Step:
        return GEN, True, _wait(n)


@register
class ClusterSync(OpDef):
    node = ir.ClusterSync
    effect = Effect(cluster_barrier="sync")

    def emit(self, e, n: ir.ClusterSync) -> None:
        e.w.instr("barrier.cluster.arrive.release")
        e.w.instr("barrier.cluster.wait.acquire")

    def interp(self, c: Program, n: ir.ClusterSync) -> Step:
        arrive, wait = _arrive(True, n), _wait(n)

        def sync(th: Thread) -> Generator:
            arrive(th)
            yield from wait(th)

        return GEN, True, sync


# ----------------------------------------------------------------------------- peer stores


def _st_async_type(t: T.Type) -> str | None:
    """The `.type` (with `.vN`) of st.async for a value type, or None if it has none."""
    if isinstance(t, T.Scalar) and t.nbytes in (4, 8) and not t.is_pred:
        return t.name if t.is_float else f"b{t.nbits}"
    if isinstance(t, T.Vector) and t.elem.nbytes in (4, 8) and t.n in (2, 4) \
            and t.nbytes <= 16:
        return f"v{t.n}." + (t.elem.name if t.elem.is_float else f"b{t.elem.nbits}")
    return None


def _same_cta(th: Thread, dst_cta: Any, bar: Any, node: Any) -> None:
    if bar.cta is not dst_cta:
        fail("cluster", f"{th.name}: the {node.syntax} writes into cluster rank {dst_cta.rank} "
             f"but completes on an mbarrier of rank {bar.cta.rank}; both must be in the "
             "destination CTA", node)


@register
class StAsync(OpDef):
    node = ir.StAsync
    effect = Effect(peer=True)
    operands = (("dst", "peer", False), ("value", "val", False), ("bar", "rbar", False))

    def check(self, n: ir.StAsync, err: ErrorFn) -> None:
        dt = n.dst.type
        if _st_async_type(n.value.type) is None:
            err(f"st_async stores 4- or 8-byte scalars or vectors of 2 or 4 of them (at most 16 "
                f"bytes), got {n.value.type}", n.value.loc or n.loc)
        elif isinstance(dt, T.SharedRef) and dt.shape == () and \
                dt.elem.nbytes * getattr(n.value.type, "n", 1) != n.value.type.nbytes:  # type: ignore[attr-defined]
            err(f"st_async of a {n.value.type} into an element of {dt.elem}: the value type "
                "must match the destination element", n.value.loc or n.loc)

    def emit(self, e, n: ir.StAsync) -> None:
        _, dst = e.addr(n.dst)
        t = n.value.type
        v = (f"{{{', '.join(e.ev_vec(n.value))}}}" if isinstance(t, T.Vector)
             else e.ev_reg(n.value))
        e.w.instr(f"st.async.shared::cluster.mbarrier::complete_tx::bytes.{_st_async_type(t)}",
                  dst, v, e.bar_addr(n.bar))

    def interp(self, c: Program, n: ir.StAsync) -> Step:
        from ..interp.exprs import peer_place

        where, _ = peer_place(c, n.dst)  # type: ignore[arg-type]
        value, bar = c.expr(n.value), c.barrier_place(n.bar)
        t = n.value.type
        _, write = scalar.codec(t)
        size = t.nbytes  # type: ignore[attr-defined]

        def store(th: Thread) -> None:
            cta, off = where(th)
            b = bar(th)
            _same_cta(th, cta, b, n)
            if off % size:
                fail("alignment", f"{th.name}: st_async of {size} bytes at shared-memory byte "
                     f"{off} is not {size}-byte aligned", n)
            data = bytearray(size)
            write(data, 0, value(th))
            blob = np.frombuffer(bytes(data), np.uint8)
            issue_remote(th, cta, n, b, slice(off, off + size), size, lambda: blob)

        return PLAIN, True, store


@register
class BulkCopyCluster(OpDef):
    node = ir.BulkCopyCluster
    effect = Effect(peer=True)
    operands = (("dst", "peer", False), ("src", "smem", False), ("bar", "rbar", False),
                ("nbytes", "u32", True))
    async_reads = True

    def derive(self, values: dict[str, Any], loc: Any) -> str | None:
        if values.get("nbytes") is None:
            smem_bytes(values, "src", loc)
        return None

    def omitted(self, n: ir.BulkCopyCluster, name: str) -> bool:
        return const_int(n.nbytes) == n.src.type.nbytes  # type: ignore[attr-defined]

    def check(self, n: ir.BulkCopyCluster, err: ErrorFn) -> None:
        size = const_int(n.nbytes)
        if size is None:
            return
        room = min(n.src.type.nbytes, n.dst.type.nbytes)  # type: ignore[attr-defined]
        if size <= 0 or size % 16:
            err(f"a bulk copy moves a positive multiple of 16 bytes, got {size}",
                n.nbytes.loc or n.loc)
        elif size > room:
            err(f"{self.syntax} moves {size} bytes, but its shared-memory operands hold "
                f"{room}", n.nbytes.loc or n.loc)

    def emit(self, e, n: ir.BulkCopyCluster) -> None:
        _, dst = e.addr(n.dst)
        _, src = e.addr(n.src)
        e.w.instr("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes",
                  dst, src, e.ev(n.nbytes), e.bar_addr(n.bar))

    def fetcher(self, n: Any, mine: np.ndarray, src: slice, cta: Any, off: int
                ) -> Callable[[], np.ndarray]:
        """What the copy delivers into the peer at `off`, read when its bytes land."""
        return lambda: mine[src].copy()

    def interp(self, c: Program, n: ir.BulkCopyCluster) -> Step:
        from ..interp.exprs import peer_place

        where, dview = peer_place(c, n.dst)  # type: ignore[arg-type]
        (src, sview), bar, nbytes = c.shared_place(n.src), c.barrier_place(n.bar), c.expr(n.nbytes)

        def copy(th: Thread) -> None:
            cta, off = where(th)
            k, s, b = nbytes(th), src(th), bar(th)
            _same_cta(th, cta, b, n)
            if k <= 0 or k % 16 or k > min(sview, dview):
                fail("copy", f"{th.name}: {n.syntax} moves a positive multiple of 16 "
                     f"bytes within its operands ({min(sview, dview)} bytes), got {k}", n)
            check_smem_aligned(th, n, s, 16)
            check_smem_aligned(th, n, off, 16)
            th.cta.smem.check_async_read(th, slice(s, s + k), n, n.syntax)
            issue_remote(th, cta, n, b, slice(off, off + k), k,
                         self.fetcher(n, th.cta.smem.u8, slice(s, s + k), cta, off))

        return PLAIN, True, copy


# ----------------------------------------------------------------------------- multicast


def check_mask_const(mask: ir.Expr, err: ErrorFn) -> None:
    m = const_int(mask)
    if m is not None and (m == 0 or m >> MASK_BITS):
        err(f"a multicast CTA mask is a nonzero 16-bit set of cluster ranks, got {m:#x}",
            mask.loc)


def _targets(th: Thread, mask: int, node: Any) -> list[Any]:
    """The CTAs of the cluster that a multicast with `mask` delivers to."""
    cl = cluster_of(th)
    if mask == 0 or mask >> len(cl.ctas):
        fail("cluster", f"{th.name}: multicast mask {mask:#06x} names CTAs outside the "
             f"cluster of {len(cl.ctas)} (ranks 0..{len(cl.ctas) - 1})" if mask else
             f"{th.name}: multicast mask 0 delivers to no CTA", node)
    return [cl.peer(th, r, node) for r in range(len(cl.ctas)) if mask >> r & 1]


def _peer_bar(cta: Any, mine: Any) -> Any:
    """The barrier at the same place as `mine` in CTA `cta`."""
    label = mine.label
    name, _, rest = label.partition("[")
    return cta.barriers[name][int(rest[:-1]) if rest else 0]


def _mask_reg(e: Any, mask: ir.Expr) -> str:
    r = e.ev(mask)
    if r.startswith("%"):
        return r
    reg = e.w.reg(T.u16)
    e.w.instr("mov.u16", reg, r)
    return reg


@register
class TensorLoadMulticast(OpDef):
    node = ir.TensorLoadMulticast
    effect = Effect(multicast=True, peer=True, tma=True)
    needs = "multicast"
    operands = (("dst", "smem", False), ("tmap", "tmap", False), ("coords", "coords", False),
                ("mask", "u16", False), ("bar", "bar", True))

    def derive(self, values: dict[str, Any], loc: Any) -> str | None:
        return stage_barrier(values, loc, self.syntax) if values.get("bar") is None else None

    def omitted(self, n: ir.TensorLoadMulticast, name: str) -> bool:
        return isinstance(n.bar, ir.StageBarrier)

    def check(self, n: ir.TensorLoadMulticast, err: ErrorFn) -> None:
        check_tile(n, n.dst, err)
        check_mask_const(n.mask, err)

    def emit(self, e, n: ir.TensorLoadMulticast) -> None:
        _, dst = e.addr(n.dst)
        e.w.instr(f"cp.async.bulk.tensor.{len(n.coords)}d.shared::cluster.global.tile"
                  ".mbarrier::complete_tx::bytes.multicast::cluster", dst,
                  tmap_operand(e, n.tmap, n.coords), e.bar_addr(n.bar), _mask_reg(e, n.mask))

    def interp(self, c: Program, n: ir.TensorLoadMulticast) -> Step:
        operands, bar = tensor_operands(c, n.tmap, n.coords, n.dst), c.barrier_place(n.bar)
        mask = c.expr(n.mask)

        def load(th: Thread) -> None:
            model, coords, sel = operands(th, n)
            mine = bar(th)
            box = None

            def fetch() -> np.ndarray:
                nonlocal box
                if box is None:
                    box = model.read_box(coords)
                return box

            for cta in _targets(th, mask(th), n):
                issue_remote(th, cta, n, _peer_bar(cta, mine), sel, model.nbytes, fetch)

        return PLAIN, True, load


@register
class BulkLoadMulticast(OpDef):
    node = ir.BulkLoadMulticast
    effect = Effect(multicast=True, peer=True)
    needs = "multicast"
    operands = (("dst", "smem", False), ("src", "gref", False), ("mask", "u16", False),
                ("bar", "bar", True), ("nbytes", "u32", True))

    def derive(self, values: dict[str, Any], loc: Any) -> str | None:
        if values.get("nbytes") is None:
            smem_bytes(values, "dst", loc)
        return stage_barrier(values, loc, self.syntax) if values.get("bar") is None else None

    def omitted(self, n: ir.BulkLoadMulticast, name: str) -> bool:
        if name == "nbytes":
            return const_int(n.nbytes) == n.dst.type.nbytes  # type: ignore[attr-defined]
        return isinstance(n.bar, ir.StageBarrier)

    def check(self, n: ir.BulkLoadMulticast, err: ErrorFn) -> None:
        check_mask_const(n.mask, err)
        size = const_int(n.nbytes)
        if size is not None and (size <= 0 or size % 16 or size > n.dst.type.nbytes):  # type: ignore[attr-defined]
            err(f"a bulk copy moves a positive multiple of 16 bytes within its shared operand "
                f"({n.dst.type.nbytes} bytes), got {size}", n.nbytes.loc or n.loc)  # type: ignore[attr-defined]

    def emit(self, e, n: ir.BulkLoadMulticast) -> None:
        _, dst = e.addr(n.dst)
        _, src = e.addr(n.src)
        e.w.instr("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                  ".multicast::cluster", dst, src, e.ev(n.nbytes), e.bar_addr(n.bar),
                  _mask_reg(e, n.mask))

    def interp(self, c: Program, n: ir.BulkLoadMulticast) -> Step:
        (dst, view), (src, esize) = c.shared_place(n.dst), c.global_place(n.src)
        bar, nbytes, mask = c.barrier_place(n.bar), c.expr(n.nbytes), c.expr(n.mask)

        def load(th: Thread) -> None:
            k, off, mine = nbytes(th), dst(th), bar(th)
            if k <= 0 or k % 16 or k > view:
                fail("copy", f"{th.name}: bulk_load_multicast moves a positive multiple of 16 "
                     f"bytes within its shared operand ({view} bytes), got {k}", n)
            check_smem_aligned(th, n, off, 16)
            mv, goff = th.cta.gmem.locate(th, src(th), k, esize, n, "bulk_load_multicast "
                                          "source", align=16)

            def fetch() -> np.ndarray:
                return np.frombuffer(mv, np.uint8, k, goff).copy()

            for cta in _targets(th, mask(th), n):
                issue_remote(th, cta, n, _peer_bar(cta, mine), slice(off, off + k), k, fetch)

        return PLAIN, True, load
