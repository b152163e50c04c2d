"""GEMM benchmark: ptxdsl's warp-specialised wgmma GEMM against cuBLAS (torch.matmul), side by
side in one process on the same inputs, correctness checked first.

    python samples/bench_gemm.py [--quick] [--variants] [--out results.md]

C = A @ B^T with A (M x K) and B (N x K) row-major bf16, f32 accumulation, bf16 C; cuBLAS runs
torch.matmul(A, B.T) (the same product, which it computes with a transposed-operand GEMM).
Times are medians of CUDA-event-timed runs, the best of three rounds each; cuBLAS also runs
A @ Bt with Bt = B^T stored K x N, and its faster layout is reported. TFLOP/s count 2 M N K."""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from ptxdsl.runtime import TensorMap  # noqa: E402

SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096), (2048, 2048, 32768), (4096, 4096, 512)]


def _twin():
    spec = importlib.util.spec_from_file_location("bench_gemm_twin", HERE / "gemm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def median_ms(fn, reps: int, warmup: int = 10) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def gemm_launcher(kdef, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, bm: int = 128,
                  bn: int = 256, cluster: int = 1):
    """A closure launching `kdef` on (a, b) into c, with its tensor maps built once (with a
    cluster pair, each CTA loads half of a B tile and the grid is whole clusters)."""
    m, k = a.shape
    n = b.shape[0]
    ta = TensorMap(a, box=(bm, 64), swizzle="128B")
    tb = TensorMap(b, box=(bn // cluster, 64), swizzle="128B")
    tc = TensorMap(c, box=(64, 64), swizzle="128B")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if cluster > 1:  # as many clusters as can be resident at once (GPCs decide, not SMs / 2)
        from ptxdsl.runtime.occupancy import max_active_clusters

        sms = max_active_clusters(kdef.program().kernel()) * cluster
    grid = min(sms // cluster, -(-m // (bm * cluster)) * -(-n // bn)) * cluster
    launch = kdef[grid]
    return lambda: launch(ta, tb, tc, m, n, k)


def check(kdef, m: int, n: int, k: int, bm: int = 128, bn: int = 256, seed: int = 0,
          cluster: int = 1) -> float:
    """Run once on random data; return max |err| / tolerance against an f32 reference
    (<= 1 passes: rtol 2^-7 for the bf16 output rounding, atol for values near zero)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm_launcher(kdef, a, b, c, bm, bn, cluster)()
    torch.cuda.synchronize()
    ref = a.float() @ b.float().T
    tol = 2 ** -7 * ref.abs() + 1e-3 * k ** 0.5
    return float(((c.float() - ref).abs() / tol).max())


def bench(kdef, shapes, reps: int, bm: int = 128, bn: int = 256, cluster: int = 1) -> list[tuple]:
    rows = []
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        mine = gemm_launcher(kdef, a, b, c, bm, bn, cluster)
        mine()
        torch.cuda.synchronize()
        ref = torch.matmul(a, b.T)
        err = float((c.float() - ref.float()).abs().max() / ref.float().abs().max())
        flops = 2 * m * n * k
        # interleave the two so clocks and thermals treat them alike
        t_ptx, t_cub = [], []
        bt = b.T.contiguous()  # cuBLAS's other layout (K x N): keep whichever it runs faster
        nt = lambda a=a, b=b: torch.matmul(a, b.T)  # noqa: E731
        nn = lambda a=a, bt=bt: torch.matmul(a, bt)  # noqa: E731
        for _ in range(3):
            t_ptx.append(median_ms(mine, reps))
            t_cub.append(median_ms(nt, reps))
        t_cub.append(median_ms(nn, reps))
        tp, tc = min(t_ptx), min(t_cub)
        rows.append((m, n, k, flops / tp / 1e9, flops / tc / 1e9, tc / tp, err))
        print(f"{m}x{n}x{k}: ptxdsl {flops / tp / 1e9:7.1f} TFLOP/s  cuBLAS "
              f"{flops / tc / 1e9:7.1f} TFLOP/s  ratio {tc / tp:.3f}  (max rel diff {err:.2e})",
              flush=True)
    return rows


def compile_times(reps: int = 30) -> str:
    """.ptxdsl -> PTX of the GEMM in this process: first call, then the median of `reps`,
    and the median of each phase."""
    import ptxdsl
    from ptxdsl.codegen.ptx import emit_module
    from ptxdsl.lower import lower
    from ptxdsl.verify import verify_module

    src = (HERE / "gemm.ptxdsl").read_text()
    phases: dict[str, list[float]] = {"parse": [], "lower": [], "verify": [], "emit": []}
    totals = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        m = ptxdsl.parse(src, "gemm.ptxdsl")
        t1 = time.perf_counter()
        low = lower(m, checks=False)
        t2 = time.perf_counter()
        verify_module(low)
        t3 = time.perf_counter()
        emit_module(low)
        t4 = time.perf_counter()
        for k, a, b in (("parse", t0, t1), ("lower", t1, t2), ("verify", t2, t3),
                        ("emit", t3, t4)):
            phases[k].append(1e3 * (b - a))
        totals.append(1e3 * (t4 - t0))
    parts = ", ".join(f"{k} {statistics.median(v[1:]):.1f}" for k, v in phases.items())
    return (f"compile gemm.ptxdsl -> PTX: first {totals[0]:.1f} ms, median "
            f"{statistics.median(totals[1:]):.1f} ms, min {min(totals[1:]):.1f} ms ({parts})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--variants", action="store_true", help="also time other tile configs")
    ap.add_argument("--cluster", action="store_true",
                    help="also time the 2 x 1 cluster that multicasts B")
    ap.add_argument("--out")
    args = ap.parse_args()
    twin = _twin()
    reps = 10 if args.quick else 30
    print(compile_times(), flush=True)
    lines = [f"## GEMM (bf16, C = A @ B^T), {datetime.date.today()}, "
             f"{torch.cuda.get_device_name(0)}", "",
             "| config | M x N x K | ptxdsl TFLOP/s | cuBLAS TFLOP/s | ratio |",
             "|---|---|---|---|---|"]
    configs = [("128x256x64 s3 g8", twin.gemm, 128, 256, 1)]
    if args.cluster:
        configs.append(("128x256x64 s3 g8, 2x1 cluster, B multicast",
                        twin.make_gemm(cluster=(2, 1, 1)), 128, 256, 2))
    if args.variants:
        configs += [
            ("128x256x64 s3 g16", twin.make_gemm(group=16), 128, 256, 1),
            ("128x256x64 s3 r24/240", twin.make_gemm(producer_regs=24, consumer_regs=240),
             128, 256, 1),
            ("128x128x64 s6", twin.make_gemm(bn=128, stages=6), 128, 128, 1),
            ("256x128x64 s3 (128 rows per consumer)", twin.make_gemm(bm=256, bn=128), 256, 128,
             1),
        ]
    for label, kdef, bm, bn, cl in configs:
        print(f"# {label}", flush=True)
        for m, n, k, tp, tc, ratio, _ in bench(kdef, SHAPES, reps, bm, bn, cl):
            lines.append(f"| {label} | {m} x {n} x {k} | {tp:.1f} | {tc:.1f} | {ratio:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
