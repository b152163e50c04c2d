"""Grouped GEMM (mixture of experts): ptxdsl/kernels/grouped_gemm against `torch._grouped_mm` and a
loop of cuBLAS calls (one `torch.matmul` per expert), side by side in one process on the same
inputs, correctness checked first. The fp8 grouped GEMM's rows are `python -m bench fp8`'s
(bench/fp8_more.py), built on this module's Fp8Experts and fp8_references.

    python -m bench grouped [--case E:TOKENS:K:N[:masked],...] [--quick]

A case is E experts of TOKENS tokens each (K -> N, bf16); `masked` runs the fixed-capacity
layout of decoding (ptxdsl's masked kernel; the references see the same tokens contiguous)."""

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


# ----------------------------------------------------------------------------- fp8

def fp8_blocks(x: Any, rows: int) -> tuple[Any, Any, Any]:
    """x (R x K, f32) in e4m3 blocks of rows x 128, each divided by its largest magnitude /
    448: (the e4m3 data, the (ceil(R / rows), ceil(K / 128)) f32 scales, the dequantised
    data)."""
    import torch

    r, k = x.shape
    rp, kp = -(-r // rows) * rows, -(-k // 128) * 128
    pad = x.new_zeros(rp, kp)
    pad[:r, :k] = x
    blocks = pad.view(rp // rows, rows, kp // 128, 128)
    scale = (blocks.abs().amax(dim=(1, 3)) / 448.0).clamp_min(1e-30)
    q = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn).view(rp, kp)[:r, :k]
    full = scale.repeat_interleave(rows, 0)[:r].repeat_interleave(128, 1)[:, :k]
    return q.contiguous(), scale.contiguous(), q.float() * full


def products(a: Any, b: Any, starts: list[int], used: list[int]) -> Any:
    """Expert g's rows starts[g] .. + used[g] of a (T x K) times b[g]^T (b: E x N x K),
    summed in float64 (whatever TF32 setting is on), as f32; zero elsewhere."""
    import torch

    out = torch.zeros(a.shape[0], b.shape[1], device=a.device)
    for g, (s0, u) in enumerate(zip(starts, used, strict=True)):
        out[s0:s0 + u] = (a[s0:s0 + u].double() @ b[g].double().T).float()
    return out


class Fp8Experts:
    """Tokens and expert weights of one fp8 grouped GEMM, block-quantised from f32 data whose
    rows' magnitudes differ per row and K block (2^-4 .. 2^4): a8 (T x K) or, `masked`, E x
    cap x K (expert g's first min(rows[g], cap) rows used, the rest data no result may
    read) with sa, b8 (E x N x K) with sb, the int32 offs (row ends, or `masked` the counts),
    and the dequantised a and b (f32, a as T x K) for references."""

    def __init__(self, rows: list[int], n: int, k: int, masked: bool = False, cap: int = 0,
                 seed: int = 0):
        import torch

        g = torch.Generator(device="cuda").manual_seed(seed)
        e, kb = len(rows), -(-k // 128)
        self.rows, self.n, self.k, self.masked = rows, n, k, masked
        self.cap = cap = (cap or max(rows)) if masked else 0
        self.starts = [i * cap for i in range(e)] if masked else \
            [sum(rows[:i]) for i in range(e)]
        self.used = [min(r, cap) for r in rows] if masked else list(rows)
        total = e * cap if masked else sum(rows)

        def data(r: int) -> Any:
            mag = torch.exp2(torch.randint(-4, 5, (r, kb), device="cuda", generator=g).float())
            x = torch.randn(r, k, device="cuda", generator=g)
            return x * mag.repeat_interleave(128, 1)[:, :k]

        self.a8, self.sa, self.a = fp8_blocks(data(max(total, 1)), 1)
        experts = [fp8_blocks(data(n), 128) for _ in range(e)]
        self.b8 = torch.stack([q for q, _, _ in experts])
        self.sb = torch.stack([s for _, s, _ in experts])
        self.b = torch.stack([d for _, _, d in experts])
        if masked:
            self.a8 = self.a8.view(e, cap, k)
            self.sa = self.sa.view(e, cap, kb)
        self.offs = torch.tensor(rows if masked else torch.tensor(rows).cumsum(0).tolist(),
                                 dtype=torch.int32, device="cuda")

    def op(self) -> Any:
        import torch

        import ptxdsl.torch  # noqa: F401  (registers torch.ops.ptxdsl)

        fn = torch.ops.ptxdsl.grouped_mm_fp8_masked if self.masked else \
            torch.ops.ptxdsl.grouped_mm_fp8
        return fn(self.a8, self.b8, self.sa, self.sb, self.offs)

    def reference(self) -> Any:
        """Each expert's rows of the dequantised product in f32 (zero elsewhere), T x N."""
        return products(self.a, self.b, self.starts, self.used)

    def owned(self) -> Any:
        """The rows some expert owns (a bool mask over T)."""
        import torch

        mask = torch.zeros(self.a.shape[0], dtype=torch.bool, device="cuda")
        for s0, u in zip(self.starts, self.used, strict=True):
            mask[s0:s0 + u] = True
        return mask

    def error(self, c: Any, ref: Any = None) -> float:
        """max |C - ref| / tolerance over the owned rows (<= 1 passes): 2^-7 |ref| for C's
        bf16 rounding, and 2^-6 ||a row|| ||b row|| / sqrt(K) for the tensor cores' fp8 sums
        (bench/fp8.py's tolerance)."""
        import torch

        ref = self.reference() if ref is None else ref
        rows = self.owned()
        an = self.a.norm(dim=1)
        bn = torch.zeros_like(ref)
        for g, (s0, u) in enumerate(zip(self.starts, self.used, strict=True)):
            bn[s0:s0 + u] = self.b[g].norm(dim=1)
        tol = 2 ** -7 * ref.abs() + 2 ** -6 * an[:, None] * bn / self.k ** 0.5
        err = (c.reshape(ref.shape).float() - ref).abs() / tol
        return float(err[rows].max()) if bool(rows.any()) else 0.0


def fp8_references(p: Fp8Experts, notes: list[str], case: str) -> tuple[str, Any] | None:
    """The strongest torch reference that runs here and is right: (name, call)."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    k = p.k
    a8 = p.a8.view(-1, k)
    ends = torch.tensor([s0 + u for s0, u in zip(p.starts, p.used, strict=True)],
                        dtype=torch.int32, device="cuda") if p.masked else p.offs
    b8t = p.b8.transpose(1, 2)  # E x K x N, K-major: what torch's fp8 GEMMs take
    ref = p.reference()
    tries = []
    if hasattr(F, "scaled_grouped_mm") and hasattr(F, "ScalingType"):
        st = F.ScalingType
        sa = p.sa.view(-1, p.sa.shape[-1])
        tries.append(("F.scaled_grouped_mm, block-wise", lambda: F.scaled_grouped_mm(
            a8, b8t, sa, st.BlockWise1x128, p.sb, st.BlockWise128x128, offs=ends,
            output_dtype=torch.bfloat16), ref))
    if hasattr(torch, "_scaled_grouped_mm"):  # row-wise scales of the dequantised data
        amax_a = p.a.abs().amax(dim=1).clamp_min(1e-30) / 448.0
        amax_b = p.b.abs().amax(dim=2).clamp_min(1e-30) / 448.0  # E x N
        ra = (p.a / amax_a[:, None]).to(torch.float8_e4m3fn)
        rb = (p.b / amax_b[:, :, None]).to(torch.float8_e4m3fn).transpose(1, 2)
        rref = products(ra.float() * amax_a[:, None],
                        rb.transpose(1, 2).float() * amax_b[:, :, None], p.starts, p.used)
        tries.append(("torch._scaled_grouped_mm, row-wise", lambda: torch._scaled_grouped_mm(
            ra, rb, amax_a, amax_b, offs=ends, out_dtype=torch.bfloat16), rref))
    a16, b16 = p.a.to(torch.bfloat16), p.b.to(torch.bfloat16)
    tries.append(("torch._grouped_mm, bf16", lambda: torch._grouped_mm(
        a16, b16.transpose(1, 2), offs=ends), ref))
    for name, fn, want in tries:
        try:
            out = fn()
            torch.cuda.synchronize()
        except (RuntimeError, AttributeError, TypeError, ValueError) as err:
            first = str(err).split("\n")[0].split(". ")[0]  # torch's sentence, not its lists
            notes.append(f"`{name}` ({case}) did not run: {first}")
            continue
        if not p.error(out, want) <= 1.0:
            notes.append(f"`{name}` ({case}) is off its reference: error "
                         f"{p.error(out, want):.2f} x the tolerance; not timed")
            continue
        return name, fn
    return None
