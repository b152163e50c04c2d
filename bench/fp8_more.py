"""The fp8 workload's second section: the grouped (mixture-of-experts) fp8 GEMM and fp8
attention through their torch ops, each against torch's strongest reference that runs here,
correctness checked first.

    python -m bench fp8 --shape '' [--grouped-case E:TOKENS:K:N[:masked],...]
                                   [--attention-case D:S[:causal],...]

- grouped: `torch.ops.ptxdsl.grouped_mm_fp8` (contiguous layout, the experts' token counts
  ragged about TOKENS, as a router leaves them) and `grouped_mm_fp8_masked` (decoding: E x
  TOKENS rows, each expert's count ragged in 1 .. TOKENS), DeepGEMM's block scales, against
  `F.scaled_grouped_mm` with the same block-wise recipe where torch runs it, else
  `torch._scaled_grouped_mm` row-wise, else bf16 `torch._grouped_mm` (bench/grouped.py's
  `fp8_references`, which notes why each one that did not run did not). TFLOP/s count
  2 K N a token an expert owns (a masked expert's unused rows are not work).
- attention: `torch.ops.ptxdsl.attention_fp8` on e4m3 Q, K, V with power-of-two descales
  (so that bf16 holds the dequantised values exactly) against ptxdsl's bf16 op
  `torch.ops.ptxdsl.attention` on the dequantised data, cuDNN's bf16 SDPA in the notes;
  16 heads, batch x sequence = 32768 tokens (bench/attention.py's), TFLOP/s count
  4 B H S^2 D, halved when causal."""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from typing import Any

from .attention import HEADS, TOKENS, cases
from .common import BenchError, Row, Section, interleaved_ms

GROUPED_CASES = "8:4096:7168:4096,32:512:2048:7168,32:64:7168:4096:masked"
ATTENTION_CASES = "128:8192,128:8192:causal,128:2048,128:2048:causal,64:8192"
ATTENTION_TARGET = 1.3  # at D 128, S 8192: FlashAttention 3 reports 1.2-1.5x over its bf16
ABOUT = ("e4m3 in, f32 accumulate, bf16 out, through the torch ops. Grouped (mixture of "
         "experts, DeepGEMM's block scales: 1 x 128 on the tokens, 128 x 128 on each "
         "expert's weight): `torch.ops.ptxdsl.grouped_mm_fp8` with ragged experts "
         "(contiguous) and `grouped_mm_fp8_masked` (decoding, E x capacity rows, ragged "
         "counts; the references see the same tokens contiguous) against `F.scaled_grouped_mm`"
         " block-wise where torch runs it, else `torch._scaled_grouped_mm` row-wise (another "
         "recipe, the same fp8 work), else bf16 `torch._grouped_mm`; TFLOP/s count only the "
         "rows an expert owns. Attention: `torch.ops.ptxdsl.attention_fp8` (per-tensor "
         "power-of-two descales) against ptxdsl's bf16 `torch.ops.ptxdsl.attention` on the "
         "dequantised data (exact in bf16), cuDNN's bf16 SDPA in the notes; target >= 1.3x "
         "the bf16 op at D 128, S 8192. Best of 3 interleaved rounds of medians of "
         "CUDA-event-timed intervals (grouped: of 10 calls queued back to back, as the GEMM "
         "rows; attention: of one call); every contender checked first (the errors below "
         "the table).")


LIMITS = ("fp8 attention, Nsight Compute of the kernel at 4 x 16 x 8192 x 128 (H200, "
          "2026-11-28, `--clock-control none`): 2.47 ms, about 890 TFLOP/s, 1.2x the bf16 op's "
          "744, where the op took 2.99 ms in the table's run: the rest is the op's V transpose "
          "(a torch permute copy of one-byte elements, timed alone in the notes since). In the "
          "kernel the issue slots are busy 46% of cycles, with 0.63 eligible warps of 2.25 per "
          "scheduler (three warpgroups of 168 registers, 14% occupancy): the softmax's "
          "dependency chains, as in the bf16 kernel. Next: V transposed in the kernel "
          "(FlashAttention 3's way) or by a transpose kernel at copy bandwidth. "
          "Grouped: F.scaled_grouped_mm's block-wise recipe has no sm90 kernel in torch 2.11, "
          "so the reference is row-wise "
          "scaling (a different, cheaper recipe); not profiled.")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--grouped-case", default=GROUPED_CASES,
                   help="comma-separated E:TOKENS:K:N[:masked] of the grouped fp8 GEMM "
                   "(TOKENS: the mean per expert, or masked the capacity; '' for none)")
    p.add_argument("--attention-case", default=ATTENTION_CASES,
                   help="comma-separated D:S[:causal] of fp8 attention ('' for none)")


@dataclass(frozen=True)
class GroupedCase:
    """E experts of `tokens` tokens each on average (masked: `tokens` rows an expert, the
    capacity), K -> N."""

    e: int
    tokens: int
    k: int
    n: int
    masked: bool

    @property
    def spec(self) -> str:
        return f"{self.e}:{self.tokens}:{self.k}:{self.n}" + ":masked" * self.masked

    def rows(self) -> list[int]:
        """The experts' token counts, ragged, the same on every run: contiguous, summing to
        E x TOKENS with each 1/4 .. 7/4 of the mean; masked, each in 1 .. TOKENS."""
        rng = random.Random(self.e * 1_000_003 + self.tokens)
        if self.masked:
            return [rng.randint(1, self.tokens) for _ in range(self.e)]
        weights = [rng.uniform(0.25, 1.75) for _ in range(self.e)]
        total = self.e * self.tokens
        counts = [int(total * w / sum(weights)) for w in weights]
        for g in range(total - sum(counts)):  # what the rounding down left
            counts[g % self.e] += 1
        return counts

    def label(self, rows: list[int]) -> str:
        what = f"cap {self.tokens} tokens, masked, {sum(rows)} used" if self.masked else \
            f"{sum(rows)} tokens, ragged {min(rows)} .. {max(rows)}"
        return f"grouped fp8 {self.e} experts x {what}, N {self.n}, K {self.k}"


def grouped_cases(text: str) -> list[GroupedCase]:
    out = []
    for c in text.split(",") if text.strip() else []:
        parts = c.strip().split(":")
        try:
            e, tokens, k, n = (int(x) for x in parts[:4])
        except ValueError:
            raise BenchError(f"--grouped-case: expected E:TOKENS:K:N[:masked] (integers), got "
                             f"{c!r}") from None
        if len(parts) < 4 or parts[4:] not in ([], ["masked"]):
            raise BenchError(f"--grouped-case: expected E:TOKENS:K:N[:masked], got {c!r}")
        if min(e, tokens, k, n) < 1:
            raise BenchError(f"--grouped-case: E, TOKENS, K and N must be positive, got {c!r}")
        out.append(GroupedCase(e, tokens, k, n, parts[4:] == ["masked"]))
    return out


def attention_target(d: int, s: int) -> float | None:
    """The issue's target: fp8 >= 1.3x the bf16 op at D 128, S 8192 (causal or not)."""
    return ATTENTION_TARGET if (d, s) == (128, 8192) else None


def grouped_row(case: GroupedCase, rows: list[int], ms: dict[str, float], ref: str) -> Row:
    """The case's row: the op against the reference `ref`, TFLOP/s over the owned rows."""
    op = "grouped_mm_fp8" + "_masked" * case.masked
    used = sum(min(r, case.tokens) for r in rows) if case.masked else sum(rows)
    flops = 2 * used * case.k * case.n
    return Row(case.label(rows), f"torch.ops.ptxdsl.{op}", flops / ms[op] / 1e9,
               ref, flops / ms[ref] / 1e9, "TFLOP/s",
               f"python -m bench fp8 --shape '' --attention-case '' --grouped-case {case.spec}",
               1.0)


def attention_row(d: int, s: int, causal: bool, tf: dict[str, float]) -> Row:
    """The case's row: the fp8 op against the bf16 op (`tf`: TFLOP/s by contender)."""
    spec = f"{d}:{s}{':causal' if causal else ''}"
    return Row(f"fp8 attention {TOKENS // s} x {HEADS} x {s} x {d}{', causal' * causal}",
               "torch.ops.ptxdsl.attention_fp8", tf["fp8"],
               "torch.ops.ptxdsl.attention (bf16, the dequantised data)", tf["bf16"],
               "TFLOP/s",
               f"python -m bench fp8 --shape '' --grouped-case '' --attention-case {spec}",
               attention_target(d, s))


# ----------------------------------------------------------------------------- GPU


def measure_grouped(a: argparse.Namespace, case: GroupedCase,
                    notes: list[str]) -> tuple[Row | None, str]:
    """The case's row (None where no torch reference ran) and its errors."""
    import torch

    from .grouped import Fp8Experts, fp8_references

    rows = case.rows()
    p = Fp8Experts(rows, case.n, case.k, masked=case.masked,
                   cap=case.tokens if case.masked else 0, seed=case.e + case.k + case.n)
    op = "grouped_mm_fp8" + "_masked" * case.masked
    c = p.op()
    torch.cuda.synchronize()
    ref = p.reference()
    if not p.error(c, ref) <= 1.0:
        raise BenchError(f"{op} {case.spec}: max |err| / tol = {p.error(c, ref):.3g} against "
                         "the product of the dequantised inputs")
    found = fp8_references(p, notes, case.spec)
    if found is None:
        notes.append(f"grouped fp8 {case.spec} not run: no torch reference ran")
        return None, ""
    ref_name, ref_fn = found
    fns = {op: p.op, ref_name: ref_fn}
    owned = p.owned()
    errs = {}
    for name, fn in fns.items():
        out = fn().reshape(ref.shape).float()[owned]
        errs[name] = float((out - ref[owned]).norm() / ref[owned].norm())
    # queued 10 deep, as the GEMM rows: at decoding's sizes a call alone would time the
    # host's launch more than the GPU's work
    ms = interleaved_ms(fns, 10 if a.quick else 30, batch=10)
    err = ", ".join(f"{name} {e:.2e}" for name, e in errs.items())
    return grouped_row(case, rows, ms, ref_name), f"{case.spec}: {err}"


def pow2_quantized(x: Any) -> tuple[Any, Any]:
    """`x` in e4m3 per tensor and its f32 descale, a power of two (its largest magnitude to
    at most 448), so that e4m3 x descale is exact in bf16: both ops see the same numbers."""
    import torch

    descale = torch.exp2(torch.ceil(torch.log2(x.float().abs().amax() / 448.0))).reshape(1)
    return (x.float() / descale).to(torch.float8_e4m3fn), descale


def measure_attention(a: argparse.Namespace, d: int, s: int, causal: bool
                      ) -> tuple[Row, str]:
    """The fp8 op against the bf16 op and cuDNN on the dequantised data, and the note."""
    import torch
    import torch.nn.functional as F  # noqa: N812
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ptxdsl.torch.attention_fp8 import transposed

    from .attention import check, fp8_error

    b = max(1, TOKENS // s)
    g = torch.Generator(device="cuda").manual_seed(d * s + causal)
    (q8, qd), (k8, kd), (v8, vd) = (pow2_quantized(torch.randn(
        b, HEADS, s, d, device="cuda", dtype=torch.bfloat16, generator=g)) for _ in range(3))
    q, k, v = ((x.float() * sc).to(torch.bfloat16) for x, sc in ((q8, qd), (k8, kd), (v8, vd)))

    def cudnn() -> Any:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    fns = {"fp8": lambda: torch.ops.ptxdsl.attention_fp8(q8, k8, v8, qd, kd, vd, causal),
           "bf16": lambda: torch.ops.ptxdsl.attention(q, k, v, causal), "cuDNN": cudnn,
           "V transpose": lambda: transposed(v8)}  # what the fp8 op does before its kernel
    err, ok = fp8_error(fns["fp8"](), q8, k8, v8, (qd, kd, vd), causal)
    if not ok:
        raise BenchError(f"attention_fp8 {d}:{s}{':causal' * causal}: max |error| {err:.3g} "
                         "of the output scale, past the bound of P's e4m3 rounding")
    errs = {"fp8": err, **{n: check(n, fns[n](), q, k, v, causal) for n in ("bf16", "cuDNN")}}
    ms = interleaved_ms(fns, 5 if a.quick else 20)
    flops = 4 * b * HEADS * s * s * d / (2 if causal else 1)
    tf = {name: flops / t / 1e9 for name, t in ms.items() if name != "V transpose"}
    row = attention_row(d, s, causal, tf)
    err_text = ", ".join(f"{n} {e:.1e}" for n, e in errs.items())
    vt = ms["V transpose"]
    return row, (f"{row.case}: cuDNN bf16 {tf['cuDNN']:.0f} TFLOP/s (fp8 / cuDNN "
                 f"{tf['fp8'] / tf['cuDNN']:.2f}x); the op's V transpose alone {vt * 1e3:.0f} us "
                 f"of its {ms['fp8'] * 1e3:.0f} (the kernel without it: about "
                 f"{flops / (ms['fp8'] - vt) / 1e9:.0f} TFLOP/s); max error / output scale "
                 f"{err_text}")


def chosen(a: argparse.Namespace) -> tuple[list[GroupedCase], list[tuple[int, int, bool]]]:
    """The grouped and the attention cases of the options."""
    return grouped_cases(a.grouped_case), cases(a.attention_case)


def run(a: argparse.Namespace, grouped: list[GroupedCase],
        attn: list[tuple[int, int, bool]]) -> list[Section]:
    """The section, or none without cases."""
    if not grouped and not attn:
        return []
    import ptxdsl.torch  # noqa: F401  (registers torch.ops.ptxdsl)

    s = Section("fp8", "fp8 grouped GEMM and fp8 attention", ABOUT, limits=LIMITS)
    attn_notes, grouped_errs, grouped_notes = [], [], []
    for d, seq, causal in attn:
        row, note = measure_attention(a, d, seq, causal)
        s.rows.append(row)
        attn_notes.append(note)
    for case in grouped:
        grow, err = measure_grouped(a, case, grouped_notes)
        if grow is not None:
            s.rows.append(grow)
            grouped_errs.append(err)
    if attn_notes:
        s.notes.append("Attention, against torch's math backend in f32 on the dequantised "
                       "inputs: " + "; ".join(attn_notes) + ".")
    if grouped_errs:
        s.notes.append("Grouped, relative error over the owned rows against the float64 "
                       "product of the dequantised inputs: " + "; ".join(grouped_errs) + ".")
    s.notes += grouped_notes
    return [s]
