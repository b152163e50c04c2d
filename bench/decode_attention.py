"""Decode attention: `torch.ops.ptxdsl.decode_attention` (split-KV, GQA packed, paged or
contiguous KV cache) against the best of PyTorch SDPA's backends and FlashAttention 4, each
call replayed from a CUDA graph as a serving loop runs it, correctness checked first.

    python -m bench decode-attention [--case B,S,CACHE,PAGE,H,KVH,D ...] [--json FILE]

A case is B sequences of S new tokens each against a KV cache of CACHE keys a sequence
(every sequence full: the lengths are CACHE), pages of PAGE keys (0: a contiguous cache), H
query heads over KVH KV heads, head dim D, bf16, causal among the new tokens. Decoding reads
the whole cache once, so it is measured in GB/s of the cache: B x CACHE x KVH x D x 2 (K and
V) x 2 bytes over the time of one call, and as a fraction of the copy bandwidth measured in
the same run (torch's device-to-device copy). The references: SDPA (cuDNN, flash and
memory-efficient backends, each where it takes the case; on a contiguous (B, KVH, CACHE, D)
copy of the cache, GQA through enable_gqa, the causal mask aligned to the end) and FA4
(`flash_attn.cute.flash_attn_varlen_func` with `seqused_k`, and `page_table` for the paged
rows; ../shared/anchors/ says how the GPU machine gets it); the row's reference is the
fastest. `--json FILE` saves every case."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .common import BenchError, Row, Section, interleaved_ms, save_json
from .decode_gemm import copy_gbps, graphed

# the rows (B, S, CACHE, PAGE, H, KVH, D): its five contiguous shapes, the paged
# forms at 64 x 4096 and one long sequence, GQA 64/8 and head dim 64
CASES = ("64,1,4096,0,32,8,128", "8,1,32768,0,32,8,128", "1,1,131072,0,32,8,128",
         "128,1,1024,0,32,8,128", "16,16,8192,0,32,8,128", "64,1,4096,16,32,8,128",
         "64,1,4096,64,32,8,128", "64,1,4096,256,32,8,128", "1,1,131072,256,32,8,128",
         "64,1,4096,0,64,8,128", "64,1,4096,0,32,8,64")
ABOUT = ("bf16 decode attention, causal among the new tokens, every sequence's cache full; GB/s "
         "= the cache's K and V bytes / the time of one call. `torch.ops.ptxdsl.decode_attention` "
         "against the fastest of SDPA's cuDNN, flash and memory-efficient backends (on a "
         "contiguous copy of the cache, GQA by enable_gqa) and FlashAttention 4 "
         "(`flash_attn_varlen_func`, `page_table` on the paged rows) where it imports; each "
         "captured in a CUDA graph whose replays are timed, best of 3 interleaved rounds of "
         "medians; every output checked against torch's math in f32 first. % copy: GB/s over "
         "the copy bandwidth of the same run.")
LIMITS = ("Nsight Compute (2026-11-28, 64 x 4096 contiguous, GQA 32/8, D 128): ptxdsl's kernel "
          "245 us at 91.3% of DRAM peak (4.39 TB/s), cuDNN's 242 us at 92.5% (its grid: a CTA "
          "per sequence and KV head, 128 threads, 86 KB of shared memory, two CTAs an SM); both "
          "stream the cache at the memory's limit, and the 1-2% left is DRAM efficiency (ptxdsl: "
          "one CTA an SM, 96 KB of blocks in flight; deeper rings measured slower). One sequence "
          "of 128k keys: 16 splits a KV head, the split merge reads only the real rows' partials. "
          "Pages of 16 keys: a 128-key block takes 8 TMA copies of 2 KB for K and 8 for V from one "
          "producer thread; copies that small do not keep the memory busy (a cp.async gather "
          "across the producer warp's lanes is the known fix, not built).")
CALLS = 20  # as decode_gemm's graphs


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--case", action="append",
                   help="B,S,CACHE,PAGE,H,KVH,D (PAGE 0: contiguous); repeatable; default: "
                        "the page's rows")
    p.add_argument("--json", help="save every case's GB/s by contender to this file")


def parse_case(text: str) -> tuple[int, ...]:
    try:
        case = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise BenchError(f"--case: B,S,CACHE,PAGE,H,KVH,D as integers, got {text!r}") from None
    if len(case) != 7:
        raise BenchError(f"--case: seven integers B,S,CACHE,PAGE,H,KVH,D, got {text!r}")
    b, s, cache, page, h, kvh, d = case
    if page and cache % page:
        raise BenchError(f"--case {text}: CACHE ({cache}) must be whole pages of {page}")
    if min(b, s, cache, h, kvh) < 1 or h % kvh:
        raise BenchError(f"--case {text}: B, S, CACHE, H, KVH at least 1, KVH dividing H")
    return case


def label(case: tuple[int, ...]) -> str:
    b, s, cache, page, h, kvh, d = case
    where = f"pages of {page}" if page else "contiguous"
    return f"{b} x {s} tok, cache {cache}, {where}, GQA {h}/{kvh}, D {d}"


def fa4_varlen() -> Any:
    """FlashAttention 4's `flash_attn_varlen_func`, or None where it does not import."""
    try:
        from flash_attn.cute import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func


def inputs(torch: Any, case: tuple[int, ...]) -> dict[str, Any]:
    """Random q and cache (paged: pages in shuffled order), full lengths."""
    b, s, cache, page, h, kvh, d = case
    g = torch.Generator(device="cuda").manual_seed(sum(case))

    def rand(*shape: int) -> Any:
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)

    q = rand(b, s, h, d)
    lens = torch.full((b,), cache, device="cuda", dtype=torch.int32)
    if not page:
        k, v = rand(b, cache, kvh, d), rand(b, cache, kvh, d)
        return {"q": q, "k": k, "v": v, "lens": lens, "table": None, "kc": k, "vc": v}
    per = cache // page
    k, v = rand(b * per, page, kvh, d), rand(b * per, page, kvh, d)
    table = torch.randperm(b * per, device="cuda", generator=g).reshape(b, per).to(torch.int32)
    gather = table.long()
    kc, vc = (x[gather].reshape(b, cache, kvh, d) for x in (k, v))  # the same keys, in order
    return {"q": q, "k": k, "v": v, "lens": lens, "table": table, "kc": kc, "vc": vc}


def contenders(torch: Any, case: tuple[int, ...], x: dict[str, Any]
               ) -> tuple[dict[str, Any], dict[str, str]]:
    """{name: call} and the names of the references; a reference that refuses the case is
    left out (its reason in the second dict's value, prefixed 'not run: ')."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, s, cache, page, h, kvh, d = case
    q, lens, table = x["q"], x["lens"], x["table"]
    calls: dict[str, Any] = {
        "ptxdsl": lambda: torch.ops.ptxdsl.decode_attention(q, x["k"], x["v"], lens, table)}
    about: dict[str, str] = {}
    qt = q.transpose(1, 2)
    kt, vt = (c.transpose(1, 2) for c in (x["kc"], x["vc"]))
    mask = None
    if s > 1:
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(s, cache)
    for name, backend in (("cuDNN", SDPBackend.CUDNN_ATTENTION),
                          ("SDPA flash", SDPBackend.FLASH_ATTENTION),
                          ("SDPA efficient", SDPBackend.EFFICIENT_ATTENTION)):
        def sdpa(backend: Any = backend) -> Any:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask,
                                                      enable_gqa=True).transpose(1, 2)
        try:
            sdpa()
        except Exception as e:  # noqa: BLE001 (a backend that refuses the case is a note)
            about[name] = f"not run: {str(e).splitlines()[0][:80]}"
            continue
        calls[name], about[name] = sdpa, f"{name} SDPA" if name == "cuDNN" else name
    fa4 = fa4_varlen()
    if fa4 is None:
        about["FA4"] = "not run: flash_attn.cute does not import"
    else:
        def fa4_run() -> Any:
            out = fa4(q, x["k"], x["v"], seqused_k=lens, page_table=table, causal=True)
            return out[0] if isinstance(out, tuple) else out
        try:
            fa4_run()  # the first call of a configuration compiles it
            calls["FA4"], about["FA4"] = fa4_run, "FlashAttention 4" + (" paged" if page else "")
        except Exception as e:  # noqa: BLE001 (any failure of a reference is a note)
            about["FA4"] = f"not run: {type(e).__name__}: {str(e).splitlines()[0][:80]}"
    return calls, about


def measure(torch: Any, case: tuple[int, ...], copy: float) -> tuple[Row, str, dict]:
    from ptxdsl.torch.decode import reference

    b, s, cache, page, h, kvh, d = case
    x = inputs(torch, case)
    calls, about = contenders(torch, case, x)
    ref = reference(x["q"][:2], x["kc"][:2], x["vc"][:2], x["lens"][:2])
    for name, call in list(calls.items()):
        got = call()[:2].float()
        err = float((got - ref).abs().max() / ref.abs().max())
        if not err < 2 ** -6 or not torch.isfinite(got).all():
            if name == "ptxdsl":
                raise BenchError(f"ptxdsl at {label(case)}: max |error| {err:.3g} of the "
                                 "output scale")
            about[name] = f"not run: wrong output (max |error| {err:.2g} of the scale)"
            del calls[name]
    timed: dict[str, Any] = {}
    for name, call in calls.items():
        try:
            timed[name] = graphed(torch, call)
        except RuntimeError as e:  # a reference that cannot be captured is timed eagerly
            about[name] = about.get(name, name) + f" (eager: {str(e).splitlines()[0][:60]})"
            timed[name] = lambda call=call: [call() for _ in range(CALLS)]
    ms = interleaved_ms(timed, 20)
    kv_bytes = b * cache * kvh * d * 2 * 2
    rate = {name: kv_bytes / (t / CALLS * 1e-3) / 1e9 for name, t in ms.items()}
    refs = [n for n in rate if n != "ptxdsl"]
    cmd = f"python -m bench decode-attention --case {','.join(map(str, case))}"
    if refs:
        best = max(refs, key=rate.__getitem__)
        row = Row(label(case), "torch.ops.ptxdsl.decode_attention", rate["ptxdsl"],
                  about[best], rate[best], "GB/s", cmd, target=1.0)
    else:
        row = Row(label(case), "torch.ops.ptxdsl.decode_attention", rate["ptxdsl"],
                  "target: 90% of copy", 0.9 * copy, "GB/s", cmd, target=1.0)
    note = f"{label(case)}: " + ", ".join(
        f"{n} {rate[n]:.0f} ({rate[n] / copy:.0%})" for n in rate) + "".join(
        f"; {n} {why}" for n, why in about.items() if why.startswith("not run"))
    return row, note, {"case": list(case), "gbps": rate, "copy_gbps": copy}


def run(a: argparse.Namespace) -> list[Section]:
    import torch

    import ptxdsl.torch  # noqa: F401  (registers torch.ops.ptxdsl)

    s = Section("decode-attention", "Decode attention, bf16, split-KV, from a CUDA graph", ABOUT,
                limits=LIMITS)
    copy = copy_gbps(torch)
    notes, points = [], []
    for text in a.case or CASES:
        row, note, point = measure(torch, parse_case(text), copy)
        s.rows.append(row)
        notes.append(note)
        points.append(point)
    s.notes.append(f"Copy bandwidth in this run: {copy:.0f} GB/s. GB/s of every contender (% "
                   "of copy): " + "; ".join(notes) + ".")
    if a.json:
        save_json(Path(a.json), "decode-attention", "GB/s", points)
    return [s]
