"""TMA reductions (`cp.reduce.async.bulk[.tensor]`): one OpDef per form and operation.

What PTX accepts was read off ptxas 13.0 for every operation and type (`-arch=sm_90a`):
global destinations take add on f16/bf16 (as `.add.noftz`), f32, f64, u32, s32, u64; min and
max on f16, bf16, u32, s32, u64, s64; inc and dec on u32; and/or/xor on b32 and b64.
A peer CTA's shared memory (shared::cluster) takes add on u32, s32, u64; min and max on u32
and s32; inc and dec on u32; and/or/xor on b32. The PTX type suffix is derived from the
element type; anything else is a located error that lists what the operation accepts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .. import ir
from .. import types as T
from ..interp.cluster import PeerLoad, check_remote_barrier
from ..interp.copies import AsyncStore
from ..interp.cta import Thread
from ..interp.errors import fail, note
from ..interp.memory import first_offset
from ..interp.program import PLAIN, Program, Step
from ..interp.state import ThreadState
from ..opdef import Effect, ErrorFn, OpDef, register
from .bulk import BulkStore, _BulkCopy, _check_bulk
from .cluster import BulkCopyCluster
from .tensor import TensorStore, check_tile, tensor_operands, tmap_operand

_BITWISE = {"and", "or", "xor"}

# element type -> PTX type suffix, per operation, for global and peer-shared destinations
GLOBAL_TYPES: dict[str, dict[str, str]] = {
    "add": {"f16": "noftz.f16", "bf16": "noftz.bf16", "f32": "f32", "f64": "f64", "u32": "u32",
            "s32": "s32", "u64": "u64"},
    "min": {t: t for t in ("f16", "bf16", "u32", "s32", "u64", "s64")},
    "max": {t: t for t in ("f16", "bf16", "u32", "s32", "u64", "s64")},
    "inc": {"u32": "u32"},
    "dec": {"u32": "u32"},
    **{op: {t: f"b{t[1:]}" for t in ("u32", "s32", "b32", "u64", "s64", "b64")}
       for op in _BITWISE},
}
CLUSTER_TYPES: dict[str, dict[str, str]] = {
    "add": {"u32": "u32", "s32": "s32", "u64": "u64"},
    "min": {"u32": "u32", "s32": "s32"},
    "max": {"u32": "u32", "s32": "s32"},
    "inc": {"u32": "u32"},
    "dec": {"u32": "u32"},
    **{op: {"u32": "b32", "s32": "b32", "b32": "b32"} for op in _BITWISE},
}


def _elem(e: ir.Expr) -> T.Scalar | None:
    t = e.type
    return t.elem if isinstance(t, (T.SharedRef, T.GlobalRef, T.TensorMap)) else None  # type: ignore[return-value]


def check_reduce(syntax: str, op: str, elem: T.Scalar | None, table: dict[str, dict[str, str]],
                 where: ir.Expr, err: ErrorFn, fallback: Any) -> None:
    if elem is None or elem.name in table[op]:
        return
    ok = ", ".join(_PRETTY.get(t, t) for t in table[op])
    err(f"{syntax} cannot reduce {elem} elements; {op} takes {ok}", where.loc or fallback)


_PRETTY = {"b32": "32-bit integers", "b64": "64-bit integers"}


# ----------------------------------------------------------------------------- semantics

def combine(op: str, elem: T.Scalar, old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Bytes of `old op new`, element by element (the PTX semantics of each reduction)."""
    if elem.name == "bf16":  # held as bits: compute in f32, round to nearest even
        from ..runtime.dtypes import bf16_bits_to_f32, f32_to_bf16_bits

        a, b = bf16_bits_to_f32(old.view(np.uint16)), bf16_bits_to_f32(new.view(np.uint16))
        return f32_to_bf16_bits(_apply(op, a, b)).view(np.uint8)
    dt = T.numpy_dtype(elem)
    a, b = old.view(dt), new.view(dt)
    if op in _BITWISE:
        a, b = a.view(f"u{dt.itemsize}"), b.view(f"u{dt.itemsize}")
    return np.ascontiguousarray(_apply(op, a, b).astype(a.dtype)).view(np.uint8)


def _apply(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        if op == "add":
            return a + b
        if op in ("min", "max"):
            return np.minimum(a, b) if op == "min" else np.maximum(a, b)
        if op == "inc":  # old >= src ? 0 : old + 1
            return np.where(a >= b, 0, a + 1)
        if op == "dec":  # old == 0 || old > src ? src : old - 1
            return np.where((a == 0) | (a > b), b, a - 1)
        return {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[op](a, b)


# ----------------------------------------------------------------------------- definitions

def _check_same_elements(syntax: str, n: Any, table: dict, err: ErrorFn) -> None:
    """A shared -> (global or peer) reduction: both sides hold one element type, and the
    operation is one PTX allows on it (`table`)."""
    d, s = _elem(n.dst), _elem(n.src)
    if d is not None and s is not None and d != s:
        err(f"{syntax} reduces {s} elements into {d} memory; the types must match",
            n.dst.loc or n.loc)
        return
    check_reduce(syntax, n.op, s, table, n.src, err, n.loc)


class _BulkReduce(_BulkCopy):
    operands = (("dst", "gref", False), ("src", "smem", False), ("nbytes", "u32", True))
    async_reads = True
    effect = BulkStore.effect  # a store: bulk group, proxy fences, buffer lifetimes
    smem_key = "src"

    def check(self, n: Any, err: ErrorFn) -> None:
        super().check(n, err)
        _check_same_elements(self.syntax, n, GLOBAL_TYPES, err)

    def emit(self, e: Any, n: Any) -> None:
        _, dst = e.addr(n.dst)
        _, src = e.addr(n.src)
        ty = GLOBAL_TYPES[n.op][_elem(n.src).name]  # type: ignore[union-attr]
        e.w.instr(f"cp.reduce.async.bulk.global.shared::cta.bulk_group.{n.op}.{ty}", dst, src,
                  e.ev(n.nbytes))

    def interp(self, c: Program, n: Any) -> Step:
        (dst, esize), (src, view) = c.global_place(n.dst), c.shared_place(n.src)
        nbytes, elem = c.expr(n.nbytes), _elem(n.src)

        def reduce(th: Thread) -> None:
            k, off = nbytes(th), src(th)
            _check_bulk(th, n, k, off, view)
            mv, goff = th.cta.gmem.locate(th, dst(th), k, esize, n, f"{n.syntax} destination",
                                          align=16)
            sel = slice(off, off + k)
            th.cta.smem.check_async_read(th, sel, n, n.syntax)
            target = np.frombuffer(mv, np.uint8, k, goff)

            def write(data: np.ndarray) -> None:  # an atomic read-modify-write per element
                target[:] = combine(n.op, elem, target.copy(), data)  # type: ignore[arg-type]

            th.cta.issue(th, AsyncStore(th.cta, n, th, sel, write,
                                        th.cta.gmem.dest(dst(th), k, esize), reduces=True))

        return PLAIN, True, reduce


class _TensorReduce(OpDef):
    operands = (("tmap", "tmap", False), ("coords", "coords", False), ("src", "smem", False))
    async_reads = True
    effect = TensorStore.effect

    def check(self, n: Any, err: ErrorFn) -> None:
        check_tile(n, n.src, err)
        check_reduce(self.syntax, n.op, _elem(n.tmap), GLOBAL_TYPES, n.tmap, err, n.loc)

    def emit(self, e: Any, n: Any) -> None:
        _, src = e.addr(n.src)
        e.w.instr(f"cp.reduce.async.bulk.tensor.{len(n.coords)}d.global.shared::cta.{n.op}"
                  ".tile.bulk_group", tmap_operand(e, n.tmap, n.coords), src)

    def interp(self, c: Program, n: Any) -> Step:
        operands = tensor_operands(c, n.tmap, n.coords, n.src)

        def reduce(th: Thread) -> None:
            model, coords, sel = operands(th, n)
            th.cta.smem.check_async_read(th, sel, n, n.syntax)

            def write(data: np.ndarray) -> None:
                old = model.read_box(coords)  # out-of-bounds parts are dropped by write_box
                model.write_box(coords, combine(n.op, model.elem, old, data))

            th.cta.issue(th, AsyncStore(th.cta, n, th, sel, write,
                                        model.dest(coords, n.tmap.name),  # type: ignore[attr-defined]
                                        reduces=True))

        return PLAIN, True, reduce


class _ClusterReduce(BulkCopyCluster):
    """Like bulk_copy_cluster, but what lands in the peer is its buffer op= the source."""

    # completes on an mbarrier like a load into its destination
    effect = Effect(complete="bar", async_write="dst", size="nbytes", one_thread=True, peer=True)

    def check(self, n: Any, err: ErrorFn) -> None:
        super().check(n, err)
        _check_same_elements(self.syntax, n, CLUSTER_TYPES, err)

    def emit(self, e: Any, n: Any) -> None:
        _, dst = e.addr(n.dst)
        _, src = e.addr(n.src)
        ty = CLUSTER_TYPES[n.op][_elem(n.src).name]  # type: ignore[union-attr]
        e.w.instr(f"cp.reduce.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes"
                  f".{n.op}.{ty}", dst, src, e.ev(n.nbytes), e.bar_addr(n.bar))

    def interp(self, c: Program, n: Any) -> Step:
        from ..interp.exprs import peer_place

        where, dview = peer_place(c, n.dst)
        (src, sview), bar, nbytes = c.shared_place(n.src), c.barrier_place(n.bar), c.expr(n.nbytes)
        elem = _elem(n.src)

        def reduce(th: Thread) -> None:
            cta, off = where(th)
            k, s, b = nbytes(th), src(th), bar(th)
            _check_bulk(th, n, k, s, sview)
            _check_bulk(th, n, k, off, dview)
            th.cta.smem.check_async_read(th, slice(s, s + k), n, n.syntax)
            if cta is th.cta:
                b.check_async_use(th, n)
            else:
                check_remote_barrier(th, b, n, f"issues a {n.syntax} completing on")
            source = th.cta.smem.u8[s : s + k].copy()
            load = ReduceLoad(cta, n, b, slice(off, off + k), k, lambda: source)
            load.combine = lambda old, new: combine(n.op, elem, old, new)  # type: ignore[arg-type]
            cta.issue(th, load)

        return PLAIN, True, reduce


class ReduceLoad(PeerLoad):
    """A reduction landing in a CTA's shared memory: each chunk combines with the bytes it
    lands on at that moment (element-wise atomic), and reductions into the same bytes may
    be in flight together; any other copy into them still races."""

    __slots__ = ("combine",)
    combine: Callable[[np.ndarray, np.ndarray], np.ndarray]

    def start(self, th: ThreadState) -> None:
        smem, sel = self.cta.smem, self.dst
        self.source, self.vc = None, self.cta.clocks.zeros()
        busy = smem.loading[sel]
        for i in {int(x) for x in np.unique(busy) if x}:
            other = smem.loads[i]
            if not isinstance(other, ReduceLoad):
                fail("race", f"race: a {self.op} from {th.name} lands on bytes of CTA rank "
                     f"{self.cta.rank} while a {other.op} into them is in flight", self.node,
                     note(f"the {other.op} was issued here", other.node))
        unfenced = (smem.gw_owner[sel] != 0) & (smem.gw_fence[sel] == 0)
        if unfenced.any():
            # the async proxy reads the bytes it combines with: their generic writer must
            # have fenced them (the cluster barrier that orders it is the protocol's to check)
            off = first_offset(sel, unfenced)
            writer = self.cta.threads[int(smem.gw_owner[off]) - 1]
            fail("proxy-fence", f"missing proxy fence: a {self.op} from {th.name} reduces into "
                 f"{smem.where(off)} of CTA rank {self.cta.rank}, which {writer.name} wrote "
                 "with a generic store and has not fenced with fence_proxy_async(): the async "
                 "proxy may combine with stale bytes", self.node,
                 note(f"{writer.name} wrote it here", smem.sites[int(smem.w_site[off])]))
        smem.loading[sel] = np.where(busy == 0, self.id, busy)
        smem.loads[self.id] = self
        self.bar.copies += 1

    def landing(self, part: Any, chunk: np.ndarray) -> np.ndarray:
        return self.combine(self.cta.smem.u8[part].copy(), chunk)


def _definitions() -> None:
    bases: dict[type, type] = {ir.BulkReduce: _BulkReduce, ir.TensorReduce: _TensorReduce,
                               ir.ClusterReduce: _ClusterReduce}
    for node in ir.VARIANTS.values():
        base = next(d for b, d in bases.items() if issubclass(node, b))
        register(type(f"{node.__name__}Def", (base,), {"node": node}))


_definitions()
