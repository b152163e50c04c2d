"""Attention forward + backward (training): `torch.ops.ptxdsl.attention` and its backward
(ptxdsl's kernels, ptxdsl/torch/attention_bwd.py) against FlashAttention 4 and cuDNN SDPA,
side by side in one process on the same inputs, gradients checked first.

    python -m bench attention-backward [--case D:S[:causal],...] [--quick]

bf16 Q, K, V and dO stored (B, S, H, D), B x H = 4 x 16 at every length, viewed as
(B, H, S, D) for ptxdsl and SDPA (FlashAttention 4 takes them as stored). A step is the
forward and torch.autograd.grad of (dQ, dK, dV) given dO; TFLOP/s count 3.5 forwards (the
backward as 2.5), a forward 4 B H S^2 D, halved when causal. `--quick`: fewer runs, and
without --case two rows (D 64 and 128 at S 8192, causal)."""

from __future__ import annotations

import argparse
from typing import Any

from .attention import cases
from .common import BenchError, Row, Section, interleaved_ms

BATCH, HEADS = 4, 16
CASES = ",".join(f"{d}:{s}{c}" for d in (64, 128) for s in (2048, 8192, 16384)
                 for c in ("", ":causal"))
QUICK = "64:8192:causal,128:8192:causal"
TOL = 2 ** -5  # of a gradient's largest magnitude (the backward kernels' GPU test bound)
ABOUT = ("Forward + backward, bf16 in and out (f32 softmax, accumulation and dQ), B x H = 4 "
         "x 16 at every length (S 16384 holds about 2 GB of tensors: memory is no bound on "
         "the H200), tensors stored (B, S, H, D) and viewed as (B, H, S, D), the softmax "
         "scale 1/sqrt(D). A step: the forward and `torch.autograd.grad` of dQ, dK, dV given "
         "a random dO; TFLOP/s count 3.5 forwards of 4 B H S^2 D (halved when causal). "
         "ptxdsl: `torch.ops.ptxdsl.attention` (which keeps O and the log-sum-exp) and its "
         "backward kernels. The references: FlashAttention 4 (`flash_attn.cute."
         "flash_attn_func`, CuTe DSL, sm90 forward and backward) where it imports, and torch "
         "`scaled_dot_product_attention` with the cuDNN backend; the row's reference is the "
         "faster. Every contender's output and gradients are checked first against autograd "
         "through the math backend in f32 on the first batch entry's first heads. Best of 3 "
         "interleaved rounds of medians of CUDA-event-timed steps; the deterministic backward "
         "(under `torch.use_deterministic_algorithms(True)`) is timed in the same rounds, in "
         "the notes.")
LIMITS = ("Not profiled yet (2026-11-28). The deterministic backward: 0.38-0.40x the default "
          "while every dQ tile took its reduce-adds in key-block order (causal key block n "
          "starts its walk at its diagonal, so each tile waited for block 0's walk); 0.72-0.73x "
          "since the adds go in the order they arrive (from the last key block reaching a tile "
          "down to block 0, key blocks launched last-first), against a 0.9x target: each tile's "
          "adds still wait in turn on a semaphore. FlashAttention 4 is not installed on the GPU "
          "machine, so cuDNN is every row's reference.")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--case", help=f"comma-separated D:S[:causal] (default {CASES})")
    p.add_argument("--quick", action="store_true",
                   help=f"fewer runs, and without --case two rows ({QUICK})")


def fa4() -> tuple[Any, str]:
    """FlashAttention 4's `flash_attn_func` and "", or None and why it does not import."""
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as e:  # noqa: BLE001 (ImportError, or a CUDA/CuTe version mismatch)
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
    return flash_attn_func, ""


def checked_heads(s: int) -> int:
    """Heads of the first batch entry checked against the f32 math backend: its autograd
    holds a few S x S f32 matrices a head (about 5 GB at S 16384 for one head)."""
    return max(1, min(HEADS, 2 ** 28 // (s * s)))


def reference(torch: Any, q: Any, k: Any, v: Any, do: Any, causal: bool) -> tuple[Any, ...]:
    """(O, dQ, dK, dV) in f32 by autograd through the math backend, (B, S, H, D) in and out."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.MATH):
        o = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in leaves),
                                           is_causal=causal).transpose(1, 2)
    return (o.detach(), *torch.autograd.grad(o, leaves, do.float()))


def errors(torch: Any, got: tuple[Any, ...], want: tuple[Any, ...]) -> float:
    """The largest error of O, dQ, dK, dV, each relative to its reference's largest
    magnitude (inf where any value is not finite)."""
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        g = g.detach()
        if not torch.isfinite(g).all():
            return float("inf")
        worst = max(worst, float((g.float() - w).abs().max() / w.abs().max()))
    return worst


def contenders(torch: Any, q: Any, k: Any, v: Any, do: Any, causal: bool
               ) -> tuple[dict[str, Any], dict[str, str]]:
    """{name: step() -> (O, dQ, dK, dV)} on the (B, S, H, D) leaves, and each reference's
    label (or why it did not run: 'not run: ...')."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def grads(o: Any, grad: Any) -> tuple[Any, ...]:
        return (o, *torch.autograd.grad(o, (q, k, v), grad))

    def ptxdsl() -> tuple[Any, ...]:
        o = torch.ops.ptxdsl.attention(*(t.transpose(1, 2) for t in (q, k, v)), causal)
        return grads(o.transpose(1, 2), do)

    def deterministic() -> tuple[Any, ...]:
        was = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            return ptxdsl()
        finally:
            torch.use_deterministic_algorithms(was)

    def cudnn() -> tuple[Any, ...]:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)),
                                               is_causal=causal)
        return grads(o.transpose(1, 2), do)

    steps = {"ptxdsl": ptxdsl, "ptxdsl deterministic": deterministic, "cuDNN": cudnn}
    about = {"cuDNN": "cuDNN SDPA"}
    fwd, why = fa4()
    if fwd is None:
        about["FA4"] = f"not run: flash_attn.cute does not import ({why})"
    else:
        def fa4_step() -> tuple[Any, ...]:
            out = fwd(q, k, v, causal=causal)
            return grads(out[0] if isinstance(out, tuple) else out, do)

        steps["FA4"], about["FA4"] = fa4_step, "FlashAttention 4"
    return steps, about


def measure(a: argparse.Namespace, d: int, s: int, causal: bool) -> tuple[Row, str]:
    import torch

    g = torch.Generator(device="cuda").manual_seed(7 * d + s + causal)
    q, k, v, do = (torch.randn(BATCH, s, HEADS, d, device="cuda", dtype=torch.bfloat16,
                               generator=g) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()
    steps, about = contenders(torch, q, k, v, do, causal)
    hc = checked_heads(s)
    want = reference(torch, *(t[:1, :, :hc] for t in (q, k, v, do)), causal)
    errs: dict[str, float] = {}
    for name, step in list(steps.items()):
        try:
            got = step()  # FA4's first call of a configuration compiles it
        except Exception as e:  # noqa: BLE001 (a reference that fails is a note)
            if name.startswith("ptxdsl"):
                raise
            about[name] = f"not run: {type(e).__name__}: {str(e).splitlines()[0][:80]}"
            del steps[name]
            continue
        errs[name] = errors(torch, [t[:1, :, :hc] for t in got], want)
        if not errs[name] < TOL:
            if name.startswith("ptxdsl"):
                raise BenchError(f"{name} at D {d}, S {s}: max |error| {errs[name]:.3g} of the "
                                 "largest magnitude against the math backend")
            about[name] = f"not run: wrong gradients (max |error| {errs[name]:.2g})"
            del steps[name]
        del got
    ms = interleaved_ms(steps, 3 if a.quick else 10)
    flops = 3.5 * 4 * BATCH * HEADS * s * s * d / (2 if causal else 1)
    tf = {name: flops / t / 1e9 for name, t in ms.items()}
    case = f"D {d}, S {s}{', causal' if causal else ''}"
    cmd = f"python -m bench attention-backward --case {d}:{s}{':causal' if causal else ''}"
    refs = [n for n in ("FA4", "cuDNN") if n in tf]
    if not refs:
        raise BenchError(f"{case}: no reference ran ({'; '.join(about.values())})")
    ref = max(refs, key=tf.__getitem__)
    row = Row(case, "torch.ops.ptxdsl.attention + backward", tf["ptxdsl"], about[ref], tf[ref],
              "TFLOP/s", cmd, 1.05)
    det = tf["ptxdsl deterministic"]
    note = (f"{case}: " + ", ".join(f"{n} {tf[n]:.0f}" for n in tf) + f" TFLOP/s (the "
            f"deterministic backward {det / tf['ptxdsl']:.2f}x the default); max error / "
            "largest magnitude against the math backend " +
            ", ".join(f"{n} {e:.1e}" for n, e in errs.items()) +
            "".join(f"; {n} {why}" for n, why in about.items() if why.startswith("not run")))
    return row, note


def run(a: argparse.Namespace) -> list[Section]:
    import torch

    import ptxdsl.torch  # noqa: F401  (registers torch.ops.ptxdsl)

    if not torch.cuda.is_available():
        raise BenchError("attention-backward needs a CUDA GPU")
    s = Section("attention-backward", "Attention forward + backward, bf16 (training)", ABOUT,
                limits=LIMITS)
    notes = []
    for d, seq, causal in cases(a.case or (QUICK if a.quick else CASES)):
        row, note = measure(a, d, seq, causal)
        s.rows.append(row)
        notes.append(note)
    s.notes.append("Per case, every contender and the errors: " + "; ".join(notes) + ".")
    return [s]
