"""Benchmark the long-row cluster norms (samples/longrow.py) against torch, Triton and
memcpy bandwidth, side by side in one process on the GPU.

    python samples/bench_longrow.py [--quick] [--out results.md]

Shapes: bf16 16384 x 65536 and 4096 x 262144 (2 GiB each way). Every kernel is checked
against torch in float32 before it is timed; times are medians of CUDA-event-timed runs;
bandwidth counts bytes read plus written (x and y; the weights are negligible)."""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench import _twin, median_ms  # noqa: E402  (samples/bench.py: the shared harness)

import ptxdsl  # noqa: E402, F401
from ptxdsl.runtime.occupancy import max_active_clusters  # noqa: E402

SMS = torch.cuda.get_device_properties(0).multi_processor_count


# ----------------------------------------------------------------------------- Triton


@triton.jit
def _rms_row(x_ptr, w_ptr, y_ptr, n, eps, BLOCK: tl.constexpr, ONE_PASS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_ptr += row * n
    y_ptr += row * n
    if ONE_PASS:  # the whole row in registers (Liger's layout for n <= 65536)
        cols = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + cols).to(tl.float32)
        inv = tl.rsqrt(tl.sum(x * x, axis=0) / n + eps)
        w = tl.load(w_ptr + cols).to(tl.float32)
        tl.store(y_ptr + cols, (x * inv * w).to(tl.bfloat16))
    else:
        acc = tl.zeros([BLOCK], tl.float32)
        for off in range(0, n, BLOCK):
            x = tl.load(x_ptr + off + tl.arange(0, BLOCK)).to(tl.float32)
            acc += x * x
        inv = tl.rsqrt(tl.sum(acc, axis=0) / n + eps)
        for off in range(0, n, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + cols).to(tl.float32)
            w = tl.load(w_ptr + cols).to(tl.float32)
            tl.store(y_ptr + cols, (x * inv * w).to(tl.bfloat16))


@triton.jit
def _softmax_row(x_ptr, y_ptr, n, BLOCK: tl.constexpr, ONE_PASS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_ptr += row * n
    y_ptr += row * n
    if ONE_PASS:
        cols = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + cols).to(tl.float32)
        e = tl.exp(x - tl.max(x, axis=0))
        tl.store(y_ptr + cols, (e / tl.sum(e, axis=0)).to(tl.bfloat16))
    else:  # online softmax: one pass for (max, sum), one to write
        m = tl.full([BLOCK], -float("inf"), tl.float32)
        s = tl.zeros([BLOCK], tl.float32)
        for off in range(0, n, BLOCK):
            x = tl.load(x_ptr + off + tl.arange(0, BLOCK)).to(tl.float32)
            nm = tl.maximum(m, x)
            s = s * tl.exp(m - nm) + tl.exp(x - nm)
            m = nm
        big = tl.max(m, axis=0)
        total = tl.sum(s * tl.exp(m - big), axis=0)
        for off in range(0, n, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + cols).to(tl.float32)
            tl.store(y_ptr + cols, (tl.exp(x - big) / total).to(tl.bfloat16))


def triton_variants(kind: str, x, w, y, n: int):
    rows = x.shape[0]
    configs = [(n, True, 32)] if n <= 65536 else []
    configs += [(8192, False, 16), (16384, False, 32)]
    for block, one, warps in configs:
        if kind == "rmsnorm":
            yield (f"block {block}, {warps} warps",
                   lambda b=block, o=one, nw=warps: _rms_row[(rows,)](x, w, y, n, 1e-5, BLOCK=b,
                                                                      ONE_PASS=o, num_warps=nw))
        else:
            yield (f"block {block}, {warps} warps",
                   lambda b=block, o=one, nw=warps: _softmax_row[(rows,)](x, y, n, BLOCK=b,
                                                                          ONE_PASS=o,
                                                                          num_warps=nw))


# ----------------------------------------------------------------------------- bench


def reference(kind: str, x, w):
    xf = x.float()
    if kind == "rmsnorm":
        return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5) * w.float()
    return torch.softmax(xf, -1)


def rel_err(got, want) -> float:
    return float((got.float() - want).norm() / want.norm())


def bench_shape(kind: str, rows: int, n: int, clusters: list[int], reps: int, quick: bool):
    mod = _twin("longrow")
    x = (torch.randn(rows, n, device="cuda") * 2).to(torch.bfloat16)
    w = torch.randn(n, device="cuda").to(torch.bfloat16)
    y = torch.empty_like(x)
    nbytes = 2 * x.numel() * 2
    want = reference(kind, x[:256], w)
    lines = []

    def record(label, fn, check=True):
        y.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        err = rel_err(y[:256], want) if check else 0.0
        if check and not err < 2e-2:
            lines.append((label, float("nan"), float("nan"), err))
            return
        ms = median_ms(fn, reps)
        lines.append((label, ms, nbytes / ms / 1e6, err))

    record("cudaMemcpy D2D (torch copy_)", lambda: y.copy_(x), check=False)
    if kind == "rmsnorm":
        record("torch F.rms_norm", lambda: y.copy_(torch.nn.functional.rms_norm(x, (n,), w, 1e-5)))
        lines[-1] = (lines[-1][0] + " (incl. a copy_)",) + lines[-1][1:]
        ref_only = lambda: torch.nn.functional.rms_norm(x, (n,), w, 1e-5)  # noqa: E731
    else:
        ref_only = lambda: torch.softmax(x, -1)  # noqa: E731
        record("torch softmax (incl. a copy_)", lambda: y.copy_(torch.softmax(x, -1)))
    torch_ms = median_ms(ref_only, reps)
    lines.append((f"torch {'F.rms_norm' if kind == 'rmsnorm' else 'softmax'} alone", torch_ms,
                  nbytes / torch_ms / 1e6, float("nan")))
    for label, fn in triton_variants(kind, x, w, y, n):
        record(f"Triton {label}", fn)
    for c in clusters:
        for stages, warps in ((2, 4), (2, 8), (3, 8)) if not quick else ((2, 8),):
            try:
                kd = mod.make_longrow(kind, n=n, cluster=c, stages=stages, consumer_warps=warps)
                k = kd.program().kernel()
            except Exception as e:  # a variant that does not fit (shared memory, registers)
                why = str(e).splitlines()[0].split("error: ")[-1]
                lines.append((f"ptxdsl cluster {c}, {stages} stages, {warps} warps: {why}",
                              float("nan"), float("nan"), float("nan")))
                continue
            try:  # the persistent grid: as many clusters as fit at once
                resident = max_active_clusters(k)
            except Exception:
                resident = 0
            grids = {max(1, SMS * m // c) for m in ((1, 2, 4) if not quick else (2,))}
            grids |= {g for g in (resident, 2 * resident) if g > 0}
            for nclusters in sorted(grids):
                args = (x, w, y, rows) if kind == "rmsnorm" else (x, y, rows)
                tag = " (all resident)" if nclusters == resident else ""
                record(f"ptxdsl cluster {c}, {stages} stages, {warps} consumer warps, "
                       f"{nclusters} clusters{tag}", lambda k=k, g=nclusters * c, a=args: k[g](*a))
    return lines


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    reps = 5 if a.quick else 20
    dev = torch.cuda.get_device_name()
    out = [f"## Long-row norms on a cluster ({dev}, {datetime.date.today()})", "",
           "bytes read + written / median time; rel err vs torch float32 on 256 rows", ""]
    for kind in ("rmsnorm", "softmax"):
        for rows, n, clusters in ((16384, 65536, [2, 4, 8]), (4096, 262144, [8, 16])):
            lines = bench_shape(kind, rows, n, clusters, reps, a.quick)
            memcpy = lines[0][2]
            best_ref = max((ln[2] for ln in lines[1:] if not ln[0].startswith("ptxdsl")
                            and ln[2] == ln[2]), default=float("nan"))
            ours = [ln for ln in lines if ln[0].startswith("ptxdsl") and ln[2] == ln[2]]
            best = max(ours, key=lambda ln: ln[2]) if ours else None
            out += [f"### {kind} bf16 {rows} x {n}", "",
                    "| kernel | median ms | GB/s | vs memcpy | rel err |", "|---|---|---|---|---|"]
            for label, ms, gbs, err in lines:
                out.append(f"| {label} | {ms:.3f} | {gbs:.0f} | {gbs / memcpy:.3f} | {err:.1e} |")
            if best is not None:
                out += ["", f"best ptxdsl: {best[0]}: {best[2]:.0f} GB/s = {best[2] / memcpy:.3f}x "
                        f"memcpy, {best[2] / best_ref:.3f}x the best reference ({best_ref:.0f} "
                        "GB/s)", ""]
            print("\n".join(out[-len(lines) - 6 :]), flush=True)
    text = "\n".join(out) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
