"""Row top-8 (samples/topk.ptxdsl, a warp-level bitonic sort and merge in registers) against
torch.topk, in one process on the same inputs.

    python -m bench topk [--n 8192] [--dtype f32,bf16] [--rows 16384] [--batch 20] [--quick]

f32 and bf16 rows; every result is checked first: the values equal torch.topk's exactly and
each index points at its value (ties may pick other columns). GB/s count the bytes read plus
written; by default 20 launches run back to back per timed interval (GPU time)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .common import BenchError, Row, Section, median_ms

K = 8
SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "topk.ptxdsl"
ABOUT = ("f32 and bf16, 16384 rows of 8192, top 8 of each row with its columns, sorted "
         "largest first; ptxdsl's sample samples/topk.ptxdsl (one warp per row, a bitonic "
         "sort and merge in registers, written with `fn`) against torch.topk; every result "
         "checked first (values exact, indices pointing at them); GB/s = bytes read + "
         "written / time, 20 launches back to back per CUDA-event interval.")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n", default="8192", help="comma-separated row lengths (multiples of 256)")
    p.add_argument("--dtype", default="f32,bf16", help="comma-separated: f32, bf16")
    p.add_argument("--rows", type=int, default=16384, help="rows of each matrix")
    p.add_argument("--batch", type=int, default=20, help="launches per timed interval")
    p.add_argument("--quick", action="store_true", help="4096 rows, fewer runs")


def run(a: argparse.Namespace) -> list[Section]:
    s = Section("topk", "Row top-k", ABOUT)
    for n in map(int, a.n.split(",")):
        for dt in a.dtype.split(","):
            row = measure(4096 if a.quick else a.rows, n, dt, 20 if a.quick else 100, a.batch)
            row.command = f"python -m bench topk --n {n} --dtype {dt}" + \
                (f" --rows {a.rows}" if a.rows != 16384 and not a.quick else "") + \
                (f" --batch {a.batch}" if a.batch != 20 else "")
            s.rows.append(row)
    return [s]


def check(x: Any, values: Any, indices: Any, want: Any) -> None:
    """Raise BenchError unless `values` are torch.topk's exactly and `indices` point at them,
    no column twice."""
    import torch

    if not torch.equal(values, want.values):
        bad = int((values != want.values).sum())
        raise BenchError(f"ptxdsl topk: {bad} of {values.numel()} values differ from "
                         "torch.topk's")
    cols = indices.long()
    if not bool(((cols >= 0) & (cols < x.shape[1])).all()) or \
            not torch.equal(torch.gather(x, 1, cols), values):
        raise BenchError("ptxdsl topk: an index does not point at its value")
    if not bool((cols.sort(dim=1).values.diff(dim=1) > 0).all()):
        raise BenchError("ptxdsl topk: a row takes a column twice")


def measure(rows: int, n: int, dt: str, reps: int, batch: int) -> Row:
    import torch

    import ptxdsl

    if n % 256:
        raise BenchError(f"--n {n}: the sample reads rows in chunks of 256 columns")
    if dt not in ("f32", "bf16"):
        raise BenchError(f"--dtype {dt}: the sample takes f32 or bf16")
    x = torch.randn(rows, n, device="cuda").to(torch.bfloat16 if dt == "bf16" else torch.float32)
    values = torch.full((rows, K), float("nan"), device="cuda", dtype=x.dtype)
    indices = torch.full((rows, K), -1, dtype=torch.int32, device="cuda")
    launch = ptxdsl.compile(SAMPLE, defines={"N": n, "T": dt}).kernel()[(rows + 3) // 4]
    launch(x, values, indices, rows)
    torch.cuda.synchronize()
    check(x, values, indices, torch.topk(x, K, dim=1))
    nbytes = (x.numel() + rows * K) * x.element_size() + rows * K * 4
    ours = median_ms(lambda: launch(x, values, indices, rows), reps, batch=batch)
    ref = median_ms(lambda: torch.topk(x, K, dim=1), reps, batch=batch)
    return Row(f"top-{K} {dt} {rows} x {n}", "samples/topk.ptxdsl, one warp per row",
               nbytes / ours / 1e6, "torch.topk", nbytes / ref / 1e6, "GB/s", "")
