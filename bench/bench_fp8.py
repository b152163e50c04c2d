"""fp8 GEMM benchmark: ptxdsl's e4m3 GEMMs (samples/gemm_fp8.py) against cuBLASLt through
torch._scaled_mm, side by side in one process on the same inputs, correctness checked first.

    python bench/bench_fp8.py [--small] [--sweep] [--reps N] [--out results.md]

- per-tensor: C (bf16) = sa * sb * A @ B^T, A (M x K) and B (N x K) e4m3 row-major, sa and sb
  f32 device scalars. torch._scaled_mm(A, B.t(), scale_a, scale_b, out_dtype=bf16) gets B as
  the column-major K x N operand it wants (a view of the row-major N x K tensor, no copy).
- block-scaled (DeepGEMM-style): 1 x 128 scales on A, 128 x 128 on B, promoted every K block;
  its TFLOP/s are reported next to the per-tensor kernel's (target >= 0.9x) with both errors.

Errors are against f32 references computed by torch with TF32 off: "kernel" against the
product of the dequantised fp8 inputs (the kernel's own arithmetic: fp8 products summed in the
tensor cores, bf16 output), "end to end" against the product of the f32 data before
quantisation (where block scales pay off). Times are medians of CUDA-event-timed runs, the
best of three interleaved rounds; TFLOP/s count 2 M N K. `--sweep` times several tile /
stage / cluster configurations of both kernels at every shape."""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import statistics
import sys
from pathlib import Path

import ml_dtypes  # noqa: F401  (the host dtypes of fp8 data, imported by ptxdsl on demand)
import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ptxdsl.runtime import TensorMap  # noqa: E402

SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096), (4096, 14336, 4096), (16384, 4096, 14336)]
SMALL_SHAPES = [(1024, 1024, 1024), (1000, 1528, 2048)]
E4M3 = torch.float8_e4m3fn
FP8_MAX = 448.0
# (bm, bn, stages, cluster) of the per-tensor and block-scaled kernels tried by --sweep;
# each fits the 227 KiB of shared memory (stages x (bm + bn) x 128 bytes + the bm x bn bf16
# staging tile)
SWEEP = [(128, 256, 3, 1), (128, 256, 3, 2), (128, 192, 4, 1), (128, 128, 6, 1),
         (128, 128, 6, 2), (256, 128, 3, 1)]
SWEEP_BLOCK = [(128, 128, 5, 1), (128, 128, 5, 2), (128, 128, 4, 1), (128, 64, 8, 1)]


def twin():
    spec = importlib.util.spec_from_file_location("bench_fp8_twin", ROOT / "samples" /
                                                  "gemm_fp8.py")
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


def grid_of(kdef, m: int, n: int, bm: int, bn: int, cluster: int) -> int:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if cluster > 1:  # as many clusters as can be resident at once (GPCs decide, not SMs / 2)
        from ptxdsl.runtime.occupancy import max_active_clusters

        sms = max_active_clusters(kdef.program().kernel()) * cluster
    return min(sms // cluster, -(-m // (bm * cluster)) * -(-n // bn)) * cluster


def launcher(kdef, a, b, c, s_a, s_b, *, bm: int, bn: int, cluster: int = 1):
    """A closure launching `kdef` on (a, b) into c with its tensor maps built once. Per-tensor
    kernels take s_a, s_b as 1-element f32 tensors; block-scaled ones s_a as the [K / 128][M]
    row scales and s_b as the [N / 128][K / 128] block scales."""
    m, k = a.shape
    n = b.shape[0]
    ta = TensorMap(a, box=(bm, 128), swizzle="128B")
    tb = TensorMap(b, box=(bn // cluster, 128), swizzle="128B")
    tc = TensorMap(c, box=(64, 64), swizzle="128B")
    if s_a.dim() == 2:
        s_a = TensorMap(s_a, box=(1, bm))
    launch = kdef[grid_of(kdef, m, n, bm, bn, cluster)]
    return lambda: launch(ta, tb, tc, s_a, s_b, m, n, k)


class Problem:
    """One shape's data: f32 matrices X (M x K) and W (N x K) with rows of different
    magnitudes, quantised per tensor and in blocks, and the references."""

    def __init__(self, m: int, n: int, k: int, seed: int = 0):
        g = torch.Generator(device="cuda").manual_seed(seed)
        dev = "cuda"
        rmag = torch.exp2(torch.randint(-4, 5, (m, 1), device=dev, generator=g).float())
        cmag = torch.exp2(torch.randint(-4, 5, (n, 1), device=dev, generator=g).float())
        self.x = torch.randn(m, k, device=dev, generator=g) * rmag
        self.w = torch.randn(n, k, device=dev, generator=g) * cmag
        self.m, self.n, self.k = m, n, k
        # per tensor: one scale each, amax / 448
        self.sa = (self.x.abs().amax() / FP8_MAX).reshape(1)
        self.sb = (self.w.abs().amax() / FP8_MAX).reshape(1)
        self.a8 = (self.x / self.sa).to(E4M3)
        self.b8 = (self.w / self.sb).to(E4M3)
        # blocks: 1 x 128 of X, 128 x 128 of W
        xb = self.x.reshape(m, k // 128, 128)
        sfa = (xb.abs().amax(dim=2) / FP8_MAX).clamp_min(1e-30)  # [M, K / 128]
        self.a8b = (xb / sfa[:, :, None]).to(E4M3).reshape(m, k)
        npad = -(-n // 128) * 128
        wp = torch.zeros(npad, k, device=dev)
        wp[:n] = self.w
        wb = wp.reshape(npad // 128, 128, k // 128, 128)
        self.sfb = (wb.abs().amax(dim=(1, 3)) / FP8_MAX).clamp_min(1e-30).contiguous()
        self.b8b = (wb / self.sfb[:, None, :, None]).to(E4M3).reshape(npad, k)[:n].contiguous()
        self.sfa_t = sfa.t().contiguous()  # [K / 128][M], as the kernel's tensor map reads it
        self.sfa = sfa

    def reference(self, block: bool) -> torch.Tensor:
        """The f32 product of the dequantised fp8 inputs."""
        if block:
            a = self.a8b.float() * self.sfa.repeat_interleave(128, dim=1)
            sb = self.sfb.repeat_interleave(128, dim=0)[:self.n].repeat_interleave(128, dim=1)
            b = self.b8b.float() * sb
        else:
            a, b = self.a8.float() * self.sa, self.b8.float() * self.sb
        return a @ b.T, a.norm(dim=1), b.norm(dim=1)

    def exact(self) -> torch.Tensor:
        return self.x @ self.w.T


def errors(c: torch.Tensor, p: Problem, block: bool) -> tuple[float, float, float]:
    """(max |err| / tolerance against the dequantised reference (<= 1 passes), relative
    Frobenius error against it, relative Frobenius error against X @ W^T)."""
    ref, an, bn = p.reference(block)
    # bf16 rounding of the output, plus the fp8 sums' rounding, scaled by what the dot
    # products of these rows and columns can reach
    tol = 2 ** -7 * ref.abs() + 2 ** -6 * torch.outer(an, bn) / p.k ** 0.5
    c32 = c.float()
    worst = float(((c32 - ref).abs() / tol).max())
    rel = float((c32 - ref).norm() / ref.norm())
    exact = p.exact()
    return worst, rel, float((c32 - exact).norm() / exact.norm())


def run_shape(tw, m: int, n: int, k: int, reps: int, configs: list, block_configs: list,
              rows: list) -> None:
    p = Problem(m, n, k)
    flops = 2 * m * n * k
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    cublas = lambda: torch._scaled_mm(p.a8, p.b8.t(), scale_a=p.sa, scale_b=p.sb,  # noqa: E731
                                      out_dtype=torch.bfloat16)
    ref_c = cublas()
    torch.cuda.synchronize()
    _, cub_rel, cub_e2e = errors(ref_c, p, False)
    runs = []  # (label, block, closure)
    for bm, bn, stages, cl in configs:
        kd = tw.make_gemm_fp8(bm=bm, bn=bn, stages=stages, cluster=(cl, 1, 1))
        runs.append((f"per-tensor {bm}x{bn} s{stages}{' x2' if cl > 1 else ''}", False,
                     launcher(kd, p.a8, p.b8, out, p.sa, p.sb, bm=bm, bn=bn, cluster=cl)))
    for bm, bn, stages, cl in block_configs:
        kd = tw.make_gemm_fp8(bm=bm, bn=bn, stages=stages, cluster=(cl, 1, 1), block=True)
        runs.append((f"block {bm}x{bn} s{stages}{' x2' if cl > 1 else ''}", True,
                     launcher(kd, p.a8b, p.b8b, out, p.sfa_t, p.sfb, bm=bm, bn=bn,
                              cluster=cl)))
    checked = []
    for label, block, fn in runs:  # correctness first, on a poisoned output
        out.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        worst, rel, e2e = errors(out, p, block)
        if not worst <= 1.0:
            print(f"{m}x{n}x{k} {label}: WRONG (max |err| / tol = {worst:.3g})", flush=True)
            rows.append((m, n, k, label, float("nan"), float("nan"), worst, rel, e2e))
            continue
        checked.append((label, block, fn, worst, rel, e2e))
    # interleave every kernel with cuBLASLt so that clocks and thermals treat them alike
    times = {label: [] for label, *_ in checked}
    t_cub = []
    for _ in range(3):
        for label, _, fn, *_ in checked:
            times[label].append(median_ms(fn, reps))
        t_cub.append(median_ms(cublas, reps))
    tc = min(t_cub)
    rows.append((m, n, k, "cuBLASLt _scaled_mm", flops / tc / 1e9, 1.0, 0.0, cub_rel, cub_e2e))
    print(f"{m}x{n}x{k}: cuBLASLt {flops / tc / 1e9:7.1f} TFLOP/s  (rel err {cub_rel:.2e}, "
          f"end to end {cub_e2e:.2e})", flush=True)
    best = {}  # block-scaled or not -> the fastest time
    for label, block, _, worst, rel, e2e in checked:
        t = min(times[label])
        best[block] = min(best.get(block, t), t)
        rows.append((m, n, k, label, flops / t / 1e9, tc / t, worst, rel, e2e))
        print(f"    {label:<28} {flops / t / 1e9:7.1f} TFLOP/s  x{tc / t:.3f} of cuBLASLt  "
              f"(max err/tol {worst:.2f}, rel err {rel:.2e}, end to end {e2e:.2e})", flush=True)
    if len(best) == 2:
        print(f"    block-scaled / per-tensor (fastest of each): x{best[False] / best[True]:.3f}",
              flush=True)


def table(rows: list) -> str:
    lines = ["| M x N x K | kernel | TFLOP/s | vs cuBLASLt | max err / tol | rel err | "
             "end-to-end rel err |", "|---|---|---:|---:|---:|---:|---:|"]
    for m, n, k, label, tf, ratio, worst, rel, e2e in rows:
        lines.append(f"| {m} x {n} x {k} | {label} | {tf:.1f} | {ratio:.3f} | {worst:.2f} | "
                     f"{rel:.2e} | {e2e:.2e} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="two small shapes, few repetitions")
    ap.add_argument("--sweep", action="store_true",
                    help="time several tile / stage / cluster configurations of each kernel")
    ap.add_argument("--reps", type=int, default=None, help="timed runs per median")
    ap.add_argument("--out", type=Path, help="append the results table (markdown) here")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # f32 references in f32
    tw = twin()
    shapes = SMALL_SHAPES if args.small else SHAPES
    reps = args.reps or (5 if args.small else 30)
    configs = SWEEP if args.sweep else SWEEP[:1]
    block_configs = SWEEP_BLOCK if args.sweep else SWEEP_BLOCK[:1]
    props = torch.cuda.get_device_properties(0)
    print(f"# fp8 GEMM on {props.name}, torch {torch.__version__}, numpy {np.__version__}",
          flush=True)
    rows: list = []
    for m, n, k in shapes:
        run_shape(tw, m, n, k, reps, configs, block_configs, rows)
    text = table(rows)
    print(text)
    if args.out:
        stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
        with args.out.open("a") as f:
            f.write(f"\n## fp8 GEMM, {props.name}, {stamp}\n\n{text}\n")


if __name__ == "__main__":
    main()
