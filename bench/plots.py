"""The results page's plots, drawn with matplotlib from the JSON that the workloads' `--json`
option saves (the same runs' numbers, not new ones):

    python -m bench plots [--attention FILE ...] [--decode-gemm FILE] [-o DIR]

- attention.png: forward TFLOP/s over the sequence length, one panel per head dim and mask,
  ptxdsl against FlashAttention 4 and cuDNN (and torch's FlashAttention 2 backend), from
  `python -m bench attention --seqlens ... --json FILE` (several files are merged: a sweep
  may run one head dim per process);
- decode_gemm.png: GB/s over M, one panel per weight shape, `torch.ops.ptxdsl.gemm` against
  cuBLAS, from `python -m bench decode-gemm --json FILE`.

matplotlib is the `bench` extra (`pip install -e ".[bench]"`); nothing else imports it."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .common import ROOT, BenchError

RESULTS = ROOT / "bench" / "results"
IMAGES = ROOT / "docs" / "img"
# contender key in the JSON -> legend label, in drawing order (absent ones are left out)
ATTENTION_LINES = {"ptxdsl": "ptxdsl", "FA4": "FlashAttention 4", "cuDNN": "cuDNN (SDPA)",
                   "flash": "FlashAttention 2 (SDPA)"}
DECODE_LINES = {"ptxdsl": "torch.ops.ptxdsl.gemm", "cuBLAS": "cuBLAS (torch.mm)"}


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--attention", nargs="+", type=Path,
                   default=[RESULTS / "attention.json"], help="attention sweep results")
    p.add_argument("--decode-gemm", type=Path, default=RESULTS / "decode_gemm.json",
                   help="decode GEMM results")
    p.add_argument("-o", "--out-dir", type=Path, default=IMAGES,
                   help="where the PNGs go (docs/img/, which BENCHMARKS.md shows)")


def load(path: Path, workload: str) -> dict[str, Any]:
    """A results file of `workload`, checked for the fields the plots read."""
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise BenchError(f"{path}: cannot read it ({e.strerror}); run `python -m bench "
                         f"{workload} --json {path}` first") from None
    except ValueError as e:
        raise BenchError(f"{path}: not JSON ({e})") from None
    if not isinstance(data, dict) or data.get("workload") != workload:
        raise BenchError(f"{path}: not the results of `python -m bench {workload} --json`")
    if not isinstance(data.get("points"), list) or not data["points"]:
        raise BenchError(f"{path}: no points")
    return data


def pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise BenchError("the plots need matplotlib: pip install -e \".[bench]\"") from None
    matplotlib.use("Agg")  # files only: no display on a GPU machine
    import matplotlib.pyplot as plt

    return plt


def source_line(runs: Iterable[dict[str, Any]]) -> str:
    seen = sorted({f"{r.get('gpu', '?')}, {r.get('date', '?')}" for r in runs})
    return "; ".join(seen)


def panel(ax: Any, points: list[dict[str, Any]], lines: dict[str, str], x: str, metric: str,
          xlabel: str, ylabel: str) -> None:
    """A line per contender in `lines` measured at `points` (sorted by `x`): point[metric][key]
    over point[x] on a log2 axis ticked at the points, from 0 up."""
    for key, label in lines.items():
        xy = [(p[x], p[metric][key]) for p in points if key in p[metric]]
        if xy:
            ax.plot(*zip(*xy, strict=True), marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks([p[x] for p in points], [str(p[x]) for p in points])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    if points:
        ax.legend(fontsize=8)


def draw_attention(runs: list[dict[str, Any]], out: Path) -> Path:
    """TFLOP/s over S, a panel per (D, causal), a line per contender measured."""
    plt = pyplot()
    points = [p for r in runs for p in r["points"]]
    panels = sorted({(p["d"], p["causal"]) for p in points})
    dims = sorted({d for d, _ in panels})
    fig, axes = plt.subplots(len(dims), 2, figsize=(11, 3.6 * len(dims)), squeeze=False)
    for row, d in enumerate(dims):
        for col, causal in enumerate((False, True)):
            ax = axes[row][col]
            mine = sorted((p for p in points if (p["d"], p["causal"]) == (d, causal)),
                          key=lambda p: p["s"])
            panel(ax, mine, ATTENTION_LINES, "s", "tflops", "sequence length", "TFLOP/s")
            ax.set_title(f"head dim {d}, {'causal' if causal else 'not causal'}")
    fig.suptitle(f"Attention forward, bf16, 16 heads, 32768 tokens ({source_line(runs)})")
    fig.tight_layout()
    return save(plt, fig, out / "attention.png")


def draw_decode(run: dict[str, Any], out: Path) -> Path:
    """GB/s over M, a panel per weight shape N x K, a line per contender."""
    plt = pyplot()
    points = run["points"]
    shapes = sorted({(p["n"], p["k"]) for p in points})
    cols = min(3, len(shapes))  # the six Llama-3 shapes in two rows of three
    rows = -(-len(shapes) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 3.8 * rows), squeeze=False)
    for ax in axes.flat[len(shapes):]:
        ax.remove()
    for ax, (n, k) in zip(axes.flat, shapes, strict=False):
        mine = sorted((p for p in points if (p["n"], p["k"]) == (n, k)), key=lambda p: p["m"])
        panel(ax, mine, DECODE_LINES, "m", "gbps", "M (tokens)", "GB/s")
        ax.set_title(f"N x K = {n} x {k}")
    fig.suptitle(f"Decode GEMM, bf16, from a CUDA graph ({source_line([run])})")
    fig.tight_layout()
    return save(plt, fig, out / "decode_gemm.png")


def save(plt: Any, fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(a: argparse.Namespace) -> int:
    """Draw every plot whose results exist; an error if none do."""
    drawn, missing = [], []
    attention = [p for p in a.attention if p.exists()]
    missing += [p for p in a.attention if not p.exists()]
    if attention:
        drawn.append(draw_attention([load(p, "attention") for p in attention], a.out_dir))
    if a.decode_gemm.exists():
        drawn.append(draw_decode(load(a.decode_gemm, "decode-gemm"), a.out_dir))
    else:
        missing.append(a.decode_gemm)
    if not drawn:
        raise BenchError("no results to draw: " + ", ".join(map(str, missing)) + " missing")
    for path in drawn:
        print(f"wrote {path}")
    for path in missing:
        print(f"skipped: {path} does not exist")
    return 0
