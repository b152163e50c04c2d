"""Long-row RMSNorm and softmax on a cluster (twin of longrow.ptxdsl; bf16 rows that split
evenly over the cluster: the torch ops take other long rows with norms.make_norm_loop).

A row too long for one CTA (65536 or 262144 bf16) is split across the C CTAs of a cluster:
CTA rank q owns columns [q*S, (q+1)*S), S = n / C. Each CTA streams its slice of every row
into a pipeline of shared-memory stages (1D bulk copies), reduces the slice (warp shuffles,
then across warps through shared memory), and sends its partial result to every CTA of the
cluster with st.async into their shared memory, completing on their exchange mbarrier
(`xbar`, double-buffered, armed with C x the partial's bytes). Every CTA then combines the C
partials, normalises its slice and writes it. Softmax exchanges (max, sum of exp) pairs and
rescales them (online softmax), so each row is read from global memory once.

`make_longrow(kind, n, cluster, stages, consumer_warps)` builds any variant; the module
level kernels are the ones spelled out in longrow.ptxdsl (n = 65536, clusters of 4).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import ptxdsl
from ptxdsl import bf16, f32, ptr, u32
from ptxdsl.kernels.family import Family
from ptxdsl.kernels.norms import LOG2E, NEG_BIG, combine_softmax


def make_longrow(kind: str, n: int = 65536, cluster: int = 4, stages: int = 2,
                 consumer_warps: int = 8, eps: float = 1e-5) -> ptxdsl.KernelDef:
    S = n // cluster  # columns per CTA
    nc = consumer_warps * 32
    per_thread = S // (nc * 8)  # bf16x8 vectors per consumer thread
    assert per_thread * nc * 8 == S, "n / cluster must be a multiple of 8 x consumer threads"
    vals = 1 if kind == "rmsnorm" else 2  # f32 values a CTA sends to each peer per row
    name = f"{kind}_{n}_c{cluster}" if (n, cluster) != (65536, 4) else f"longrow_{kind}"

    def body(k, x, y, rows, w=None):
        ring = k.pipeline("ring", stages, row=(bf16, [S], 128))
        red = k.shared("red", f32, [2, vals, consumer_warps], align=16)
        part = k.shared("part", f32, [2, cluster, vals], align=16)
        xbar = k.mbarrier("xbar", count=1, n=2)
        if w is not None:
            wsh = k.shared("wsh", bf16, [S], align=128)
            wbar = k.mbarrier("wbar", count=1)
        with k.if_(k.tid.x == 0):
            k.mbarrier_init(xbar[0])
            k.mbarrier_init(xbar[1])
            if w is not None:
                k.mbarrier_init(wbar)
            k.fence_mbarrier_init()
        # peers st.async into xbar: its init must be visible cluster-wide first
        k.cluster_sync()
        rank = k.let("rank", k.cluster_ctarank)
        col0 = k.let("col0", rank * S)
        with k.role("producer", 0, 1):
            with k.if_(k.elect()):
                if w is not None:
                    k.mbarrier_arrive_expect_tx(wbar, S * 2)
                    k.bulk_load(wsh, w[col0], wbar)
                with k.for_("r", k.clusterid.x, rows, k.nclusterid.x) as r:
                    k.acquire(ring)
                    k.bulk_load(ring.row, x[r * n + col0])
                    k.commit(ring)
        with k.role("consumers", 1, 1 + consumer_warps):
            if w is not None:
                k.mbarrier_wait(wbar, 0)
            c = k.let("c", k.tid.x - 32)
            wid = k.let("wid", c >> 5)
            it = k.let("it", 0)  # rows done: red and xbar slot, xbar parity

            def cta_reduce(values, op):
                """Reduce per-thread values over the consumer warps (one red slot)."""
                slot = it & 1
                for v in values:
                    with k.for_("s", 0, 5, unroll=True) as s:
                        k.assign(v, op(v, k.shfl_xor(v, 16 >> s)))
                with k.if_(k.laneid == 0):
                    for i, v in enumerate(values):
                        red[slot, i, wid] = v
                k.role_sync()
                for i, v in enumerate(values):
                    k.assign(v, red[slot, i, 0])
                    with k.for_("q", 1, consumer_warps, unroll=True) as q:
                        k.assign(v, op(v, red[slot, i, q]))

            def exchange(value):
                """Send this CTA's partial to every CTA of the cluster; wait for theirs."""
                xs = k.let("xs", it & 1)
                with k.if_(c == 0):
                    k.mbarrier_arrive_expect_tx(xbar[xs], cluster * vals * 4)
                    with k.for_("q", 0, cluster, unroll=True) as q:
                        k.st_async(k.peer(part[xs, rank], q) if vals > 1 else
                                   k.peer(part[xs, rank, 0], q), value, k.peer(xbar[xs], q))
                k.mbarrier_wait(xbar[xs], (it >> 1) & 1)
                return xs

            with k.for_("r", k.clusterid.x, rows, k.nclusterid.x) as r:
                k.wait(ring)
                if kind == "rmsnorm":
                    ss = k.let("ss", 0.0, type=f32)
                    with k.for_("i", 0, per_thread, unroll=True) as i:
                        v = k.let("v", k.vload(ring.row[(i * nc + c) * 8], 8),
                                  type=ptxdsl.bf16x8)
                        with k.for_("j", 0, 8, unroll=True) as j:
                            k.assign(ss, ss + v[j].to(f32) * v[j].to(f32))
                    cta_reduce([ss], lambda a, b: a + b)
                    xs = exchange(ss)
                    k.assign(ss, part[xs, 0, 0])
                    with k.for_("q", 1, cluster, unroll=True) as q:
                        k.assign(ss, ss + part[xs, q, 0])
                    inv = k.let("inv", k.rsqrt(ss * (1.0 / n) + eps))
                    with k.for_("i", 0, per_thread, unroll=True) as i:
                        off = k.let("off", (i * nc + c) * 8)
                        v = k.let("v", k.vload(ring.row[off], 8), type=ptxdsl.bf16x8)
                        g = k.let("g", k.vload(wsh[off], 8), type=ptxdsl.bf16x8)
                        o = k.let("o", type=ptxdsl.bf16x8)
                        with k.for_("j", 0, 8, unroll=True) as j:
                            o[j] = (v[j].to(f32) * inv * g[j].to(f32)).to(bf16)
                        y[r * n + col0 + off] = o
                else:
                    mx = k.let("mx", NEG_BIG, type=f32)
                    with k.for_("i", 0, per_thread, unroll=True) as i:
                        v = k.let("v", k.vload(ring.row[(i * nc + c) * 8], 8),
                                  type=ptxdsl.bf16x8)
                        with k.for_("j", 0, 8, unroll=True) as j:
                            k.assign(mx, k.max(mx, v[j].to(f32)))
                    sm = k.let("sm", 0.0, type=f32)
                    with k.for_("i", 0, per_thread, unroll=True) as i:
                        v = k.let("v", k.vload(ring.row[(i * nc + c) * 8], 8),
                                  type=ptxdsl.bf16x8)
                        with k.for_("j", 0, 8, unroll=True) as j:
                            k.assign(sm, sm + k.ex2((v[j].to(f32) - mx) * LOG2E))
                    # combine (max, sum) pairs across the warps, then across the cluster
                    with k.for_("s", 0, 5, unroll=True) as s:
                        om = k.let("om", k.shfl_xor(mx, 16 >> s))
                        os_ = k.let("os", k.shfl_xor(sm, 16 >> s))
                        nm = k.let("nm", k.max(mx, om))
                        k.assign(sm, sm * k.ex2((mx - nm) * LOG2E) + os_ * k.ex2((om - nm) * LOG2E))
                        k.assign(mx, nm)
                    slot = it & 1
                    with k.if_(k.laneid == 0):
                        red[slot, 0, wid] = mx
                        red[slot, 1, wid] = sm
                    k.role_sync()
                    combine_softmax(k, mx, sm, consumer_warps,
                                    lambda q: (red[slot, 0, q], red[slot, 1, q]))
                    xs = exchange(k.f32x2(mx, sm))
                    combine_softmax(k, mx, sm, cluster, lambda q: (part[xs, q, 0], part[xs, q, 1]))
                    inv = k.let("inv", k.rcp(sm))
                    with k.for_("i", 0, per_thread, unroll=True) as i:
                        off = k.let("off", (i * nc + c) * 8)
                        v = k.let("v", k.vload(ring.row[off], 8), type=ptxdsl.bf16x8)
                        o = k.let("o", type=ptxdsl.bf16x8)
                        with k.for_("j", 0, 8, unroll=True) as j:
                            o[j] = (k.ex2((v[j].to(f32) - mx) * LOG2E) * inv).to(bf16)
                        y[r * n + col0 + off] = o
                k.assign(it, it + 1)
                k.release(ring)
        # no CTA leaves while a peer may still st.async into it
        k.cluster_sync()

    threads = 32 * (1 + consumer_warps)
    # the parameters' annotations are ptxdsl types (values), which mypy cannot read as types
    if kind == "rmsnorm":
        def rms(k, x: ptr(bf16), w: ptr(bf16), y: ptr(bf16), rows: u32):  # type: ignore[valid-type]
            body(k, x, y, rows, w)
        return ptxdsl.kernel(rms, name=name, threads=threads, cluster=cluster,
                             nonportable=cluster > 8)

    def smax(k, x: ptr(bf16), y: ptr(bf16), rows: u32):  # type: ignore[valid-type]
        body(k, x, y, rows)
    return ptxdsl.kernel(smax, name=name, threads=threads, cluster=cluster,
                         nonportable=cluster > 8)


longrow_rmsnorm = make_longrow("rmsnorm")
longrow_softmax = make_longrow("softmax")

# example() sizes small enough for the CPU interpreter (ptxdsl interp, tests)
SMALL = {"rows": 1}


def example(rng: np.random.Generator, kernel: str = "longrow_rmsnorm", rows: int = 64,
            n: int = 65536, cluster: int = 4, consumer_warps: int = 8) -> dict:
    """Inputs, grid and float64 reference for one long-row normalisation."""
    from ptxdsl.runtime.dtypes import bf16_to_f32, f32_to_bf16

    kind = kernel.split("_")[1] if kernel.startswith("longrow_") else kernel.split("_")[0]
    x = f32_to_bf16(rng.standard_normal((rows, n)).astype(np.float32) * 2.0)
    xf = bf16_to_f32(x).astype(np.float64)
    nclusters = max(1, min(rows, 8))
    ex: dict[str, Any] = {"grid": nclusters * cluster, "inputs": {"x": x, "rows": rows},
          "outputs": {"y": np.empty((rows, n), np.uint16)}, "rtol": 2e-2, "atol": 2e-3}
    if kind == "rmsnorm":
        w = f32_to_bf16(rng.standard_normal(n).astype(np.float32))
        ex["inputs"]["w"] = w
        want = xf / np.sqrt((xf * xf).mean(axis=1, keepdims=True) + 1e-5) * bf16_to_f32(w)
    else:
        e = np.exp(xf - xf.max(axis=1, keepdims=True))
        want = e / e.sum(axis=1, keepdims=True)
        ex["atol"] = 1e-6
    ex["expected"] = {"y": want}
    return ex


FAMILY = Family(
    name="longrow",
    summary="RMSNorm and softmax over bf16 rows split across a cluster (65536 and longer), "
            "partial results exchanged with st.async; the default is the module's and "
            "longrow.ptxdsl's cluster of 4 (BENCHMARKS.md's fastest at 65536: cluster=2)",
    factory=make_longrow,
    defaults={"kind": "rmsnorm", "n": 65536, "cluster": 4, "stages": 2, "consumer_warps": 8},
    source="longrow.ptxdsl",
)
