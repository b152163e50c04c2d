"""The sm_80 (cp.async) and sm_90a (TMA) builds of the same sources, side by side on one GPU.

    python -m bench sm80 [--quick]

For stream_copy, the norms and the async-copy guide kernels, both builds come from one
source and one Python call (a TensorMap argument becomes a tensor descriptor for sm_80);
each build is checked (against the reference, and the two builds against each other) before
it is timed. References in the same process: cudaMemcpy D2D (torch copy_), torch, Triton;
the guide kernels have none but their sm_90a build."""

from __future__ import annotations

import argparse
from typing import Any

from . import refs
from .common import (
    ROOT,
    SAMPLES,
    BenchError,
    Row,
    Section,
    check_close,
    check_equal,
    ctas_per_sm,
    median_ms,
    sms,
    twin,
)

ARCHS = ("sm_80", "sm_90a")
CMD = "python -m bench sm80"
ABOUT = ("The sm_80 build (cp.async spread over the issuing warp, JIT-compiled by the driver) "
         "against the strongest reference, with the sm_90a (TMA) build of the same source in "
         "the case column; GB/s = bytes read + written / median of 50 CUDA-event-timed runs; "
         "both builds checked, and against each other, first.")
LIMITS = ("stream_copy's sm_80 build has one consumer warp doing every store itself "
          "(ld.shared + st.global per 16 bytes) where the TMA build hands them to the copy "
          "engine; sm_80 has no suspending try_wait, so polling threads steal issue slots "
          "(a 256 ns nanosleep between polls is the mitigation). The norms are limited by "
          "their consumers, not the copies: both builds run level.")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="smaller sizes, fewer runs")


def run(a: argparse.Namespace) -> list[Section]:
    reps = 20 if a.quick else 50
    s = Section("sm80", "sm_80 and sm_90a builds of one source", ABOUT, limits=LIMITS)
    s.rows += copy_rows((256 if a.quick else 2048) << 20, reps)
    s.rows += norm_rows(4096 if a.quick else 16384, reps)
    s.rows += guide_rows(reps)
    return [s]


def copy_rows(total_bytes: int, reps: int) -> list[Row]:
    import torch

    import ptxdsl
    from ptxdsl.runtime import TensorMap

    mod = twin("stream_copy")
    rows = total_bytes // (2 * mod.COLS)
    src = torch.randint(-30000, 30000, (rows, mod.COLS), dtype=torch.int16,
                        device="cuda").view(torch.bfloat16)
    nbytes = 2 * src.numel() * 2
    dst = torch.empty_like(src)
    refs_ms = {"cudaMemcpy D2D (torch copy_)": median_ms(lambda: dst.copy_(src), reps)}
    tri = refs.triton_copy()
    if tri is not None:
        s16, d16 = src.view(torch.int16).view(-1), dst.view(torch.int16).view(-1)
        tri(s16, d16)
        torch.cuda.synchronize()
        check_equal("Triton copy", dst, src)
        refs_ms["Triton load/store copy"] = median_ms(lambda: tri(s16, d16), reps)
    ms = {}
    for arch in ARCHS:
        k = mod.stream_copy.program(arch).kernel()
        tm_s = TensorMap(src, box=(mod.ROWS, mod.COLS), dtype=ptxdsl.bf16)
        tm_d = TensorMap(dst, box=(mod.ROWS, mod.COLS), dtype=ptxdsl.bf16)
        launch = k[sms() * ctas_per_sm(k.info)]
        ntiles = rows // mod.ROWS
        dst.view(torch.int16).fill_(-1)
        launch(tm_s, tm_d, ntiles)
        torch.cuda.synchronize()
        check_equal(f"stream_copy ({arch})", dst, src)
        ms[arch] = median_ms(lambda la=launch, a=tm_s, b=tm_d, n=ntiles: la(a, b, n), reps)
    best_ref = min(refs_ms, key=refs_ms.__getitem__)
    return [Row(f"stream_copy {total_bytes >> 20} MiB (sm_90a build: "
                f"{nbytes / ms['sm_90a'] / 1e6:.0f} GB/s)", "sm_80 build, 4 stages of 32x256",
                nbytes / ms["sm_80"] / 1e6, best_ref, nbytes / refs_ms[best_ref] / 1e6, "GB/s",
                CMD)]


def norm_rows(rows: int, reps: int) -> list[Row]:
    import torch

    import ptxdsl
    from ptxdsl.compiler import Program

    n, eps = 8192, 1e-5
    # each kernel built alone per arch
    module = ptxdsl.parse_file(ROOT / "ptxdsl" / "kernels" / "norms.ptxdsl")
    x = (torch.randn(rows, n, device="cuda") * 2).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(n, device="cuda")).to(torch.bfloat16)
    b = (0.1 * torch.randn(n, device="cuda")).to(torch.bfloat16)
    nbytes = 2 * x.numel() * x.element_size()
    tri = refs.triton_norms()
    out = []
    for kind in ("rmsnorm", "softmax", "layernorm"):
        eager = refs.torch_norm(kind, n, w, b, eps)
        want = eager(x)
        refs_ms = {"torch eager": median_ms(lambda e=eager: e(x), reps)}
        if tri is not None:
            yt = torch.empty_like(x)
            tri(kind, x, w, b, yt, eps)
            check_close("Triton", yt, want)
            refs_ms["Triton row, 16 warps"] = median_ms(
                lambda k=kind, yt=yt: tri(k, x, w, b, yt, eps), reps)
        ms: dict[str, float] = {}
        ys: dict[str, Any] = {}
        for arch in ARCHS:
            k = Program(ptxdsl.ir.Module(kernels=(module.kernel(kind),)), arch).kernel()
            y = ys[arch] = torch.full_like(x, float("nan"))
            args = {"rmsnorm": (x, w, y, rows), "softmax": (x, y, rows),
                    "layernorm": (x, w, b, y, rows)}[kind]
            launch = k[sms() * ctas_per_sm(k.info)]
            launch(*args)
            check_close(f"{kind} ({arch})", y, want)
            ms[arch] = median_ms(lambda la=launch, a=args: la(*a), reps)
        if not torch.equal(ys["sm_80"].view(torch.int16), ys["sm_90a"].view(torch.int16)):
            raise BenchError(f"{kind}: the sm_80 and sm_90a builds disagree")
        best_ref = min(refs_ms, key=refs_ms.__getitem__)
        out.append(Row(f"{kind} bf16 {rows} x {n}, TMA-ring source (sm_90a build: "
                       f"{nbytes / ms['sm_90a'] / 1e6:.0f} GB/s)", "sm_80 build",
                       nbytes / ms["sm_80"] / 1e6, best_ref, nbytes / refs_ms[best_ref] / 1e6,
                       "GB/s", CMD))
    return out


def guide_rows(reps: int) -> list[Row]:
    import torch

    import ptxdsl

    progs = {arch: ptxdsl.compile(SAMPLES / "memcpy_async.ptxdsl", arch=arch) for arch in ARCHS}
    nctas, nbatch = sms() * 8, 64
    out = []
    for kname in ("with_memcpy_async", "with_barrier", "with_staging", "with_specialized_staging"):
        per = 128 if kname == "with_specialized_staging" else 256
        x = torch.randint(-(1 << 20), 1 << 20, (nctas * per * nbatch,), dtype=torch.int32,
                          device="cuda")
        want = x * 3 + 1
        gbs = {}
        for arch in ARCHS:
            launch = progs[arch].kernel(kname)[nctas]
            y = torch.full_like(x, -1)
            launch(x, y, nbatch)
            torch.cuda.synchronize()
            check_equal(f"{kname} ({arch})", y, want)
            gbs[arch] = 2 * x.numel() * 4 / median_ms(lambda la=launch, x=x, y=y: la(x, y, nbatch),
                                                      reps) / 1e6
        out.append(Row(f"memcpy_async.ptxdsl `{kname}`, {x.numel() * 4 >> 20} MiB",
                       "sm_80 build", gbs["sm_80"], "its sm_90a build (no outside reference)",
                       gbs["sm_90a"], "GB/s", CMD))
    return out
