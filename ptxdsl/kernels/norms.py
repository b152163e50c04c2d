"""Row normalisations (RMSNorm, softmax, LayerNorm) over rows of any length (norms.ptxdsl
spells out the first two forms).

`rmsnorm`, `softmax`, `layernorm`: warp-specialised TMA pipelines. One producer warp streams
whole rows into a ring of shared-memory stages with 1D bulk copies; consumer warps read their
slice of the row once into registers (a register array), release the stage at once, and
reduce: per-thread statistics, warp shuffles, then one round trip through shared memory
across warps (softmax combines (max, sum) pairs and LayerNorm (mean, sum of squared
deviations) pairs, so every kernel needs one barrier a row). They normalise in f32 from
registers, with the weights held in registers across rows, and write 16-byte vectors.

`rmsnorm_row`, `softmax_row`, `layernorm_row`: one row per CTA, no TMA: each thread loads its
slice with 16-byte global loads straight into registers, then the same reductions and
output. Launched with one CTA per row they are the faster form on the H200 (BENCHMARKS.md:
a grid of short-lived CTAs keeps more DRAM traffic in flight than a persistent ring).
`make_norm_masked` is that form for any n (n = 1000, 2880, 1001, ...): the loads past the
row's end are masked. `make_norm_loop` takes rows too long for registers (vocabulary-sized
softmax) in two sweeps.

`make_norm(kind, n, dtype, stages, consumer_warps)` and `make_norm_row(kind, n, dtype, warps)`
build any variant; the module-level kernels are the bf16, n = 8192 ones spelled out in
norms.ptxdsl, whose compile-time parameters N and T give the other sizes and element types
(`make(name, n, dtype)` builds the same kernel as `ptxdsl.parse_file("norms.ptxdsl",
defines={"N": n, "T": dtype})`).
"""

import numpy as np

import ptxdsl
from ptxdsl import array, bf16, f32, ptr, u32
from ptxdsl.kernels.family import Family

LOG2E = 1.4426950408889634
NEG_BIG = -3.0e38  # below any finite bf16/f32 row value: the identity of max
STATS = {"rmsnorm": 1, "softmax": 2, "layernorm": 2}  # values a thread reduces per row


def combine_softmax(k, mx, sm, count: int, pair, var: str = "q") -> tuple:
    """Fold `count` (max, sum of exp) pairs, pair(q) = (max_q, sum_q), into mx (the largest
    max) and sm (the sums rescaled to it), as online softmax does, and return (mx, sm). Each
    is an f32 register, or the name of a new one (made where its first value is, which keeps
    the PTX's register numbering); `var` names the unrolled loops' counter."""

    def put(reg, value):
        if isinstance(reg, str):
            return k.let(reg, value, type=f32)
        k.assign(reg, value)
        return reg

    mx = put(mx, pair(0)[0])
    with k.for_(var, 1, count, unroll=True) as q:
        k.assign(mx, k.max(mx, pair(q)[0]))
    sm = put(sm, 0.0)
    with k.for_(var, 0, count, unroll=True) as q:
        m, total = pair(q)
        k.assign(sm, sm + total * k.ex2((m - mx) * LOG2E))
    return mx, sm


class _Row:
    """The per-row math of one consumer thread over `e` elements held in register array
    `xr` (element t of the thread is column (t // width * threads + c) * width + t % width)
    of a row of n elements (masked elements hold 0, -inf for softmax)."""

    def __init__(self, k, kind: str, e: int, warps: int, eps: float, sync, n: int):
        self.k, self.kind, self.e, self.warps, self.eps, self.sync = k, kind, e, warps, eps, sync
        self.n = n

    def local(self, xr) -> list:
        """This thread's statistics; softmax replaces xr by exp(x - its max) and keeps that
        max in self.tmax for the output scale."""
        k, e = self.k, self.e
        if self.kind == "rmsnorm":
            ss = k.let("ss", 0.0, type=f32)
            with k.for_("t", 0, e, unroll=True) as t:
                k.assign(ss, ss + xr[t] * xr[t])
            return [ss]
        if self.kind == "softmax":
            self.tmax = k.let("tmax", NEG_BIG, type=f32)
            with k.for_("t", 0, e, unroll=True) as t:
                k.assign(self.tmax, k.max(self.tmax, xr[t]))
            sm = k.let("sm", 0.0, type=f32)
            with k.for_("t", 0, e, unroll=True) as t:
                xr[t] = k.ex2((xr[t] - self.tmax) * LOG2E)
                k.assign(sm, sm + xr[t])
            return [k.let("mx", self.tmax), sm]
        total = k.let("total", 0.0, type=f32)
        with k.for_("t", 0, e, unroll=True) as t:
            k.assign(total, total + xr[t])
        mean = k.let("mean", total * (1.0 / e))
        sq = k.let("sq", 0.0, type=f32)
        with k.for_("t", 0, e, unroll=True) as t:
            k.assign(sq, sq + (xr[t] - mean) * (xr[t] - mean))
        return [mean, sq]

    def warp(self, st: list) -> None:
        """Combine the statistics across the warp (butterfly: every lane gets the result)."""
        k = self.k
        with k.for_("s", 0, 5, unroll=True) as s:
            if self.kind == "rmsnorm":
                k.assign(st[0], st[0] + k.shfl_xor(st[0], 16 >> s))
            elif self.kind == "softmax":
                mx, sm = st
                mo = k.let("mo", k.shfl_xor(mx, 16 >> s))
                so = k.let("so", k.shfl_xor(sm, 16 >> s))
                mn = k.let("mn", k.max(mx, mo))
                k.assign(sm, sm * k.ex2((mx - mn) * LOG2E) + so * k.ex2((mo - mn) * LOG2E))
                k.assign(mx, mn)
            else:  # two groups of e << s elements each: Chan's pairwise update
                mean, sq = st
                mo = k.let("mo", k.shfl_xor(mean, 16 >> s))
                qo = k.let("qo", k.shfl_xor(sq, 16 >> s))
                d = k.let("d", mo - mean)
                k.assign(mean, (mean + mo) * 0.5)
                k.assign(sq, sq + qo + d * d * ((self.e << s).to(f32) * 0.5))

    def cta(self, st: list, red, slot, wid) -> list:
        """Combine the warps' statistics through `red` (one barrier); the row's values."""
        k, w = self.k, self.warps
        with k.if_(k.laneid == 0):
            for q, v in enumerate(st):
                red[slot, q, wid] = v
        self.sync()
        if self.kind == "rmsnorm":
            ss = st[0]
            k.assign(ss, red[slot, 0, 0])
            with k.for_("q", 1, w, unroll=True) as q:
                k.assign(ss, ss + red[slot, 0, q])
            k.assign(slot, slot ^ 1)
            return [k.let("inv", k.rsqrt(ss * (1.0 / self.n) + self.eps))]
        if self.kind == "softmax":
            big, total = combine_softmax(k, "big", "total", w,
                                         lambda q: (red[slot, 0, q], red[slot, 1, q]))
            k.assign(slot, slot ^ 1)
            return [k.let("scale", k.ex2((self.tmax - big) * LOG2E) * k.rcp(total))]
        mean = k.let("mu", red[slot, 0, 0])
        with k.for_("q", 1, w, unroll=True) as q:
            k.assign(mean, mean + red[slot, 0, q])
        k.assign(mean, mean * (1.0 / w))
        m2 = k.let("m2", 0.0, type=f32)
        with k.for_("q", 0, w, unroll=True) as q:
            dq = k.let("dq", red[slot, 0, q] - mean)
            k.assign(m2, m2 + red[slot, 1, q] + dq * dq * float(32 * self.e))
        k.assign(slot, slot ^ 1)
        return [mean, k.let("rstd", k.rsqrt(m2 * (1.0 / self.n) + self.eps))]

    def out(self, xt, vals: list, g=None, h=None):
        """An output element (f32) from its input xt, the row's values and its weights."""
        if self.kind == "rmsnorm":
            return xt * vals[0] * g
        if self.kind == "softmax":
            return xt * vals[0]
        return (xt - vals[0]) * vals[1] * g + h


def make_norm(kind: str, n: int = 8192, dtype=bf16, stages: int = 3,
              consumer_warps: int = 8, eps: float = 1e-5,
              name: str | None = None) -> ptxdsl.KernelDef:
    """The TMA ring form: one producer warp, `consumer_warps` consumer warps, a ring of
    `stages` row buffers; launch a persistent grid (every CTA resident)."""
    nc = consumer_warps * 32
    width = 16 // dtype.nbytes  # elements per 16-byte vector
    per_thread = n // (nc * width)  # vectors each consumer thread handles
    e = per_thread * width  # elements each consumer thread holds
    assert per_thread * nc * width == n, "n must be a multiple of 16 bytes x consumer threads"
    vec = ptxdsl.types.vector_type(dtype, width)
    if name is None:
        name = f"{kind}_{dtype}_{n}" if (dtype, n) != (bf16, 8192) else kind

    def body(k, x, y, rows, w=None, b=None):
        ring = k.pipeline("ring", stages, row=(dtype, [n], 128))
        red = k.shared("red", f32, [2, STATS[kind], consumer_warps], align=16)
        # weights (and bias) are read by every row: load them into shared memory once
        params = [p for p in (w, b) if p is not None]
        consts = [k.shared(nm, dtype, [n]) for nm, _ in zip(("wsh", "bsh"), params, strict=False)]
        with k.role("producer", 0, 1):
            with k.if_(k.elect()):
                if params:  # one-shot load: barrier, count, bytes, init and phase derived
                    with k.async_("weights") as wload:
                        for c, p in zip(consts, params, strict=True):
                            k.bulk_load(c, p[0])
                with k.for_("r", k.ctaid.x, rows, k.nctaid.x) as r:
                    k.acquire(ring)
                    k.bulk_load(ring.row, x[r * n])
                    k.commit(ring)
        with k.role("consumers", 1, 1 + consumer_warps):
            c = k.let("c", k.tid.x - 32)
            wid = k.let("wid", c >> 5)
            slot = k.let("slot", 0)
            wregs = []
            if params:  # this thread's columns of the weights, in registers for every row
                k.await_(wload)
                for nm, s in zip(("g", "h"), consts, strict=False):
                    reg = k.let(nm, type=array(f32, e))
                    with k.for_("i", 0, per_thread, unroll=True) as i:
                        v = k.let("v", k.vload(s[(i * nc + c) * width], width), type=vec)
                        with k.for_("j", 0, width, unroll=True) as j:
                            reg[i * width + j] = v[j].to(f32)
                    wregs.append(reg)
            row = _Row(k, kind, e, consumer_warps, eps, k.role_sync, n)
            with k.for_("r", k.ctaid.x, rows, k.nctaid.x) as r:
                k.wait(ring)
                xr = k.let("xr", type=array(f32, e))
                with k.for_("i", 0, per_thread, unroll=True) as i:
                    v = k.let("v", k.vload(ring.row[(i * nc + c) * width], width), type=vec)
                    with k.for_("j", 0, width, unroll=True) as j:
                        xr[i * width + j] = v[j].to(f32)
                k.release(ring)  # the row is in registers: the producer may refill the stage
                st = row.local(xr)
                row.warp(st)
                vals = row.cta(st, red, slot, wid)
                with k.for_("i", 0, per_thread, unroll=True) as i:
                    o = k.let("o", type=vec)
                    with k.for_("j", 0, width, unroll=True) as j:
                        t = i * width + j
                        o[j] = row.out(xr[t], vals, *[g[t] for g in wregs]).to(dtype)
                    y[r * n + (i * nc + c) * width] = o

    return ptxdsl.kernel(_signature(kind, dtype, body), threads=32 * (1 + consumer_warps),
                         name=name)


def _row_start(k, kind: str, e: int, warps: int, eps: float, n: int) -> tuple:
    """The one-row-per-CTA kernels' start: the warps' statistics in shared memory (two slots,
    alternating rows), the thread's index c, its warp wid, the slot, and the row's math."""
    red = k.shared("red", f32, [2, STATS[kind], warps], align=16)
    c = k.let("c", k.tid.x)
    wid = k.let("wid", c >> 5)
    slot = k.let("slot", 0)
    return red, c, wid, slot, _Row(k, kind, e, warps, eps, lambda: k.bar_sync(0), n)


def make_norm_row(kind: str, n: int = 8192, dtype=bf16, warps: int = 8, eps: float = 1e-5,
                  name: str | None = None, minctas: int | None = None) -> ptxdsl.KernelDef:
    """Without TMA or a pipeline: CTA c normalises rows c, c + gridDim, ... (launch one CTA
    per row), each thread loading its slice of the row with 16-byte global loads straight
    into a register array; the weights are read at the output (L2 hits after the first
    rows). `minctas` asks ptxas to fit that many CTAs on an SM (a register cap)."""
    nt = warps * 32
    width = 16 // dtype.nbytes
    per_thread = n // (nt * width)
    e = per_thread * width
    assert per_thread * nt * width == n, "n must be a multiple of 16 bytes x threads"
    vec = ptxdsl.types.vector_type(dtype, width)
    if name is None:
        name = f"{kind}_row_{dtype}_{n}" if (dtype, n) != (bf16, 8192) else f"{kind}_row"

    def body(k, x, y, rows, w=None, b=None):
        red, c, wid, slot, row = _row_start(k, kind, e, warps, eps, n)
        with k.for_("r", k.ctaid.x, rows, k.nctaid.x) as r:
            xr = k.let("xr", type=array(f32, e))
            with k.for_("i", 0, per_thread, unroll=True) as i:
                v = k.let("v", k.vload(x[r * n + (i * nt + c) * width], width), type=vec)
                with k.for_("j", 0, width, unroll=True) as j:
                    xr[i * width + j] = v[j].to(f32)
            st = row.local(xr)
            row.warp(st)
            vals = row.cta(st, red, slot, wid)
            with k.for_("i", 0, per_thread, unroll=True) as i:
                off = k.let("off", (i * nt + c) * width)
                ws = [k.let(nm, k.vload(p[off], width), type=vec)
                      for nm, p in (("g", w), ("h", b)) if p is not None]
                o = k.let("o", type=vec)
                with k.for_("j", 0, width, unroll=True) as j:
                    o[j] = row.out(xr[i * width + j], vals,
                                   *[g[j].to(f32) for g in ws]).to(dtype)
                y[r * n + off] = o

    return ptxdsl.kernel(_signature(kind, dtype, body), threads=nt, name=name, minctas=minctas)


class _Vec:
    """Loads and stores of `width` elements of `dtype`: a vector of up to 16 bytes, or one
    element (width 1). A load is indexed by j as a call: v(j)."""

    def __init__(self, dtype, width: int):
        self.dtype, self.width = dtype, width
        self.type = ptxdsl.types.vector_type(dtype, width) if width > 1 else dtype

    def load(self, k, name: str, p, idx):
        if self.width == 1:
            one = k.let(name, p[idx], type=self.dtype)
            return lambda j: one
        v = k.let(name, k.vload(p[idx], self.width), type=self.type)
        return lambda j: v[j]

    def store(self, k, p, idx, value) -> None:
        """p[idx + j] = value(j) (an f32) for every j, converted to the element type."""
        if self.width == 1:
            p[idx] = value(0).to(self.dtype)
            return
        o = k.let("o", type=self.type)
        with k.for_("j", 0, self.width, unroll=True) as j:
            o[j] = value(j).to(self.dtype)
        p[idx] = o


def _cta_sums(k, vals: list, red, slot, wid, warps: int, first: int = 0) -> None:
    """Replace each f32 value by its sum over the CTA (warp shuffles, then red[slot, first +
    its index]; one barrier)."""
    for v in vals:
        with k.for_("s", 0, 5, unroll=True) as s:
            k.assign(v, v + k.shfl_xor(v, 16 >> s))
    with k.if_(k.laneid == 0):
        for q, v in enumerate(vals, first):
            red[slot, q, wid] = v
    k.bar_sync(0)
    for q, v in enumerate(vals, first):
        k.assign(v, red[slot, q, 0])
        with k.for_("p", 1, warps, unroll=True) as p:
            k.assign(v, v + red[slot, q, p])


def _width(dtype, vec: int | None, n: int) -> int:
    width = vec or 16 // dtype.nbytes
    assert width * dtype.nbytes <= 16 and 16 % (width * dtype.nbytes) == 0, \
        "a load is a power of two elements of at most 16 bytes"
    assert n % width == 0, "n must be a multiple of the elements a load takes"
    return width


def make_norm_masked(kind: str, n: int, dtype=bf16, warps: int = 8, vec: int | None = None,
                     eps: float = 1e-5, name: str | None = None) -> ptxdsl.KernelDef:
    """make_norm_row's form for any n: each thread holds ceil(n / (32 warps vec)) loads of
    `vec` elements (n a multiple of vec; default 16 bytes), and the loads past the row's end
    are masked: read clamped inside the row, replaced by the reduction's identity (0, or
    -inf for softmax), not stored. LayerNorm reduces twice (the mean, then the squared
    deviations of the elements that are there)."""
    nt = warps * 32
    width = _width(dtype, vec, n)
    per_thread = -(-n // (nt * width))
    e = per_thread * width
    fill = float("-inf") if kind == "softmax" else 0.0
    vecs = _Vec(dtype, width)
    name = name or f"{kind}_masked_{dtype}_{n}_w{warps}_v{width}"

    def body(k, x, y, rows, w=None, b=None):
        red, c, wid, slot, row = _row_start(k, kind, e, warps, eps, n)
        with k.for_("r", k.ctaid.x, rows, k.nctaid.x) as r:
            base = k.let("base", r * n)
            xr = k.let("xr", type=array(f32, e))
            with k.for_("i", 0, per_thread, unroll=True) as i:
                off = k.let("off", (i * nt + c) * width)
                ok = k.let("ok", off < n)
                v = vecs.load(k, "v", x, base + k.min(off, n - width))
                with k.for_("j", 0, width, unroll=True) as j:
                    xr[i * width + j] = k.select(ok, v(j).to(f32), fill)
            if kind == "layernorm":
                mean = k.let("mean", 0.0, type=f32)
                with k.for_("t", 0, e, unroll=True) as t:
                    k.assign(mean, mean + xr[t])
                _cta_sums(k, [mean], red, slot, wid, warps)
                k.assign(mean, mean * (1.0 / n))
                sq = k.let("sq", 0.0, type=f32)
                with k.for_("i", 0, per_thread, unroll=True) as i:
                    ok = k.let("ok", (i * nt + c) * width < n)
                    with k.for_("j", 0, width, unroll=True) as j:
                        d = k.let("d", xr[i * width + j] - mean)
                        k.assign(sq, sq + k.select(ok, d * d, 0.0))
                _cta_sums(k, [sq], red, slot, wid, warps, first=1)
                k.assign(slot, slot ^ 1)
                vals = [mean, k.let("rstd", k.rsqrt(sq * (1.0 / n) + eps))]
            else:
                st = row.local(xr)
                row.warp(st)
                vals = row.cta(st, red, slot, wid)
            with k.for_("i", 0, per_thread, unroll=True) as i:
                off = k.let("off", (i * nt + c) * width)
                with k.if_(off < n):
                    ws = [vecs.load(k, nm, p, off) for nm, p in (("g", w), ("h", b))
                          if p is not None]
                    vecs.store(k, y, base + off, lambda j: row.out(
                        xr[i * width + j], vals, *[g(j).to(f32) for g in ws]))

    return ptxdsl.kernel(_signature(kind, dtype, body), threads=nt, name=name)


def make_norm_loop(kind: str, n: int, dtype=bf16, warps: int = 16, vec: int | None = None,
                   unroll: int = 4, eps: float = 1e-5, name: str | None = None
                   ) -> ptxdsl.KernelDef:
    """One row per CTA for rows too long for registers (vocabulary-sized softmax): a first
    sweep over the row gathers its statistics, `unroll` loads of `vec` elements per thread a
    step (RMSNorm the sum of squares; softmax a running (max, sum) pair; LayerNorm the sums
    of x - x0 and its square, x0 the row's first element, which keeps E[d^2] - E[d]^2 clear
    of cancellation); a second sweep reads the row again and writes the output. Launch few
    enough CTAs that their rows stay in L2 between the sweeps. Masked as make_norm_masked."""
    nt = warps * 32
    width = _width(dtype, vec, n)
    steps = -(-n // (nt * width * unroll))
    e = unroll * width  # elements a thread holds a step
    vecs = _Vec(dtype, width)
    name = name or f"{kind}_loop_{dtype}_{n}_w{warps}_v{width}_u{unroll}"

    def step(k, x, base, it, c, fill):
        """This thread's `unroll` loads of step `it` (all issued before any use), as f32;
        those past the row's end read clamped inside it and replaced by `fill`."""
        xs = k.let("xs", type=array(f32, e))
        with k.for_("u", 0, unroll, unroll=True) as u:
            off = k.let("off", ((it * unroll + u) * nt + c) * width)
            ok = k.let("ok", off < n)
            v = vecs.load(k, "v", x, base + k.min(off, n - width))
            with k.for_("j", 0, width, unroll=True) as j:
                xs[u * width + j] = v(j).to(f32) if fill is None else \
                    k.select(ok, v(j).to(f32), fill)
        return xs

    def body(k, x, y, rows, w=None, b=None):
        red = k.shared("red", f32, [2, 2, warps], align=16)
        c = k.let("c", k.tid.x)
        wid = k.let("wid", c >> 5)
        slot = k.let("slot", 0)
        with k.for_("r", k.ctaid.x, rows, k.nctaid.x) as r:
            base = k.let("base", r * n)
            if kind == "softmax":
                mx = k.let("mx", NEG_BIG, type=f32)
                sm = k.let("sm", 0.0, type=f32)
            else:
                x0 = k.let("x0", x[base].to(f32) if kind == "layernorm" else 0.0, type=f32)
                a = k.let("a", 0.0, type=f32)
                q = k.let("q", 0.0, type=f32)
            with k.for_("it", 0, steps) as it:
                if kind == "softmax":  # masked elements are -inf: ex2 makes them 0
                    xs = step(k, x, base, it, c, float("-inf"))
                    nm = k.let("nm", mx)
                    with k.for_("t", 0, e, unroll=True) as t:
                        k.assign(nm, k.max(nm, xs[t]))
                    k.assign(sm, sm * k.ex2((mx - nm) * LOG2E))
                    with k.for_("t", 0, e, unroll=True) as t:
                        k.assign(sm, sm + k.ex2((xs[t] - nm) * LOG2E))
                    k.assign(mx, nm)
                else:  # masked elements are x0: they add nothing
                    xs = step(k, x, base, it, c, x0)
                    with k.for_("t", 0, e, unroll=True) as t:
                        d = k.let("d", xs[t] - x0)
                        k.assign(a, a + d * d if kind == "rmsnorm" else a + d)
                        if kind == "layernorm":
                            k.assign(q, q + d * d)
            if kind == "softmax":
                _Row(k, kind, 0, warps, eps, None, n).warp([mx, sm])
                with k.if_(k.laneid == 0):
                    red[slot, 0, wid] = mx
                    red[slot, 1, wid] = sm
                k.bar_sync(0)
                combine_softmax(k, mx, sm, warps, lambda p: (red[slot, 0, p], red[slot, 1, p]),
                                var="p")
                k.assign(sm, k.rcp(sm))
            else:
                _cta_sums(k, [a, q], red, slot, wid, warps)
                if kind == "rmsnorm":
                    k.assign(a, k.rsqrt(a * (1.0 / n) + eps))
                else:
                    mean = k.let("mean", a * (1.0 / n))
                    var = k.let("var", k.max(q * (1.0 / n) - mean * mean, 0.0))
                    k.assign(a, x0 + mean)
                    k.assign(q, k.rsqrt(var + eps))
            k.assign(slot, slot ^ 1)
            with k.for_("it", 0, steps) as it:
                xs = step(k, x, base, it, c, None)
                with k.for_("u", 0, unroll, unroll=True) as u:
                    off = k.let("off", ((it * unroll + u) * nt + c) * width)
                    with k.if_(off < n):
                        ws = [vecs.load(k, nm, p, off) for nm, p in (("g", w), ("h", b))
                              if p is not None]
                        if kind == "rmsnorm":
                            def out(j):
                                return xs[u * width + j] * a * ws[0](j).to(f32)
                        elif kind == "softmax":
                            def out(j):
                                return k.ex2((xs[u * width + j] - mx) * LOG2E) * sm
                        else:
                            def out(j):
                                return ((xs[u * width + j] - a) * q * ws[0](j).to(f32)
                                        + ws[1](j).to(f32))
                        vecs.store(k, y, base + off, out)

    return ptxdsl.kernel(_signature(kind, dtype, body), threads=nt, name=name)


def _signature(kind: str, dtype, body):
    # the parameters' annotations are ptxdsl types (values), which mypy cannot read as types
    p = ptr(dtype)
    if kind == "rmsnorm":
        def kernel(k, x: p, w: p, y: p, rows: u32):  # type: ignore[valid-type]
            body(k, x, y, rows, w=w)
    elif kind == "softmax":
        def kernel(k, x: p, y: p, rows: u32):  # type: ignore[valid-type,misc]
            body(k, x, y, rows)
    elif kind == "layernorm":
        def kernel(k, x: p, w: p, b: p, y: p, rows: u32):  # type: ignore[valid-type,misc]
            body(k, x, y, rows, w=w, b=b)
    else:
        raise ValueError(f"unknown normalisation {kind!r}")
    return kernel


rmsnorm = make_norm("rmsnorm")
softmax = make_norm("softmax")
layernorm = make_norm("layernorm")
rmsnorm_row = make_norm_row("rmsnorm")
softmax_row = make_norm_row("softmax")
layernorm_row = make_norm_row("layernorm")


def make(name: str, n: int = 8192, dtype=bf16) -> ptxdsl.KernelDef:
    """The kernel `name` of norms.ptxdsl (e.g. softmax, layernorm_row) for n and dtype, named
    as the text names it."""
    kind, _, form = name.partition("_")
    if form == "row":
        return make_norm_row(kind, n, dtype, name=name)
    return make_norm(kind, n, dtype, name=name)


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


KERNELS = {kd.name: kd for kd in (rmsnorm, softmax, layernorm, rmsnorm_row, softmax_row,
                                   layernorm_row)}
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


FAMILY = Family(
    name="norms",
    summary="RMSNorm, LayerNorm and softmax over rows, bf16 or f32: one row per CTA in "
            "registers (masked tail for any n; make_norm_loop streams longer rows twice)",
    factory=make_norm_row,
    defaults={"kind": "rmsnorm", "n": 8192, "dtype": bf16, "warps": 8},
    source="norms.ptxdsl",
)
