"""Benchmark ptxdsl kernels against their references in one process on the GPU.

    python samples/bench.py [--quick] [--out results.md]

Every kernel is checked against its reference on the same random inputs before it is timed;
times are medians of many CUDA-event-timed runs; bandwidth counts bytes read plus written.
References: cudaMemcpy device-to-device (torch's copy_), torch, and Triton kernels written
here (one row per program)."""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import ptxdsl  # noqa: E402
from ptxdsl.runtime import TensorMap, launch_overhead_us  # noqa: E402


def _twin(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def median_ms(fn, reps: int, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def ctas_per_sm(info) -> int:
    by_smem = 233472 // (info.smem_bytes + 1024)  # the driver reserves 1 KiB per CTA
    by_threads = 2048 // (info.threads[0] * info.threads[1] * info.threads[2])
    return max(1, min(by_smem, by_threads, 32))


SMS = torch.cuda.get_device_properties(0).multi_processor_count


# ----------------------------------------------------------------------------- copy


def bench_copy(total_bytes: int, reps: int) -> list[tuple]:
    mod = _twin("stream_copy")
    rows = total_bytes // (2 * mod.COLS)
    src = torch.randint(-30000, 30000, (rows, mod.COLS), dtype=torch.int16, device="cuda") \
        .view(torch.bfloat16)
    nbytes = 2 * src.numel() * 2
    ref_dst = torch.empty_like(src)
    memcpy_ms = median_ms(lambda: ref_dst.copy_(src), reps)
    out = [("cudaMemcpy D2D (torch copy_)", total_bytes, memcpy_ms, nbytes / memcpy_ms / 1e6,
            1.0)]
    for stages, box_rows, l2 in ((4, 32, "128B"), (4, 32, "256B"), (4, 32, "none"),
                                 (3, 64, "256B"), (3, 128, "256B"), (8, 16, "256B")):
        kd = mod.make_stream_copy(stages, box_rows)
        k = kd.program().kernel()
        dst = torch.full_like(src, float("nan"))
        tm_src = TensorMap(src, box=(box_rows, mod.COLS), dtype=ptxdsl.bf16, l2_promotion=l2)
        tm_dst = TensorMap(dst, box=(box_rows, mod.COLS), dtype=ptxdsl.bf16, l2_promotion=l2)
        grid = SMS * ctas_per_sm(k.info)
        ntiles = rows // box_rows
        launch = k[grid]
        launch(tm_src, tm_dst, ntiles)
        torch.cuda.synchronize()
        if not torch.equal(dst.view(torch.int16), src.view(torch.int16)):
            raise SystemExit(f"stream_copy with {stages} stages gave a wrong result")
        ms = median_ms(lambda: launch(tm_src, tm_dst, ntiles), reps)  # noqa: B023 (called at once)
        out.append((f"ptxdsl stream_copy, {stages} stages of {box_rows}x256, L2 promotion {l2}, "
                    f"grid {grid}",
                    total_bytes, ms,
                    nbytes / ms / 1e6, memcpy_ms / ms))
        del dst
    for stages, chunk in ((4, 16384), (3, 32768), (2, 65536)):
        kd = make_bulk_copy(stages, chunk)
        k = kd.program().kernel()
        dst = torch.full_like(src, float("nan"))
        grid = SMS * ctas_per_sm(k.info)
        n = src.numel() * 2 // chunk
        launch = k[grid]
        launch(src.view(torch.uint8).view(-1), dst.view(torch.uint8).view(-1), n)
        torch.cuda.synchronize()
        if not torch.equal(dst.view(torch.int16), src.view(torch.int16)):
            raise SystemExit(f"bulk_copy with {stages} stages gave a wrong result")
        s8, d8 = src.view(torch.uint8).view(-1), dst.view(torch.uint8).view(-1)
        ms = median_ms(lambda: launch(s8, d8, n), reps)  # noqa: B023 (called at once)
        out.append((f"ptxdsl 1D bulk copy, {stages} stages of {chunk >> 10} KiB, grid {grid}",
                    total_bytes, ms, nbytes / ms / 1e6, memcpy_ms / ms))
        del dst
    return out


def make_bulk_copy(stages: int, chunk: int) -> ptxdsl.KernelDef:
    """The same pipeline with 1D bulk copies of contiguous chunks instead of tensor tiles."""
    from ptxdsl import ptr, u8, u32

    @ptxdsl.kernel(threads=64, name=f"bulk_copy_{stages}x{chunk}")
    def bulk_copy(k, src: ptr(u8), dst: ptr(u8), nchunks: u32):
        ring = k.pipeline("ring", stages, buf=(u8, [chunk], 128))
        with k.role("producer", 0, 1):
            with k.if_(k.elect()):
                with k.for_("t", k.ctaid.x, nchunks, k.nctaid.x) as t:
                    k.acquire(ring)
                    k.bulk_load(ring.buf, src[t * chunk])
                    k.commit(ring)
        with k.role("consumer", 1, 2):
            with k.if_(k.elect()):
                with k.for_("t", k.ctaid.x, nchunks, k.nctaid.x) as t:
                    k.wait(ring)
                    k.bulk_store(dst[t * chunk], ring.buf)
                    k.release(ring)

    return bulk_copy


# ----------------------------------------------------------------------------- norms


def triton_kernels():
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def rms(x_ptr, w_ptr, y_ptr, n, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < n
        x = tl.load(x_ptr + row * n + cols, mask=m, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
        inv = tl.rsqrt(tl.sum(x * x, axis=0) / n + eps)
        tl.store(y_ptr + row * n + cols, (x * inv * w).to(y_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def smax(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < n
        x = tl.load(x_ptr + row * n + cols, mask=m, other=-float("inf")).to(tl.float32)
        e = tl.exp(x - tl.max(x, axis=0))
        tl.store(y_ptr + row * n + cols, (e / tl.sum(e, axis=0)).to(y_ptr.dtype.element_ty),
                 mask=m)

    @triton.jit
    def lnorm(x_ptr, w_ptr, b_ptr, y_ptr, n, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < n
        x = tl.load(x_ptr + row * n + cols, mask=m, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=0) / n
        d = tl.where(m, x - mean, 0.0)
        rstd = tl.rsqrt(tl.sum(d * d, axis=0) / n + eps)
        w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=m, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * n + cols, (d * rstd * w + b).to(y_ptr.dtype.element_ty), mask=m)

    def run(kind, x, w, b, y, eps):
        rows, n = x.shape
        block = triton.next_power_of_2(n)
        if kind == "rmsnorm":
            rms[(rows,)](x, w, y, n, eps, BLOCK=block, num_warps=16)
        elif kind == "softmax":
            smax[(rows,)](x, y, n, BLOCK=block, num_warps=16)
        else:
            lnorm[(rows,)](x, w, b, y, n, eps, BLOCK=block, num_warps=16)

    return run


def bench_norms(rows: int, n: int, reps: int, dtype) -> list[tuple]:
    mod = _twin("norms")
    tdt = torch.bfloat16 if dtype == ptxdsl.bf16 else torch.float32
    eps = 1e-5
    x = (torch.randn(rows, n, device="cuda") * 2).to(tdt)
    w = (1 + 0.1 * torch.randn(n, device="cuda")).to(tdt)
    b = (0.1 * torch.randn(n, device="cuda")).to(tdt)
    nbytes = 2 * x.numel() * x.element_size()
    refs = {
        "rmsnorm": lambda y: y.copy_(torch.nn.functional.rms_norm(x, (n,), w, eps)),
        "softmax": lambda y: y.copy_(torch.softmax(x, dim=-1)),
        "layernorm": lambda y: y.copy_(torch.nn.functional.layer_norm(x, (n,), w, b, eps)),
    }
    torch_fn = {
        "rmsnorm": lambda: torch.nn.functional.rms_norm(x, (n,), w, eps),
        "softmax": lambda: torch.softmax(x, dim=-1),
        "layernorm": lambda: torch.nn.functional.layer_norm(x, (n,), w, b, eps),
    }
    tri = triton_kernels()
    out = []
    for kind in ("rmsnorm", "softmax", "layernorm"):
        want = torch.empty_like(x)
        refs[kind](want)
        want64 = want.double()
        t_ms = median_ms(torch_fn[kind], reps)
        tri_ms = None
        if tri is not None:
            yt = torch.empty_like(x)
            tri(kind, x, w, b, yt, eps)
            torch.cuda.synchronize()
            err = ((yt.double() - want64).norm() / want64.norm()).item()
            if err > 2e-2:
                raise SystemExit(f"triton {kind} disagrees with torch: rel err {err:.3g}")
            tri_ms = median_ms(lambda: tri(kind, x, w, b, yt, eps), reps)  # noqa: B023 (called at once)
        best = None
        for stages, warps in ((2, 8), (3, 8), (4, 8), (2, 16), (3, 16), (4, 16)):
            if stages * n * x.element_size() > 200 * 1024:
                continue
            kd = mod.make_norm(kind, n=n, dtype=dtype, stages=stages, consumer_warps=warps,
                               eps=eps)
            k = kd.program().kernel()
            grid = SMS * ctas_per_sm(k.info)
            y = torch.full_like(x, float("nan"))
            args = {"rmsnorm": (x, w, y, rows), "softmax": (x, y, rows),
                    "layernorm": (x, w, b, y, rows)}[kind]
            launch = k[grid]
            launch(*args)
            torch.cuda.synchronize()
            err = ((y.double() - want64).norm() / want64.norm()).item()
            if not err < 2e-2:
                raise SystemExit(f"ptxdsl {kind} ({stages} stages, {warps} warps) disagrees "
                                 f"with torch: rel err {err:.3g}")
            ms = median_ms(lambda: launch(*args), reps)  # noqa: B023 (called at once)
            if best is None or ms < best[0]:
                best = (ms, stages, warps, grid, err)
        ms, stages, warps, grid, err = best
        gbs = nbytes / ms / 1e6
        row = (f"{kind} {tdt} {rows}x{n}: ptxdsl ({stages} stages, {warps} consumer warps, "
               f"grid {grid}, rel err {err:.1e})", gbs, nbytes / t_ms / 1e6,
               nbytes / tri_ms / 1e6 if tri_ms else None)
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer runs")
    ap.add_argument("--out", help="also write the tables (markdown) to this file")
    a = ap.parse_args()
    reps = 20 if a.quick else 50
    dev = torch.cuda.get_device_name(0)
    from cuda.bindings import driver as drv

    drv.cuInit(0)
    lines = [f"# ptxdsl benchmark, {datetime.date.today()}, {dev}, driver API "
             f"{drv.cuDriverGetVersion()[1]}, torch {torch.__version__}", ""]
    copy_bytes = (256 if a.quick else 2048) << 20
    lines += ["## Streaming copy (bytes read + written)", "",
              "| kernel | buffer | median ms | GB/s | vs memcpy |", "|---|---|---|---|---|"]
    for name, size, ms, gbs, ratio in bench_copy(copy_bytes, reps):
        lines.append(f"| {name} | {size >> 20} MiB | {ms:.3f} | {gbs:.0f} | {ratio:.3f} |")
    rows = 4096 if a.quick else 16384
    lines += ["", "## Row normalisations (bytes read + written)", "",
              "| kernel | ptxdsl GB/s | torch GB/s | Triton GB/s | vs torch | vs Triton |",
              "|---|---|---|---|---|---|"]
    for dtype in (ptxdsl.bf16, ptxdsl.f32):
        for name, gbs, tg, trg in bench_norms(rows, 8192, reps, dtype):
            tri = f"{trg:.0f}" if trg else "n/a"
            vs_tri = f"{gbs / trg:.2f}" if trg else "n/a"
            lines.append(f"| {name} | {gbs:.0f} | {tg:.0f} | {tri} | {gbs / tg:.2f} | "
                         f"{vs_tri} |")
    mod = _twin("stream_copy")
    k = mod.stream_copy.program().kernel()
    src = torch.zeros(64, 256, dtype=torch.bfloat16, device="cuda")
    dst = torch.zeros_like(src)
    tm_s = TensorMap(src, box=(32, 256), dtype=ptxdsl.bf16)
    tm_d = TensorMap(dst, box=(32, 256), dtype=ptxdsl.bf16)
    launch = k[8]
    us = launch_overhead_us(lambda: launch(tm_s, tm_d, 2), n=5000)
    torch.cuda.synchronize()
    lines += ["", f"Host launch overhead (k[grid](args), cached tensor maps, 5000 launches): "
              f"{us:.2f} us per launch", ""]
    text = "\n".join(lines)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
