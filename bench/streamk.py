"""Stream-K: the same GEMM walked three ways on shapes whose tile count leaves the last wave
partial, side by side with cuBLAS in one process on the same inputs, correctness checked
first.

    python -m bench streamk [--shape MxNxK,...] [--splits 2] [--quick]

- data-parallel: ptxdsl/kernels/gemm.ptxdsl, one 128 x 256 tile at a time per CTA;
- split-K: ptxdsl/kernels/gemm_splitk.ptxdsl with `--splits` K ranges per tile;
- stream-K: make_gemm(streamk=True), the partial wave plus one full wave shared K step by
  K step among all SMs, the other tiles whole and stored as the data-parallel walk stores
  them; a shared tile's parts meet in f32 workspace slots;
- stream-K, reduce-add: make_splitk(streamk=True), the same walk on the split-K kernel
  (shared tiles TMA-reduce-added into an M x N f32 workspace, bf16 stored from registers).
The default shapes have 133 (one wave and one tile), 397 (3 x 132 + 1) and 330 (2.5 waves)
tiles of 128 x 256 on 132 SMs."""

from __future__ import annotations

import argparse

from .common import BenchError, Row, Section, gemm_error, interleaved_ms, sms, twin
from .gemm import gemm_launcher, shapes
from .splitk import SplitK

SHAPES = "2432x1792x8192,50816x256x8192,2816x3840x4096"
ABOUT = ("bf16, C = A @ B^T, 128 x 256 tiles; the tile count leaves the last wave of a "
         "data-parallel walk partial. Every ptxdsl walk (data-parallel = gemm.ptxdsl, stream-K = "
         "`make_gemm(streamk=True)`, split-K and stream-K with reduce-add = "
         "gemm_splitk.ptxdsl's schedule) is checked against an f32 reference "
         "first; cuBLAS is `torch.matmul`, the faster of its two layouts. Best of 3 "
         "interleaved rounds of medians of CUDA-event-timed runs.")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shape", default=SHAPES, help="comma-separated MxNxK")
    p.add_argument("--splits", type=int, default=2, help="K ranges per tile of the split-K walk")
    p.add_argument("--quick", action="store_true", help="fewer runs")


def run(a: argparse.Namespace) -> list[Section]:
    import torch

    s = Section("streamk", "Stream-K GEMM on partial waves", ABOUT)
    reps = 10 if a.quick else 50
    notes: list[str] = []
    for m, n, k in shapes(a.shape):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        y = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        yt = y.T.contiguous()
        fns = {"cuBLAS A @ B.T": lambda x=x, y=y: torch.matmul(x, y.T),
               "cuBLAS A @ Bt": lambda x=x, yt=yt: torch.matmul(x, yt)}
        walks: dict = {}
        cd = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        walks["data-parallel"] = (gemm_launcher(twin("gemm").gemm, x, y, cd), cd)
        cs = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        walks["stream-K"] = (gemm_launcher(twin("gemm").make_gemm(streamk=True), x, y, cs,
                                           streamk=True), cs)
        for label, kw in ((f"split-K, {a.splits} splits", {"splits": a.splits}),
                          ("stream-K, reduce-add", {"streamk": True})):
            c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            walks[label] = (SplitK(x, y, c, **kw), c)
        for label, (fn, c) in walks.items():
            c.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            err = gemm_error(c, x, y)
            clean = fn.clean() if isinstance(fn, SplitK) else True
            if not err <= 1.0 or not clean:
                raise BenchError(f"{label} at {m}x{n}x{k}: error {err:.2f} x tol, workspace "
                                 f"clean: {clean}")
            fns[label] = fn
        ms = interleaved_ms(fns, reps)
        flops = 2 * m * n * k
        ref = min(ms["cuBLAS A @ B.T"], ms["cuBLAS A @ Bt"])
        tiles = -(-m // 128) * -(-n // 256)
        case = f"{m} x {n} x {k} ({tiles} tiles)"
        cmd = f"python -m bench streamk --shape {m}x{n}x{k}"
        s.rows.append(Row(case, "stream-K", flops / ms["stream-K"] / 1e9, "cuBLAS",
                          flops / ref / 1e9, "TFLOP/s", cmd))
        others = [w for w in walks if w != "stream-K"]
        notes.append(f"{case}: " + ", ".join(
            f"{w} {flops / ms[w] / 1e9:.0f} TFLOP/s (stream-K {ms[w] / ms['stream-K']:.2f}x)"
            for w in others))
    s.notes.append(f"The other walks on {sms()} SMs: " + "; ".join(notes) + ".")
    return [s]
