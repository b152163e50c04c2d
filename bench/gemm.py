"""GEMM: ptxdsl's warp-specialised wgmma GEMM (ptxdsl/kernels/gemm.py) against cuBLAS
(torch.matmul), side by side in one process on the same inputs, correctness checked first.

    python -m bench gemm [--shape MxNxK,...] [--variants] [--quick]
    python -m bench cluster-gemm [--shape ...]     # the 2 x 1 cluster form, B multicast

C = A @ B^T with A (M x K) and B (N x K) row-major bf16, f32 accumulation, bf16 C. cuBLAS
runs torch.matmul(A, B.T) and torch.matmul(A, Bt) with Bt = B^T stored K x N; its faster
layout is the reference. Times: the best of three interleaved rounds of medians of 30
CUDA-event-timed runs. TFLOP/s count 2 M N K."""

from __future__ import annotations

import argparse
from typing import Any

from .common import (
    OP_THROUGHPUT_MIN,
    BenchError,
    Row,
    Section,
    check_close,
    gemm_error,
    interleaved_ms,
    op_over_kernel,
    tile_grid,
    twin,
)

SHAPES = ((8192, 8192, 8192), (4096, 4096, 4096), (8192, 8192, 1024), (2048, 2048, 32768),
          (4096, 4096, 512), (16384, 16384, 4096))
ABOUT = ("bf16 in, f32 accumulate, bf16 out, C = A @ B^T; ptxdsl is the faster of two "
         "of the tilings the `ptxdsl.gemm` op tunes between (128 x 256, and 128 x 224 with C "
         "stored in 32-column chunks; with --variants, the fastest of those and more), cuBLAS "
         "`torch.matmul`, the faster "
         "of its two operand layouts; best of 3 interleaved rounds of medians of 30 "
         "CUDA-event-timed runs; every kernel checked against an f32 reference first.")
ABOUT_CLUSTER = ("`make_gemm(cluster=(2, 1, 1))`: each CTA of a pair loads its own A tile and "
                 "half of the shared B tile, multicast to both; grid: the clusters "
                 "`cuOccupancyMaxActiveClusters` allows. Otherwise as the GEMM section.")
LIMITS = ("power, not issue: on the H200 a sustained GEMM holds the board at its 700 W "
          "software cap (throttle reason 0x4, 686-693 W) and the SM clock falls to ~1.43-1.53 "
          "GHz for ptxdsl and cuBLAS alike (`python -m bench.power M N K`: 3 s runs after a "
          "settling second, 2026-11-26). Work per clock, TFLOP/s per GHz: 8192^3 ptxdsl 463-464 "
          "against cuBLAS's 449-450 (1.035x sustained); 4096^3 438-439 against 431-438; 2048 x "
          "2048 x 32768 459-461 against 462-464, at clocks within 1% of each other; so at the "
          "cap a kernel gains only by drawing less power per flop. A stream-K tail "
          "(`make_gemm(streamk=True)`) does 2% more work per clock at 8192^3 (471-473) but runs "
          "55 MHz slower for it (2% slower sustained); at 4096^3 and 2048 x 2048 x 32768 its "
          "fix-up costs more than the partial wave it fills (5-10% slower). The 2 x 1 "
          "cluster's B multicast is 0-1% slower. On the H100 (Nsight Compute, `--clock-control "
          "none`) ptxdsl's kernel and cuBLAS's (nvjet, 2-CTA clusters) both keep the tensor pipe "
          "active 97-98% of cycles. Timed rows move by 3-4% from run to run. Also within noise "
          "or slower: groups of 4 or 16, registers 24/240, 256 x 128 tiles, 128 x 128 tiles.")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shape", default=",".join("x".join(map(str, s)) for s in SHAPES),
                   help="comma-separated MxNxK")
    p.add_argument("--variants", action="store_true", help="also other tile configurations")
    p.add_argument("--quick", action="store_true", help="fewer runs")


def shapes(text: str) -> list[tuple[int, int, int]]:
    out = []
    for s in text.split(","):
        dims = tuple(int(d) for d in s.lower().split("x"))
        if len(dims) != 3:
            raise BenchError(f"a shape is MxNxK, got {s!r}")
        out.append(dims)
    return out


def gemm_launcher(kdef: Any, a: Any, b: Any, c: Any, bm: int = 128, bn: int = 256,
                  cluster: int = 1, streamk: bool = False):
    """A closure launching `kdef` on (a, b) into c, with its tensor maps built once (with a
    cluster pair, each CTA loads half of a B tile and the grid is whole clusters). With
    `streamk` (make_gemm(streamk=True)) the grid is every resident CTA and the closure holds
    the workspace and the zeroed semaphores (the kernel leaves them zero)."""
    import torch

    from ptxdsl.runtime import TensorMap
    from ptxdsl.runtime.occupancy import resident_ctas, streamk_workspace
    from ptxdsl.swizzle import chunk_box

    m, k = a.shape
    n = b.shape[0]
    ta = TensorMap(a, box=(bm, 64), swizzle="128B")
    tb = TensorMap(b, box=(bn // cluster, 64), swizzle="128B")
    cbox, cswizzle = chunk_box(64, bn, 2)  # the kernel's C chunks (make_gemm)
    tc = TensorMap(c, box=cbox, swizzle=cswizzle)
    if not streamk:
        launch = kdef[tile_grid(kdef, m, n, bm, bn, cluster)]
        return lambda: launch(ta, tb, tc, m, n, k)
    grid = resident_ctas(kdef.program().kernel(), 1)
    size, nsem, slots = streamk_workspace(m, n, k, grid, bm, bn)
    ws = torch.empty(size, device=a.device, dtype=torch.float32)
    sem = torch.zeros(nsem, device=a.device, dtype=torch.uint32)
    launch = kdef[grid]

    def run() -> None:
        launch(ta, tb, tc, m, n, k, ws, sem, slots)

    run.sem = sem  # type: ignore[attr-defined]  # for tests: zero after every launch
    return run


def check(kdef: Any, m: int, n: int, k: int, bm: int = 128, bn: int = 256, seed: int = 0,
          cluster: int = 1, streamk: bool = False) -> float:
    """Run once on random data; max |err| / tolerance against an f32 reference (<= 1
    passes)."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm_launcher(kdef, a, b, c, bm, bn, cluster, streamk)()
    torch.cuda.synchronize()
    return gemm_error(c, a, b)


def checked(label: str, run: Any, c: Any, a: Any, b: Any) -> Any:
    """`run` (a launcher writing c = a @ b^T), once run on a NaN-filled c and checked against
    an f32 reference; BenchError if it is wrong."""
    import torch

    c.fill_(float("nan"))
    run()
    torch.cuda.synchronize()
    err = gemm_error(c, a, b)
    if not err <= 1.0:
        (m, k), n = a.shape, b.shape[0]
        raise BenchError(f"{label} at {m}x{n}x{k}: error {err:.2f} x the tolerance")
    return run


def configs(a: argparse.Namespace, cluster: bool
            ) -> list[tuple[str, Any, int, int, int, bool]]:
    """(label, kernel, bm, bn, cluster size, stream-K) of the kernels to time."""
    t = twin("gemm")
    if cluster:
        return [("2x1 cluster, B multicast", t.make_gemm(cluster=(2, 1, 1)), 128, 256, 2, False)]
    # the tile widths the torch op tunes between for dense shapes: 256, and 224 (its 32-column
    # C chunks; fewer idle SMs where 256-wide tiles leave a partial wave)
    out = [("128x256x64, 3 stages, groups of 8", t.gemm, 128, 256, 1, False),
           ("128x224x64, 3 stages", t.make_gemm(bn=224), 128, 224, 1, False)]
    if a.variants:
        out += [
            ("stream-K tail", t.make_gemm(streamk=True), 128, 256, 1, True),
            ("groups of 16", t.make_gemm(group=16), 128, 256, 1, False),
            ("registers 24/240", t.make_gemm(producer_regs=24, consumer_regs=240), 128, 256, 1,
             False),
            ("128x128x64, 6 stages", t.make_gemm(bn=128, stages=6), 128, 128, 1, False),
            ("256x128x64, 128 rows a consumer", t.make_gemm(bm=256, bn=128), 256, 128, 1, False),
        ]
    return out


def measure(a: argparse.Namespace, cluster: bool) -> tuple[list[Row], list[str]]:
    """The rows, and each large shape's throughput through `torch.ops.ptxdsl.gemm` as a
    fraction of the best kernel's launched directly."""
    import torch

    reps = 10 if a.quick else 30
    cmd = "python -m bench " + ("cluster-gemm" if cluster else "gemm")
    rows, through_op = [], []
    for m, n, k in shapes(a.shape):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        y = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        yt = y.T.contiguous()
        fns = {"cuBLAS A @ B.T": lambda x=x, y=y: torch.matmul(x, y.T),
               "cuBLAS A @ Bt": lambda x=x, yt=yt: torch.matmul(x, yt)}
        for label, kdef, bm, bn, cl, sk in configs(a, cluster):
            fns[label] = checked(label, gemm_launcher(kdef, x, y, c, bm, bn, cl, sk), c, x, y)
        ms = interleaved_ms(fns, reps)
        flops = 2 * m * n * k
        best_ref = min((r for r in ms if r.startswith("cuBLAS")), key=ms.__getitem__)
        best = min((r for r in ms if not r.startswith("cuBLAS")), key=ms.__getitem__)
        rows.append(Row(f"{m} x {n} x {k}", best, flops / ms[best] / 1e9, "cuBLAS",
                        flops / ms[best_ref] / 1e9, "TFLOP/s",
                        f"{cmd} --shape {m}x{n}x{k}", target=1.0 if cluster else 1.05))
        if not cluster and m * n * k >= OP_THROUGHPUT_MIN:
            import ptxdsl.torch  # noqa: F401  (registers torch.ops.ptxdsl)

            got = torch.ops.ptxdsl.gemm(x, y)
            check_close("torch.ops.ptxdsl.gemm", got, torch.matmul(x, y.T), 2**-6)
            frac = op_over_kernel(lambda x=x, y=y: torch.ops.ptxdsl.gemm(x, y), fns[best], reps)
            through_op.append(f"{m} x {n} x {k} {frac:.3f}")
    return rows, through_op


def run(a: argparse.Namespace) -> list[Section]:
    if a.cluster:
        s = Section("cluster-gemm", "GEMM on 2 x 1 clusters, B multicast", ABOUT_CLUSTER,
                    limits=LIMITS)
    else:
        s = Section("gemm", "GEMM, bf16, C = A @ B^T", ABOUT, limits=LIMITS)
    s.rows, through_op = measure(a, a.cluster)
    if through_op:
        s.notes.append("Through `torch.ops.ptxdsl.gemm` (its tuned config, calls queued 10 "
                       "deep), as a fraction of the best kernel launched directly: "
                       + "; ".join(through_op) + ".")
    return [s]
