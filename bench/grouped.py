"""Grouped GEMM (mixture of experts): ptxdsl/kernels/grouped_gemm against `torch._grouped_mm` and a
loop of cuBLAS calls (one `torch.matmul` per expert), side by side in one process on the same
inputs, correctness checked first.

    python -m bench grouped [--case E:TOKENS:K:N[:masked],...] [--quick]

A case is E experts of TOKENS tokens each (K -> N, bf16); `masked` runs the fixed-capacity
layout of decoding (ptxdsl's masked kernel; the references see the same tokens
contiguous)."""

from __future__ import annotations

import argparse
from typing import Any

from .common import BenchError, Row, Section, interleaved_ms, ref_error, sms, twin

CASES = "8:4096:4096:14336,64:32:4096:2048:masked"
ABOUT = ("bf16 grouped GEMM C_g = A_g @ B_g^T per expert, f32 accumulation; TFLOP/s = 2 * "
         "tokens * K * N. References: `torch._grouped_mm` (the faster of B's two layouts) and "
         "a loop of `torch.matmul` per expert (cuBLAS). Every result is checked against an f32 "
         "reference first; best of 3 interleaved rounds of medians of CUDA-event-timed runs.")
LIMITS = ("Nsight Compute (`--clock-control none`, H100, 2026-11-25): at 8 x 4096 tokens the "
          "grouped kernel keeps the tensor pipe active 96.5% of cycles at the 1.53 GHz the "
          "power cap allows, the dense GEMM's ceiling: it is 1.04x `torch._grouped_mm` on the "
          "H200 and 1.07x on the H100, within the power-capped cards' run-to-run spread of "
          "about 5%, and 1.1x needs a faster dense GEMM. Decoding (64 experts x 32 tokens) "
          "streams every expert's weights (83% of DRAM peak on the H100, tensor pipe 39%); "
          "the 4-stage form with a register epilogue is the faster there on the H200. Not "
          "tried: 2-CTA clusters multicasting B in the dense case, 64-row tiles for decoding.")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--case", default=CASES, help="comma-separated E:TOKENS:K:N[:masked]")
    p.add_argument("--quick", action="store_true", help="fewer runs")


class Grouped:
    """A launcher of the grouped GEMM on tokens `a` (T x K), weights `b` (E x N x K) into `c`
    (T x N): `rows` tokens per expert, contiguous, or each at g * cap with `masked`."""

    def __init__(self, a: Any, b: Any, c: Any, rows: list[int], masked: bool = False,
                 cap: int = 0, kdef: Any = None):
        import torch

        from ptxdsl.runtime import TensorMap

        t = twin("grouped_gemm")
        e, n, k = b.shape
        if masked:
            offs = torch.tensor(rows, dtype=torch.int32, device=a.device)
            cap = cap or max(rows)
        else:
            offs = torch.tensor([0, *torch.tensor(rows).cumsum(0).tolist()], dtype=torch.int32,
                                device=a.device)
        self.offs = offs.view(torch.uint32)
        maps = (TensorMap(a, box=(t.BM, t.BK), swizzle="128B"),
                TensorMap(b, box=(1, t.BN, t.BK), swizzle="128B"),
                TensorMap(c, box=(64, 64), swizzle="128B"))
        kdef = kdef or (t.make_grouped(masked=True) if masked else t.grouped_gemm)
        counts = [min(r, cap) for r in rows] if masked else rows
        launch = kdef[t.launch_grid(counts, n, sms())]
        args = (*maps, c, self.offs, e, cap, n, k, c.shape[0])
        self.run = lambda: launch(*args)

    def __call__(self) -> None:
        self.run()


def reference(a: Any, b: Any, starts: list[int], counts: list[int]) -> Any:
    """Each expert's rows of A @ B_g^T in f32 (zero elsewhere)."""
    import torch

    out = torch.zeros(a.shape[0], b.shape[1], device=a.device, dtype=torch.float32)
    for g, (s0, cnt) in enumerate(zip(starts, counts, strict=True)):
        out[s0:s0 + cnt] = a[s0:s0 + cnt].float() @ b[g].float().T
    return out


def error(c: Any, ref: Any, k: int, rows: Any = None) -> float:
    """`ref_error` over `rows` (all by default); <= 1 passes."""
    return ref_error(c if rows is None else c[rows], ref if rows is None else ref[rows], k)


def run(a: argparse.Namespace) -> list[Section]:
    import torch

    s = Section("grouped", "Grouped GEMM (mixture of experts)", ABOUT, limits=LIMITS)
    reps = 10 if a.quick else 30
    for case in a.case.split(","):
        parts = case.split(":")
        e, tokens, k, n = (int(x) for x in parts[:4])
        masked = parts[4:] == ["masked"]
        total = e * tokens
        x = torch.randn(total, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        wt = w.transpose(1, 2).contiguous().transpose(1, 2)  # (E, N, K) view, K outer
        ends = torch.arange(1, e + 1, device="cuda", dtype=torch.int32) * tokens
        starts = [g * tokens for g in range(e)]
        ref = reference(x, w, starts, [tokens] * e)
        t = twin("grouped_gemm")
        variants = {"grouped_gemm": None}
        if masked:  # decoding: every tile partial, so the TMA-store tile is idle
            variants["4 stages, register epilogue"] = t.make_grouped(True, 4, False)
        fns: dict[str, Any] = {}
        for vname, kdef in variants.items():
            c = torch.full((total, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            mine = Grouped(x, w, c, [tokens] * e, masked=masked, cap=tokens, kdef=kdef)
            mine()
            torch.cuda.synchronize()
            if not error(c, ref, k) <= 1.0:
                raise BenchError(f"{vname} {case}: error {error(c, ref, k):.2f} x the tolerance")
            fns[vname] = mine
        for label, bb in (("_grouped_mm", w), ("_grouped_mm, B K-major", wt)):
            try:
                out = torch._grouped_mm(x, bb.transpose(1, 2), offs=ends)
                torch.cuda.synchronize()
            except (RuntimeError, AttributeError) as err:
                s.notes.append(f"`torch.{label}` ({case}) did not run: {err}".split("\n")[0])
                continue
            if not error(out, ref, k) <= 1.0:
                raise BenchError(f"torch.{label} {case}: error {error(out, ref, k):.2f}")
            fns[label] = lambda x=x, bb=bb, ends=ends: torch._grouped_mm(
                x, bb.transpose(1, 2), offs=ends)
        outs = [torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16) for _ in range(e)]

        def loop(x=x, w=w, outs=outs, e=e, tokens=tokens) -> None:
            for g in range(e):
                torch.matmul(x[g * tokens:(g + 1) * tokens], w[g].T, out=outs[g])

        fns["cuBLAS loop"] = loop
        ms = interleaved_ms(fns, reps)
        flops = 2 * total * k * n
        label = f"{e} experts x {tokens} tokens, {k} -> {n}" + (", masked" if masked else "")
        cmd = f"python -m bench grouped --case {case}"
        grouped = [v for name, v in ms.items() if name.startswith("_grouped_mm")]
        refs = ([("torch._grouped_mm", min(grouped))] if grouped else []) + \
            [("cuBLAS loop", ms["cuBLAS loop"])]
        best = min(variants, key=ms.__getitem__)
        for ref_name, ref_ms in refs:
            s.rows.append(Row(label, best, flops / ms[best] / 1e9, ref_name,
                              flops / ref_ms / 1e9, "TFLOP/s", cmd, target=1.1))
    return [s]
