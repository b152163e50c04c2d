"""Row top-8 by bitonic sorting and merging in registers, written with the Python API (twin
of topk.ptxdsl). The text's functions are Python functions here; each names its values as
the text's inlined call does (`_order2_x`: the `x` of the second call inlined), so that both
build the same IR."""

import numpy as np

import ptxdsl
from ptxdsl import f32, ptr, s32, u32
from ptxdsl import types as T
from ptxdsl.runtime.dtypes import bf16_to_f32

K = 8  # the k of top-k
N = 8192  # columns (the text's compile-time parameter N)
ROWS_PER_CTA = 4  # one warp per row


class Calls:
    """The names of inlined calls, in the order they are built: call n of function f names
    its value x `_{f}{n}_{x}` (docs/language.md, Functions)."""

    def __init__(self) -> None:
        self.n = 0

    def of(self, fn: str):
        self.n += 1
        n = self.n
        return lambda name: f"_{fn}{n}_{name}"


def order(k, calls: Calls, tv, ti, a, b) -> None:
    """Compare-exchange: afterwards tv[a] >= tv[b], each column moving with its value."""
    name = calls.of("order")
    x = k.let(name("x"), tv[a])
    y = k.let(name("y"), tv[b])
    i = k.let(name("i"), ti[a])
    j = k.let(name("j"), ti[b])
    keep = k.let(name("keep"), x >= y)
    tv[a] = k.select(keep, x, y)
    tv[b] = k.select(keep, y, x)
    ti[a] = k.select(keep, i, j)
    ti[b] = k.select(keep, j, i)


def sort(k, calls: Calls, tv, ti) -> None:
    """The bitonic network sorting 8 pairs, largest first."""
    name = calls.of("sort")
    with k.for_(name("s"), 0, 3, unroll=True) as s:
        with k.for_(name("t"), 0, 3, unroll=True) as t, k.if_(t <= s):
            with k.for_(name("q"), 0, K // 2, unroll=True) as q:
                j = k.let(name("j"), k.max((1 << s) >> t, 1))
                a = k.let(name("a"), q / j * (2 * j) + q % j)
                up = k.let(name("up"), (a >> (s + 1)) & 1)
                order(k, calls, tv, ti, a + up * j, a + j - up * j)


def merge(k, calls: Calls, tv, ti, nv, ni) -> None:
    """Keep the 8 largest of two lists sorted largest first."""
    name = calls.of("merge")
    with k.for_(name("i"), 0, K, unroll=True) as i:
        take = k.let(name("take"), nv[K - 1 - i] > tv[i])
        tv[i] = k.select(take, nv[K - 1 - i], tv[i])
        ti[i] = k.select(take, ni[K - 1 - i], ti[i])
    with k.for_(name("d"), 0, 3, unroll=True) as d:
        with k.for_(name("q"), 0, K // 2, unroll=True) as q:
            a = k.let(name("a"), q / (4 >> d) * (8 >> d) + q % (4 >> d))
            order(k, calls, tv, ti, a, a + (4 >> d))


def make_topk(n: int = N, dtype: T.Scalar = f32) -> ptxdsl.KernelDef:
    """The kernel for rows of n values of dtype (f32 or bf16; compared as f32)."""

    def topk(k, x: ptr(dtype), values: ptr(dtype), indices: ptr(s32), rows: u32):
        calls = Calls()
        row = k.let("row", k.ctaid.x * ROWS_PER_CTA + k.warp)
        with k.if_(row < rows):
            base = k.let("base", row * n + k.laneid)
            tv = k.let("tv", type=ptxdsl.array(f32, K))
            ti = k.let("ti", type=ptxdsl.array(u32, K))
            with k.for_("e", 0, K, unroll=True) as e:
                tv[e] = x[base + e * 32].to(f32)
                ti[e] = k.laneid + e * 32
            sort(k, calls, tv, ti)
            nv = k.let("nv", type=ptxdsl.array(f32, K))
            ni = k.let("ni", type=ptxdsl.array(u32, K))
            with k.for_("c", 1, n // 256) as c:
                with k.for_("e", 0, K, unroll=True) as e:
                    nv[e] = x[base + c * 256 + e * 32].to(f32)
                    ni[e] = k.laneid + c * 256 + e * 32
                sort(k, calls, nv, ni)
                merge(k, calls, tv, ti, nv, ni)
            with k.for_("r", 0, 5, unroll=True) as r:
                with k.for_("e", 0, K, unroll=True) as e:
                    nv[e] = k.shfl_xor(tv[e], 16 >> r)
                    ni[e] = k.shfl_xor(ti[e], 16 >> r)
                merge(k, calls, tv, ti, nv, ni)
            with k.if_(k.laneid == 0):
                with k.for_("e", 0, K, unroll=True) as e:
                    values[row * K + e] = tv[e].to(dtype)
                    indices[row * K + e] = ti[e].to(s32)

    return ptxdsl.kernel(topk, threads=32 * ROWS_PER_CTA)


topk = make_topk()


# example() sizes small enough for the CPU interpreter (ptxdsl interp, tests); the text's N
# must be given alike: ptxdsl interp samples/topk.ptxdsl -D N=512
SMALL = {"rows": 2}  # one CTA, two of its warps past the last row


def reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The top K values of each row, largest first, and the columns numpy's stable sort puts
    first among equal values (the kernel may pick other columns of equal values)."""
    cols = np.argsort(-x, axis=1, kind="stable")[:, :K].astype(np.int32)
    return np.take_along_axis(x, cols.astype(np.int64), axis=1), cols


def example(rng: np.random.Generator, rows: int = 4096, defines: dict | None = None) -> dict:
    """x is [rows, N] of T (N and T from -D, else 8192 and f32); values and indices are
    [rows, K]. Each row is a permutation of N distinct values, so that the columns are unique
    and both outputs compare exactly: multiples of 1/8 in f32; for bf16, N/2 consecutive bf16
    magnitudes of either sign, given and compared as bit patterns."""
    n = int((defines or {}).get("N", N))
    bf16 = (defines or {}).get("T", "f32") == "bf16"
    if bf16:
        mags = 0x3800 + np.arange(n // 2, dtype=np.uint16)
        pattern = np.concatenate([mags, mags | 0x8000]).astype(np.uint16)
    else:
        pattern = (np.arange(n, dtype=np.float32) - n / 2) / 8
    x = rng.permuted(np.tile(pattern, (rows, 1)), axis=1)
    values, cols = reference(bf16_to_f32(x) if bf16 else x)
    if bf16:
        values = np.take_along_axis(x, cols.astype(np.int64), axis=1)
    return {"grid": (rows + ROWS_PER_CTA - 1) // ROWS_PER_CTA, "inputs": {"x": x, "rows": rows},
            "outputs": {"values": np.zeros((rows, K), x.dtype),
                        "indices": np.zeros((rows, K), np.int32)},
            "expected": {"values": values, "indices": cols}}
