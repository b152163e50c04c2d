"""Row normalisations (RMSNorm, softmax, LayerNorm) as warp-specialised TMA pipelines.

One producer warp streams whole rows into a ring of shared-memory stages with 1D bulk
copies; consumer warps reduce each row (warp shuffles, then across warps through shared
memory), normalise it in f32 and write the result with 16-byte stores. Consumers re-read the
row from shared memory for each pass instead of holding it in registers.

`make_norm(kind, n, dtype, stages, consumer_warps)` builds any variant; the module-level
kernels are the bf16, n = 8192 ones spelled out in norms.ptxdsl, whose compile-time parameters
N and T give the other sizes and element types (`make_norm(kind, n, dtype, name=kind)` builds
the same kernel as `ptxdsl.parse_file("norms.ptxdsl", defines={"N": n, "T": dtype})`).
"""

import numpy as np

import ptxdsl
from ptxdsl import bf16, f32, ptr, u32

LOG2E = 1.4426950408889634
NEG_BIG = -3.0e38  # below any finite bf16/f32 row value: the identity of max


def make_norm(kind: str, n: int = 8192, dtype=bf16, stages: int = 3,
              consumer_warps: int = 8, eps: float = 1e-5,
              name: str | None = None) -> ptxdsl.KernelDef:
    nc = consumer_warps * 32
    width = 16 // dtype.nbytes  # elements per 16-byte vector
    per_thread = n // (nc * width)  # vectors each consumer thread handles per pass
    assert per_thread * nc * width == n, "n must be a multiple of 16 bytes x consumer threads"
    vec = ptxdsl.types.vector_type(dtype, width)
    if name is None:
        name = f"{kind}_{dtype}_{n}" if (dtype, n) != (bf16, 8192) else kind

    def body(k, x, y, rows, w=None, b=None):
        ring = k.pipeline("ring", stages, row=(dtype, [n], 128))
        red = k.shared("red", f32, [2, consumer_warps], align=16)
        # weights (and bias) are read by every row: load them into shared memory once
        params = [p for p in (w, b) if p is not None]
        consts = [k.shared(nm, dtype, [n]) for nm, _ in zip(("wsh", "bsh"), params, strict=False)]
        with k.role("producer", 0, 1):
            with k.if_(k.elect()):
                if params:  # one-shot load: barrier, count, bytes, init and phase derived
                    with k.async_("weights") as weights:
                        for c, p in zip(consts, params, strict=True):
                            k.bulk_load(c, p[0])
                with k.for_("r", k.ctaid.x, rows, k.nctaid.x) as r:
                    k.acquire(ring)
                    k.bulk_load(ring.row, x[r * n])
                    k.commit(ring)
        with k.role("consumers", 1, 1 + consumer_warps):
            if params:
                k.await_(weights)
            c = k.let("c", k.tid.x - 32)
            wid = k.let("wid", c >> 5)
            slot = k.let("slot", 0)
            with k.for_("r", k.ctaid.x, rows, k.nctaid.x) as r:
                k.wait(ring)

                def row_pass(acc_name, init, elem, combine=lambda a, v: a + v):
                    """One pass over this thread's slice of the row (`elem` folds in one
                    element), then a row reduction with `combine`."""
                    acc = k.let(acc_name, init, type=f32)
                    with k.for_("i", 0, per_thread, unroll=True) as i:
                        v = k.let("v", k.vload(ring.row[(i * nc + c) * width], width), type=vec)
                        with k.for_("j", 0, width, unroll=True) as j:
                            k.assign(acc, elem(acc, v[j].to(f32)))
                    with k.for_("s", 0, 5, unroll=True) as s:
                        k.assign(acc, combine(acc, k.shfl_xor(acc, 16 >> s)))
                    with k.if_(k.laneid == 0):
                        red[slot, wid] = acc
                    k.role_sync()
                    k.assign(acc, red[slot, 0])
                    with k.for_("q", 1, consumer_warps, unroll=True) as q:
                        k.assign(acc, combine(acc, red[slot, q]))
                    k.assign(slot, slot ^ 1)
                    return acc

                def write(f):
                    """y = f(x_j, j) over this thread's slice, in 16-byte stores."""
                    with k.for_("i", 0, per_thread, unroll=True) as i:
                        off = k.let("off", (i * nc + c) * width)
                        v = k.let("v", k.vload(ring.row[off], width), type=vec)
                        extra = [k.let(nm, k.vload(s[off], width), type=vec)
                                 for nm, s in zip(("g", "h"), consts, strict=False)]
                        o = k.let("o", type=vec)
                        with k.for_("j", 0, width, unroll=True) as j:
                            o[j] = f(v[j].to(f32), *[e[j].to(f32) for e in extra]).to(dtype)
                        y[r * n + off] = o

                if kind == "rmsnorm":
                    ss = row_pass("ss", 0.0, lambda a, v: a + v * v)
                    inv = k.let("inv", k.rsqrt(ss * (1.0 / n) + eps))
                    write(lambda v, g: v * inv * g)
                elif kind == "softmax":
                    mx = row_pass("mx", NEG_BIG, k.max, k.max)
                    sm = row_pass("sm", 0.0, lambda a, v: a + k.ex2((v - mx) * LOG2E))
                    inv = k.let("inv", k.rcp(sm))
                    write(lambda v: k.ex2((v - mx) * LOG2E) * inv)
                else:
                    total = row_pass("total", 0.0, lambda a, v: a + v)
                    mean = k.let("mean", total * (1.0 / n))
                    sq = row_pass("sq", 0.0, lambda a, v: a + (v - mean) * (v - mean))
                    rstd = k.let("rstd", k.rsqrt(sq * (1.0 / n) + eps))
                    write(lambda v, g, h: (v - mean) * rstd * g + h)
                k.release(ring)

    p = ptr(dtype)
    if kind == "rmsnorm":
        def kernel(k, x: p, w: p, y: p, rows: u32):
            body(k, x, y, rows, w=w)
    elif kind == "softmax":
        def kernel(k, x: p, y: p, rows: u32):
            body(k, x, y, rows)
    elif kind == "layernorm":
        def kernel(k, x: p, w: p, b: p, y: p, rows: u32):
            body(k, x, y, rows, w=w, b=b)
    else:
        raise ValueError(f"unknown normalisation {kind!r}")
    return ptxdsl.kernel(kernel, threads=32 * (1 + consumer_warps), name=name)


rmsnorm = make_norm("rmsnorm")
softmax = make_norm("softmax")
layernorm = make_norm("layernorm")


def reference(kind: str, x: np.ndarray, w=None, b=None, eps: float = 1e-5) -> np.ndarray:
    """The numpy reference in float64."""
    x = x.astype(np.float64)
    if kind == "rmsnorm":
        return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * w
    if kind == "softmax":
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


KERNELS = {"rmsnorm": rmsnorm, "softmax": softmax, "layernorm": layernorm}
ATOL = {"rmsnorm": 2e-2, "softmax": 1e-6, "layernorm": 2e-2}
RTOL = {"bf16": 1.6e-2, "f16": 2e-3}  # one rounding of the output; f32 otherwise


# example() sizes small enough for the CPU interpreter (ptxdsl interp, tests)
SMALL = {"rows": 2}


def example(rng: np.random.Generator, kernel: str = "rmsnorm", rows: int = 96, n: int = 8192,
            dtype=bf16, defines: dict | None = None) -> dict:
    """Inputs, grid and float64 reference for one normalisation over `rows` rows; `defines`
    (`ptxdsl run norms.ptxdsl -D N=4096 -D T=f32`) set n and dtype as they set the kernel."""
    if defines:
        n = int(str(defines.get("N", n)), 0)
        dtype = ptxdsl.types.SCALARS[str(defines.get("T", dtype))]
    kind = kernel.split("_")[0]
    x = rng.standard_normal((rows, n)).astype(np.float32) * 2.0
    w = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    b = (0.1 * rng.standard_normal(n)).astype(np.float32)
    if dtype != f32:  # bf16 as ml_dtypes' bfloat16, f16 as float16: rounded to nearest even
        x, w, b = (a.astype(ptxdsl.types.numpy_dtype(dtype)) for a in (x, w, b))
        xf, wf, bf = (a.astype(np.float32) for a in (x, w, b))
    else:
        xf, wf, bf = x, w, b
    inputs = {"x": x, "rows": rows}
    if kind in ("rmsnorm", "layernorm"):
        inputs["w"] = w
    if kind == "layernorm":
        inputs["b"] = b
    want = reference(kind, xf, wf, bf)
    return {"kernel": kernel, "grid": 16, "inputs": inputs,
            "outputs": {"y": np.empty_like(x)}, "expected": {"y": want},
            "rtol": RTOL.get(dtype.name, 2e-5), "atol": ATOL[kind]}
