"""Split-K GEMM benchmark: ptxdsl's split-K GEMM with TMA reductions (samples/gemm_splitk.py,
both modes) against cuBLAS (torch.matmul) on skinny-output, long-K shapes, side by side in one
process on the same inputs, correctness checked first.

    python samples/bench_splitk.py [--quick] [--splits 8,16] [--out results.md]

C = A @ B^T with A (M x K) and B (N x K) row-major bf16, f32 accumulation, bf16 C. Times are
medians of CUDA-event-timed runs, the best of three interleaved rounds, two ways: one launch
between the events (what a lone call costs, host launch included) and batches of launches
back to back (the GPU time per launch with the host hidden); cuBLAS also runs A @ Bt with
Bt = B^T stored K x N, and its faster layout is reported. TFLOP/s count 2 M N K.
The workspace and semaphores are allocated once and left at zero by every launch, so a run
is one kernel launch."""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from ptxdsl.runtime import TensorMap  # noqa: E402

SHAPES = [(512, 512, 65536), (1024, 1024, 32768), (256, 4096, 16384)]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_splitk_{name}", HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


twin = _load("gemm_splitk")
median_ms = _load("bench_gemm").median_ms


class SplitK:
    """A launcher of the split-K kernel (or the variant `kdef`) on (a, b) into c, with its
    workspace, semaphores and tensor maps made once."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
                 splits: int | None = None, ordered: bool = False, kdef=None):
        m, k = a.shape
        n = b.shape[0]
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        self.splits = splits or twin.pick_splits(m, n, k, sms)
        twin.check_splits(k, self.splits)
        self.ws = torch.zeros(m, n, device=a.device, dtype=torch.float32)
        self.sem = torch.zeros(2 * twin.tiles(m, n), device=a.device, dtype=torch.uint32)
        box = {"swizzle": "128B"}
        maps = (TensorMap(a, box=(twin.BM, twin.BK), **box),
                TensorMap(b, box=(twin.BN, twin.BK), **box),
                TensorMap(self.ws, box=(64, twin.PART), **box))
        launch = (kdef or twin.gemm_splitk)[twin.tiles(m, n) * self.splits]
        args = (*maps, self.ws, c, self.sem, m, n, k, self.splits, int(ordered))
        self.run = lambda: launch(*args)

    def __call__(self) -> None:
        self.run()

    def clean(self) -> bool:
        """Whether the workspace and the semaphores are back at zero."""
        return not self.ws.any() and not self.sem.view(torch.int32).any()


def back_to_back_us(fn, reps: int, batch: int = 20) -> float:
    """The median time per launch of `batch` launches issued back to back (CUDA events around
    the batch): the GPU time of one launch with the host's launch cost hidden behind the
    queue, as in a model that launches one kernel after another."""
    return median_ms(lambda: [fn() for _ in range(batch)], reps, warmup=1) * 1e3 / batch


def error(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> float:
    """max |err| / tolerance against an f32 reference (<= 1 passes: rtol 2^-7 for the bf16
    rounding of C, atol for values near zero)."""
    ref = a.float() @ b.float().T
    tol = 2 ** -7 * ref.abs() + 1e-3 * a.shape[1] ** 0.5
    return float(((c.float() - ref).abs() / tol).max())


def bench(shapes, reps: int, split_options: list[int | None], kdef=None) -> list[tuple]:
    """Each shape with the default split count; the first shape also with `split_options`."""
    rows = []
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        flops = 2 * m * n * k
        bt = b.T.contiguous()  # cuBLAS's other layout (K x N): keep whichever it runs faster
        nt = lambda a=a, b=b: torch.matmul(a, b.T)  # noqa: E731
        nn = lambda a=a, bt=bt: torch.matmul(a, bt)  # noqa: E731
        for splits in (split_options if (m, n, k) == shapes[0] else [None]):
            for ordered in (False, True):
                c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                mine = SplitK(a, b, c, splits, ordered, kdef)
                mine()
                torch.cuda.synchronize()
                err = error(c, a, b)
                assert err <= 1.0, f"{m}x{n}x{k} splits {mine.splits}: error {err:.2f} x tol"
                assert mine.clean(), "workspace or semaphores not left at zero"
                t_ptx, t_cub, b_ptx, b_cub = [], [], [], []
                for _ in range(3):  # interleaved so clocks and thermals treat them alike
                    t_ptx.append(median_ms(mine, reps))
                    t_cub.append(min(median_ms(nt, reps), median_ms(nn, reps)))
                    b_ptx.append(back_to_back_us(mine, reps))
                    b_cub.append(min(back_to_back_us(nt, reps), back_to_back_us(nn, reps)))
                tp, tc = min(t_ptx) * 1e3, min(t_cub) * 1e3  # microseconds
                bp, bc = min(b_ptx), min(b_cub)
                mode = "deterministic" if ordered else "unordered"
                rows.append((m, n, k, mine.splits, mode, tp, tc, bp, bc, flops))
                print(f"{m}x{n}x{k} splits {mine.splits:2d} {mode:13s}: one launch ptxdsl "
                      f"{flops / tp / 1e6:6.1f} TFLOP/s ({tp:6.1f} us) cuBLAS "
                      f"{flops / tc / 1e6:6.1f} ({tc:6.1f} us) ratio {tc / tp:.3f}; back to "
                      f"back ptxdsl {flops / bp / 1e6:6.1f} ({bp:6.1f} us) cuBLAS "
                      f"{flops / bc / 1e6:6.1f} ({bc:6.1f} us) ratio {bc / bp:.3f}  "
                      f"(err {err:.2f} x tol)", flush=True)
    return rows


def driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, check=False).stdout
        return out.strip().splitlines()[0]
    except (OSError, IndexError):
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--splits", default="0", help="comma-separated split counts (0: as many "
                    "as fill the GPU once, the default)")
    ap.add_argument("--variant", default="", help="stages,chunks of make_splitk (default: the "
                    "sample's kernel)")
    ap.add_argument("--out")
    args = ap.parse_args()
    kdef = twin.make_splitk(*map(int, args.variant.split(","))) if args.variant else None
    reps = 20 if args.quick else 100
    options: list[int | None] = [int(s) or None for s in args.splits.split(",") if s] or [None]
    lines = [f"## Split-K GEMM with TMA reduce-add (bf16, C = A @ B^T), {datetime.date.today()}, "
             f"{torch.cuda.get_device_name(0)}, driver {driver()}", "",
             f"kernel {(kdef or twin.gemm_splitk).ir.name}", "",
             "| M x N x K | splits | mode | one launch: ptxdsl TFLOP/s (us) | cuBLAS | ratio "
             "| back to back: ptxdsl TFLOP/s (us) | cuBLAS | ratio |",
             "|---|---|---|---|---|---|---|---|---|"]
    for m, n, k, s, mode, tp, tc, bp, bc, flops in bench(SHAPES, reps, options, kdef):
        f = flops / 1e6  # TFLOP/s from microseconds
        lines.append(f"| {m} x {n} x {k} | {s} | {mode} | {f / tp:.1f} ({tp:.1f}) | "
                     f"{f / tc:.1f} ({tc:.1f}) | {tc / tp:.3f} | {f / bp:.1f} ({bp:.1f}) | "
                     f"{f / bc:.1f} ({bc:.1f}) | {bc / bp:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
