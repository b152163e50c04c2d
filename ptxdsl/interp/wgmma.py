"""wgmma in the interpreter: each thread computes its own accumulator fragment, when a
`wgmma_wait` completes the group, from shared memory as it is then; if those bytes changed
since the wgmma was issued (a stage released to the producer too early), that is a race.

Until then the accumulator register array is a `Pending` object: any read or write of it is
reported, as is a wgmma whose accumulator was written since the last `wgmma_fence`.

Fragment layout of an m64nN f32 accumulator (PTX ISA, "Register Fragments"): thread t of the
warpgroup (warp q = t / 32 % 4, lane l) holds
    d[4j + 2i + c] = D[16q + l/4 + 8i, 8j + 2(l%4) + c];
an A fragment in registers (m64k16, 16-bit) holds
    a[4h + 2i + c] = A[16q + l/4 + 8i, 8h + 2(l%4) + c].
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import fp8
from .. import swizzle as S
from .. import types as T
from .cta import Thread
from .errors import fail, note


class WgmmaState:
    """A thread's wgmma bookkeeping: writes since the last fence, open and committed groups."""

    __slots__ = ("dirty", "fenced", "open", "groups", "issued")

    def __init__(self) -> None:
        self.dirty: dict[str, Any] = {}  # register array -> the statement that wrote it
        self.fenced = False
        self.open: list[tuple[Pending, Callable[[], None]]] = []
        self.groups: list[list[tuple[Pending, Callable[[], None]]]] = []
        # wgmmas this thread issued, by statement: the warpgroup must issue them together
        self.issued: dict[int, tuple[Any, int]] = {}


def state(th: Thread) -> WgmmaState:
    if th.wgmma is None:
        th.wgmma = WgmmaState()
    return th.wgmma


class Pending:
    """An accumulator owned by wgmmas that no wgmma_wait has completed yet."""

    __slots__ = ("name", "values", "slot", "todo", "site")

    def __init__(self, name: str, values: list, slot: int, site: Any):
        self.name, self.values, self.slot, self.site = name, values, slot, site
        self.todo = 0

    def touched(self, th: Thread, node: Any) -> None:
        fail("wgmma", f"{th.name}: accumulator '{self.name}' is accessed while a wgmma that "
             "writes it is still in flight; wgmma_commit() and wgmma_wait(n) must complete it "
             "first", node, note("the wgmma was issued here", self.site))


def issued(th: Thread, node: Any) -> None:
    st = state(th)
    st.issued[id(node)] = (node, st.issued.get(id(node), (node, 0))[1] + 1)


def fence(th: Thread) -> None:
    st = state(th)
    st.fenced = True
    st.dirty.clear()


def commit(th: Thread) -> None:
    st = state(th)
    if st.open:
        st.groups.append(st.open)
        st.open = []


def wait(th: Thread, n: int) -> None:
    st = state(th)
    while len(st.groups) > n:
        for pend, run in st.groups.pop(0):
            run()
            pend.todo -= 1
            if pend.todo == 0:
                th.regs[pend.slot] = pend.values


def places(th: Thread, off: int, rows: np.ndarray, kdim: int, esz: int,
           layout: tuple) -> np.ndarray:
    """Shared-memory byte offsets of elements [rows, 0:kdim] (rows along M / N) of the operand
    whose first element is at logical offset `off`. `layout` = (swizzle, major, block bytes):
    K-major rows hold K; MN-major rows hold `swizzle` bytes along M / N and step along K;
    blocked layouts (MN-major, unswizzled) put blocks `block bytes` apart. (Every thread of a
    warpgroup reads the same B: the offsets are computed once per operand and place.)"""
    smem = th.cta.smem
    rows = np.asarray(rows)
    p = _places(smem.base, len(smem.u8), off, rows.dtype.str, rows.shape, rows.tobytes(), kdim,
                esz, layout)
    if isinstance(p, str):
        fail("bounds", f"{th.name}: {p}", None)
    return p


@functools.lru_cache(maxsize=4096)  # a kernel's operands x stages x rows of A
def _places(base: int, size: int, off: int, dtype: str, shape: tuple[int, ...], data: bytes,
            kdim: int, esz: int, layout: tuple) -> np.ndarray | str:
    swz, major, block = layout
    rows = np.frombuffer(data, dtype).reshape(shape).astype(np.int64)
    k = np.arange(kdim)[None, :]
    if major == "mn":
        width = swz // esz
        r = rows[:, None]
        lin = base + off + (r // width) * block + k * swz + (r % width) * esz
    elif swz == 16:  # unswizzled: [k blocks][rows][16 bytes]
        width = 16 // esz
        lin = base + off + (k // width) * block + rows[:, None] * 16 + (k % width) * esz
    else:
        lin = base + off + rows[:, None] * swz + k * esz
    lin = lin ^ (((lin >> 7) & S.mask(swz)) << 4)
    p = lin - base
    if p.min() < 0 or p.max() + esz > size:
        return "a wgmma operand reaches outside shared memory"
    p.flags.writeable = False  # shared by every caller with these arguments
    return p


def raw(th: Thread, p: np.ndarray, esz: int) -> np.ndarray:
    """The bytes of the elements at offsets `p` (read-only), shape p.shape + (esz,)."""
    smem = th.cta.smem
    key = (id(p), esz)
    hit = smem.gathered.get(key)
    if hit is not None and hit[0] is p and hit[1] == smem.version:
        return hit[2]  # no byte of shared memory changed since: the same bytes
    where = _BYTES.get(key)
    if where is None or where[0] is not p:  # the byte offsets of `places`' arrays, kept
        if len(_BYTES) > 512:
            _BYTES.clear()
        where = _BYTES[key] = (p, p[..., None] + np.arange(esz))
    data = smem.u8.take(where[1])
    data.flags.writeable = False  # shared by the callers until shared memory changes
    if len(smem.gathered) > 64:
        smem.gathered.clear()
    smem.gathered[key] = (p, smem.version, data)
    return data


_BYTES: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}


def decode(data: np.ndarray, kind: str) -> np.ndarray:
    """Element bytes (..., esz) as float32: bf16 / f16 / fp8 widened (exactly, so the products
    of two fp8 or 16-bit values are exact in f32), tf32 as its f32 value. The bytes that
    `raw` shares are decoded once (read-only)."""
    if data.flags.writeable:
        return _decode(data, kind)
    hit = _DECODED.get((id(data), kind))
    if hit is None or hit[0] is not data:
        if len(_DECODED) > 64:
            _DECODED.clear()
        hit = _DECODED[id(data), kind] = (data, _decode(data, kind))
        hit[1].flags.writeable = False
    return hit[1]


_DECODED: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}


def _decode(data: np.ndarray, kind: str) -> np.ndarray:
    if data.shape[-1] == 1:
        return data[..., 0].view(fp8.dtype(T.SCALARS[kind])).astype(np.float32)
    if data.shape[-1] == 2:
        bits = np.ascontiguousarray(data).view("<u2")[..., 0]
        if kind == "bf16":
            return (bits.astype(np.uint32) << 16).view(np.float32)
        return bits.view(np.float16).astype(np.float32)
    word = np.ascontiguousarray(data).view(np.uint32)[..., 0]
    return (word & np.uint32(0xFFFFE000)).view(np.float32)  # tf32 keeps 10 mantissa bits


def rows_of(th: Thread) -> np.ndarray:
    """The two accumulator rows (of 64) that a thread of a warpgroup holds."""
    q, lane = (th.tid // 32) % 4, th.tid % 32
    r = 16 * q + lane // 4
    return np.array([r, r + 8])


def scatter(th: Thread, prod: np.ndarray) -> np.ndarray:
    """A thread's fragment, in register order, of the (2, N) rows it holds."""
    return prod.take(_fragment(th.tid % 4, prod.shape[1]))


@functools.lru_cache(maxsize=64)
def _fragment(quad_lane: int, n: int) -> np.ndarray:
    """Flat indices into the (2, N) rows of a thread's fragment, in register order:
    d[4j + 2i + c] = rows[i, 8j + 2 * quad_lane + c]."""
    cols = (8 * np.arange(n // 8)[:, None, None] + 2 * quad_lane
            + np.arange(2)[None, None, :])  # (j, 1, c)
    rows = np.arange(2)[None, :, None]  # (1, i, 1)
    flat = (rows * n + cols).reshape(-1)
    flat.flags.writeable = False  # shared by every caller with these arguments
    return flat


def a_from_regs(th: Thread, quad: dict[int, list], kind: str) -> np.ndarray:
    """The (2, K) rows of A that a thread's rows hold (K = 16, or 32 of fp8), from the
    fragments of the four lanes of its quad (`quad`: lane -> fragment, gathered across the
    warp)."""
    first = th.tid % 32 // 4 * 4
    order = _A_ORDER_FP8 if len(quad[first]) == 16 else _A_ORDER
    values = [quad[first + lane][reg] for lane, reg in order]
    return np.array(values, np.float32).reshape(2, -1)


# (quad lane, element) of each element of a thread's (2, 16) rows of A, row-major:
# a[4h + 2i + c] of lane l is A[i, 8h + 2l + c]
_A_ORDER = [(lane, 4 * h + 2 * i + c) for i in range(2) for h in range(2) for lane in range(4)
            for c in range(2)]
# the same of fp8's (2, 32) rows: a[8h + 4i + c] of lane l is A[i, 16h + 4l + c]
_A_ORDER_FP8 = [(lane, 8 * h + 4 * i + c) for i in range(2) for h in range(2)
                for lane in range(4) for c in range(4)]
