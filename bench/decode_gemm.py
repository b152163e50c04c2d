"""Decode GEMM: `torch.ops.ptxdsl.gemm` against cuBLAS (`torch.mm`) on the skinny products of
decoding (a few token rows times a weight), each call replayed from a CUDA graph as a serving
loop runs it, correctness checked first; and the e4m3 form of the same kernel against
`torch._scaled_mm` in each of its modes.

    python -m bench decode-gemm [--nk 4096x4096,28672x4096] [--m 1,8,16,...] [--dtype bf16,fp8]
                                [--json FILE]

C (M x N) = A (M x K) @ W^T with W (N x K) row-major bf16, f32 accumulation. A decode GEMM
reads the whole weight once and little else, so it is measured in GB/s: (M K + N K) x the
element's bytes + M N x 2 bytes (C, bf16) over the time of one call, and as a fraction of the
copy bandwidth measured in the same run (torch's device-to-device copy of COPY_BYTES).

fp8: A and W quantised to e4m3 per tensor (one f32 scale each, amax / 448) or per row (a
scale per token of A and per output channel of W); ptxdsl is `torch.ops.ptxdsl.scaled_mm_fp8`
per tensor (its e4m3 decode kernel, ptxdsl/kernels/gemm_smallm.py with dtype e4m3) and, per
row, which the op does not take, that kernel launched as the op launches it, each of its
configs timed and the best kept; the reference is
`torch._scaled_mm` in the same scale mode, with and without `use_fast_accum`, the faster
(bench/decode_gemm_fp8.py).

Times: the best of three interleaved rounds of medians of CUDA-event-timed replays of a
graph of CALLS captured calls; the same calls launched eagerly are timed too (in the JSON and
a note). `--json FILE` saves every point (what `python -m bench plots` draws: the bf16 ones;
an fp8 point has "dtype": "fp8" and its contenders named by scale mode)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .common import BenchError, Row, Section, gemm_error, interleaved_ms, save_json

# the Llama-3 projections: 8B's q/o, qkv and down, 70B's up+gate (28672 x 4096 per shard
# of two), 7168 x 8192 and 8192 x 3584 (70B's qkv and down on eight GPUs)
NK = "4096x4096,6144x4096,28672x4096,4096x14336,7168x8192,8192x3584"
MS = "1,8,16,32,64,128,256"
# the page's rows (M, N, K), five to keep the section a screenful: the smallest and largest
# weight at one token and at 64, and the largest M; every point is in the note, the JSON
# and the plot
ROWS = {(1, 4096, 4096), (64, 4096, 4096), (1, 28672, 4096), (64, 28672, 4096),
        (256, 7168, 8192)}
CALLS = 20  # calls captured in one graph: the replay's launch cost spread over them
COPY_BYTES = 1 << 30
PLOT = "docs/img/decode_gemm.png"
ABOUT = ("bf16 C = A @ W^T, W (N x K) row-major, f32 accumulation; GB/s = (M K + N K + M N) x "
         "2 bytes / the time of one call. `torch.ops.ptxdsl.gemm` (tuned on its first call of "
         "each shape, before capture) against cuBLAS `torch.mm(A, W.T)`; each captured "
         f"{CALLS} times in a CUDA graph whose replays are timed (no host launch cost), best "
         "of 3 interleaved rounds of medians of 20 replays; every output checked against an "
         "f32 reference first. % copy: GB/s over the copy bandwidth of the same run. Five "
         "rows; the plot and the note hold every point.")
LIMITS = ("Nsight Compute (one cold launch, 2026-11-28): at 64 x 4096 x 4096 (64-row weight "
          "tiles, 2 K ranges, 128 CTAs) 14.4 us, DRAM 51% of peak and the SMs active 72% of the "
          "time: the first loads' latency and the split-K tail (slots stored, the last range "
          "summing them) are not hidden; at 128 x 7168 x 8192 (112 CTAs, whole tiles) L2 is 78% "
          "busy, every CTA re-reading the activation tile (as many bytes as its weights), and 20 "
          "SMs are idle.")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nk", default=NK, help="comma-separated NxK weight shapes")
    p.add_argument("--m", default=MS, help="comma-separated token counts M")
    p.add_argument("--dtype", default="bf16,fp8", help="comma-separated: bf16, fp8 or both")
    p.add_argument("--json", help="save every point's GB/s by contender to this file")


def ints(text: str, sep: str, what: str) -> list[int]:
    try:
        return [int(x) for x in text.split(sep)]
    except ValueError:
        raise BenchError(f"{what}: expected integers separated by {sep!r}, got {text!r}") \
            from None


def weight_shapes(text: str) -> list[tuple[int, int]]:
    out = []
    for s in text.split(","):
        dims = ints(s.lower(), "x", "--nk")
        if len(dims) != 2:
            raise BenchError(f"--nk: a weight shape is NxK, got {s!r}")
        out.append((dims[0], dims[1]))
    return out


def graphed(torch: Any, call: Any) -> Any:
    """A replay of CALLS calls of `call` captured in one CUDA graph (the op tuned first)."""
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            call()
    return graph.replay


def gbps(m: int, n: int, k: int, ms: float, elem: int = 2) -> float:
    """GB/s of a call: A and W of `elem`-byte elements read, bf16 C written."""
    return ((m * k + n * k) * elem + m * n * 2) / (ms * 1e-3) / 1e9


def copy_gbps(torch: Any) -> float:
    """The device-to-device copy bandwidth (bytes read and written over time), GB/s."""
    src = torch.empty(COPY_BYTES, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    ms = interleaved_ms({"copy": lambda: dst.copy_(src)}, 20)["copy"]
    return 2 * COPY_BYTES / (ms * 1e-3) / 1e9


def run(a: argparse.Namespace) -> list[Section]:
    dtypes = a.dtype.split(",")
    if set(dtypes) - {"bf16", "fp8"}:
        raise BenchError(f"--dtype: bf16, fp8 or both (comma-separated), got {a.dtype!r}")
    shapes, ms = weight_shapes(a.nk), ints(a.m, ",", "--m")
    import torch

    import ptxdsl.torch  # noqa: F401  (registers torch.ops.ptxdsl)

    copy = copy_gbps(torch)
    sections, points = [], []
    if "bf16" in dtypes:
        sections.append(bf16_section(torch, shapes, ms, copy, points))
    if "fp8" in dtypes:
        from .decode_gemm_fp8 import fp8_section

        sections.append(fp8_section(torch, shapes, ms, copy, points))
    if a.json:
        save_json(Path(a.json), "decode-gemm", "GB/s", points)
    return sections


def bf16_section(torch: Any, shapes: list[tuple[int, int]], ms: list[int], copy: float,
                 points: list[dict]) -> Section:
    """`torch.ops.ptxdsl.gemm` against cuBLAS at every N x K and M (each point added to
    `points`)."""
    s = Section("decode-gemm", "Decode GEMM, bf16, from a CUDA graph", ABOUT, plot=PLOT,
                limits=LIMITS)
    notes, eager = [], []
    g = torch.Generator(device="cuda").manual_seed(0)
    for n, k in shapes:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g)
        per_m, per_m_eager = [], []
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
            calls = {"ptxdsl": lambda x=x, w=w: torch.ops.ptxdsl.gemm(x, w),
                     "cuBLAS": lambda x=x, w=w: torch.mm(x, w.T)}
            for name, call in calls.items():
                err = gemm_error(call(), x, w)
                if not err <= 1.0:
                    raise BenchError(f"{name} at {m}x{n}x{k}: error {err:.2f} x the tolerance")
            times = interleaved_ms({name: graphed(torch, c) for name, c in calls.items()}, 20)
            rate = {name: gbps(m, n, k, t / CALLS) for name, t in times.items()}
            direct = {name: gbps(m, n, k, t)
                      for name, t in interleaved_ms(calls, 20, warm=None).items()}
            points.append({"m": m, "n": n, "k": k, "gbps": rate, "eager_gbps": direct,
                           "copy_gbps": copy})
            per_m.append(f"M {m} {rate['ptxdsl']:.0f} / {rate['cuBLAS']:.0f} "
                         f"({rate['ptxdsl'] / copy:.0%})")
            per_m_eager.append(f"M {m} {direct['ptxdsl']:.0f} / {direct['cuBLAS']:.0f}")
            if (m, n, k) in ROWS:
                s.rows.append(Row(f"bf16 {m} x {n} x {k}",
                                  "torch.ops.ptxdsl.gemm", rate["ptxdsl"], "cuBLAS torch.mm",
                                  rate["cuBLAS"], "GB/s",
                                  f"python -m bench decode-gemm --nk {n}x{k} --m {m} "
                                  "--dtype bf16", target=1.0))
        notes.append(f"{n} x {k}: " + ", ".join(per_m))
        eager.append(f"{n} x {k}: " + ", ".join(per_m_eager))
    s.notes.append(f"Copy bandwidth in this run: {copy:.0f} GB/s. GB/s from the graph, ptxdsl "
                   "/ cuBLAS (ptxdsl's % of copy), by N x K, every M: " + "; ".join(notes)
                   + ". Eager launches, GB/s ptxdsl / cuBLAS: " + "; ".join(eager) + ".")
    return s
