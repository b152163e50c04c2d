"""Long-row norms on a thread-block cluster (ptxdsl/kernels/longrow.py) against torch and Triton,
side by side in one process on the GPU.

    python -m bench longrow [--kind rmsnorm,softmax] [--n 65536,262144] [--sweep] [--quick]

Shapes: bf16 16384 x 65536 and 4096 x 262144 (2 GiB each way). Every kernel is checked
against torch in float32 on 256 rows before it is timed; times are medians of CUDA-event-
timed runs; GB/s count bytes read plus written. By default the configuration that won the
last sweep for each shape, on two grids; `--sweep` tries every cluster size, stage count,
warp count and grid."""

from __future__ import annotations

import argparse
from typing import Any

from . import refs
from .common import Row, Section, check_close, median_ms, sms

ROWS_OF = {65536: 16384, 262144: 4096}
# (cluster, stages, consumer warps) per width: the last sweep's winners, and the sweep
BEST = {("rmsnorm", 65536): [(2, 2, 8)], ("rmsnorm", 262144): [(16, 3, 8)],
        ("softmax", 65536): [(2, 2, 8)], ("softmax", 262144): [(8, 2, 8)]}
SWEEP_CLUSTERS = {65536: (2, 4, 8), 262144: (8, 16)}
SWEEP_FORMS = ((2, 4), (2, 8), (3, 8))

ABOUT = ("bf16 16384 x 65536 and 4096 x 262144 (2 GiB each way), a row split across the CTAs "
         "of a cluster exchanging partial results with `st_async`; GB/s = bytes read + written "
         "/ median of 20 CUDA-event-timed runs; checked against torch in f32 on 256 rows "
         "first. References: torch, Triton row kernels (whole row in registers, or two passes "
         "over 8192/16384-wide blocks); cudaMemcpy D2D as the ceiling (target 0.9x).")
LIMITS = ("softmax at 262144: a row needs 8 CTAs of one SM each (2 x 64 KiB stages, 168 "
          "registers), and only 15 clusters of 8 fit at once (120 of 132 SMs); each CTA runs "
          "three shared-memory passes with two ex2 an element. Next: one ex2 per element, and "
          "overlapping row r's exchange with row r + 1's reduction.")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kind", default="rmsnorm,softmax", help="comma-separated kernels")
    p.add_argument("--n", default="65536,262144", help="comma-separated row widths")
    p.add_argument("--sweep", action="store_true", help="every cluster / stage / warp / grid")
    p.add_argument("--quick", action="store_true", help="fewer runs")


def run(a: argparse.Namespace) -> list[Section]:
    s = Section("longrow", "Long-row norms on a cluster", ABOUT, limits=LIMITS)
    for kind in a.kind.split(","):
        for n in map(int, a.n.split(",")):
            s.rows += measure(kind, ROWS_OF[n], n, a)
    return [s]


def measure(kind: str, rows: int, n: int, a: argparse.Namespace) -> list[Row]:
    """ptxdsl's best against the strongest reference, and against the copy ceiling."""
    import torch

    from ptxdsl.runtime.occupancy import max_active_clusters

    reps = 5 if a.quick else 20
    from ptxdsl.kernels import longrow as mod
    x = (torch.randn(rows, n, device="cuda") * 2).to(torch.bfloat16)
    w = torch.randn(n, device="cuda").to(torch.bfloat16)
    y = torch.empty_like(x)
    nbytes = 2 * x.numel() * 2
    xf = x[:256].float()
    want = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5) * w.float() \
        if kind == "rmsnorm" else torch.softmax(xf, -1)

    def checked(label: str, fn: Any) -> float:
        y.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        check_close(label, y[:256], want)
        return median_ms(fn, reps)

    memcpy = median_ms(lambda: y.copy_(x), reps)
    refs_ms = {"torch " + ("F.rms_norm" if kind == "rmsnorm" else "softmax"): median_ms(
        (lambda: torch.nn.functional.rms_norm(x, (n,), w, 1e-5)) if kind == "rmsnorm" else
        (lambda: torch.softmax(x, -1)), reps)}
    tri = refs.triton_longrow()
    if tri is not None:
        configs = ([(n, True, 32)] if n <= 65536 else []) + [(8192, False, 16),
                                                              (16384, False, 32)]
        for block, one, warps in configs:
            refs_ms[f"Triton block {block}, {warps} warps"] = checked(
                "Triton", lambda b=block, o=one, nw=warps: tri(kind, x, w, y, b, o, nw))
    ours: dict[str, float] = {}
    forms = [(c, st, wp) for c in SWEEP_CLUSTERS[n] for st, wp in SWEEP_FORMS] if a.sweep \
        else BEST[(kind, n)]
    for c, stages, warps in forms:
        try:
            k = mod.make_longrow(kind, n=n, cluster=c, stages=stages,
                                 consumer_warps=warps).program().kernel()
        except Exception as e:  # a variant that does not fit (shared memory, registers)
            if not a.sweep:
                raise
            print(f"cluster {c}, {stages} stages, {warps} warps: {str(e).splitlines()[0]}")
            continue
        fit = max_active_clusters(k)
        grids = {max(1, sms() * m // c) for m in ((1, 2, 4) if a.sweep else (2,))} | {fit}
        args = (x, w, y, rows) if kind == "rmsnorm" else (x, y, rows)
        for g in sorted(grids):
            label = (f"cluster {c}, {stages} stages, {warps} consumer warps, {g} clusters"
                     f"{' (all resident)' if g == fit else ''}")
            ours[label] = checked(label, lambda k=k, g=g * c, a=args: k[g](*a))
    best_ref = min(refs_ms, key=refs_ms.__getitem__)
    best = min(ours, key=ours.__getitem__)
    cmd = f"python -m bench longrow --kind {kind} --n {n}"
    case = f"{kind} bf16 {rows} x {n}"
    gbs = nbytes / ours[best] / 1e6
    return [Row(case, best, gbs, best_ref, nbytes / refs_ms[best_ref] / 1e6, "GB/s", cmd,
                target=1.0),
            Row(f"{case}, against the copy ceiling", best, gbs, "cudaMemcpy D2D",
                nbytes / memcpy / 1e6, "GB/s", cmd, target=0.9)]
