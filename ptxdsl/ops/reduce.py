"""TMA reductions (`cp.reduce.async.bulk[.tensor]`): one OpDef per form and operation.

What PTX accepts was read off ptxas 13.0 for every operation and type (`-arch=sm_90a`):
global destinations take add on f16/bf16 (as `.add.noftz`), f32, f64, u32, s32, u64; min and
max on f16, bf16, u32, s32, u64, s64; inc and dec on u32; and/or/xor on b32 and b64.
A peer CTA's shared memory (shared::cluster) takes add on u32, s32, u64; min and max on u32
and s32; inc and dec on u32; and/or/xor on b32. The PTX type suffix is derived from the
element type; anything else is a located error that lists what the operation accepts.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import ir
from .. import types as T
from ..interp.copies import AsyncLoad, AsyncStore
from ..interp.cta import Thread
from ..interp.errors import fail
from ..interp.program import PLAIN, Program, Step
from ..opdef import ErrorFn, OpDef, register
from .bulk import _BulkCopy, _check_bulk
from .tensor import check_tile, tensor_operands, tmap_operand

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

class _BulkReduce(_BulkCopy):
    operands = (("dst", "gref", False), ("src", "smem", False), ("nbytes", "u32", True))
    async_reads = True
    smem_key = "src"

    def check(self, n: Any, err: ErrorFn) -> None:
        super().check(n, err)
        d, s = _elem(n.dst), _elem(n.src)
        if d is not None and s is not None and d != s:
            err(f"{self.syntax} reduces {s} elements into {d} memory; the types must match",
                n.dst.loc or n.loc)
            return
        check_reduce(self.syntax, n.op, s, GLOBAL_TYPES, n.src, err, n.loc)

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

            th.cta.issue(th, AsyncStore(th.cta, n, th, sel, write))

        return PLAIN, True, reduce


class _TensorReduce(OpDef):
    operands = (("tmap", "tmap", False), ("coords", "coords", False), ("src", "smem", False))
    async_reads = True

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

            th.cta.issue(th, AsyncStore(th.cta, n, th, sel, write))

        return PLAIN, True, reduce


class _ClusterReduce(_BulkCopy):
    operands = (("dst", "smem", False), ("src", "smem", False), ("rank", "u32", False),
                ("bar", "bar", False), ("nbytes", "u32", True))
    async_reads = True
    smem_key = "src"

    def check(self, n: Any, err: ErrorFn) -> None:
        super().check(n, err)
        d, s = _elem(n.dst), _elem(n.src)
        if d is not None and s is not None and d != s:
            err(f"{self.syntax} reduces {s} elements into {d} memory; the types must match",
                n.dst.loc or n.loc)
            return
        check_reduce(self.syntax, n.op, s, CLUSTER_TYPES, n.src, err, n.loc)

    def emit(self, e: Any, n: Any) -> None:
        w = e.w
        rank = e.ev(n.rank)
        remote = []
        for place in (n.dst, n.bar):
            r, off = e.shared_addr(place)
            local, peer = w.reg(T.u32), w.reg(T.u32)
            w.instr("add.u32", local, r, str(off))
            w.instr("mapa.shared::cluster.u32", peer, local, rank)
            remote.append(f"[{peer}]")
        _, src = e.addr(n.src)
        ty = CLUSTER_TYPES[n.op][_elem(n.src).name]  # type: ignore[union-attr]
        w.instr(f"cp.reduce.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes"
                f".{n.op}.{ty}", remote[0], src, e.ev(n.nbytes), remote[1])

    def interp(self, c: Program, n: Any) -> Step:
        (dst, dview), (src, view) = c.shared_place(n.dst), c.shared_place(n.src)
        rank, bar, nbytes, elem = c.expr(n.rank), c.barrier_place(n.bar), c.expr(n.nbytes), \
            _elem(n.src)

        def reduce(th: Thread) -> None:
            k, off, doff, b = nbytes(th), src(th), dst(th), bar(th)
            if rank(th) != th.sregs["cluster_ctarank"]:
                fail("unsupported", f"{th.name}: {n.syntax} into CTA {rank(th)} of its "
                     "cluster; the interpreter runs one CTA at a time, so only a reduction "
                     "into the CTA's own shared memory is modelled", n)
            _check_bulk(th, n, k, off, view)
            _check_bulk(th, n, k, doff, dview)
            th.cta.smem.check_async_read(th, slice(off, off + k), n, n.syntax)
            b.check_async_use(th, n)
            smem = th.cta.smem.u8
            source = smem[off : off + k].copy()

            def fetch() -> np.ndarray:
                return combine(n.op, elem, smem[doff : doff + k].copy(), source)  # type: ignore[arg-type]

            th.cta.issue(th, AsyncLoad(th.cta, n, b, slice(doff, doff + k), k, fetch))

        return PLAIN, True, reduce


def _definitions() -> None:
    bases: dict[type, type] = {ir.BulkReduce: _BulkReduce, ir.TensorReduce: _TensorReduce,
                               ir.ClusterReduce: _ClusterReduce}
    for node in ir.VARIANTS.values():
        base = next(d for b, d in bases.items() if issubclass(node, b))
        register(type(f"{node.__name__}Def", (base,), {"node": node}))


_definitions()
