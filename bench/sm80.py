"""The sm_80 (cp.async) and sm_90a (TMA) builds of the same sources, side by side on one GPU.

    python samples/bench_sm80.py [--quick] [--out results.md]

For stream_copy, the norms and the async-copy guide kernels, both builds come from one
source and one Python call (a TensorMap argument becomes a tensor descriptor for sm_80);
each build is checked (against the reference, and the two builds against each other) before
it is timed. References in the same process: cudaMemcpy D2D (torch copy_), torch, Triton."""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import ptxdsl  # noqa: E402
from ptxdsl.compiler import Program  # noqa: E402
from ptxdsl.runtime import TensorMap  # noqa: E402


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench80_{name}", HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bench = _load("bench")  # median_ms, ctas_per_sm, triton_kernels, SMS
ARCHS = ("sm_80", "sm_90a")


def triton_copy():
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m), mask=m)

    def run(x, y):
        n = x.numel()
        copy[(triton.cdiv(n, 8192),)](x, y, n, BLOCK=8192, num_warps=8)

    return run


def bench_copy(total_bytes: int, reps: int) -> list[str]:
    mod = _load("stream_copy")
    rows = total_bytes // (2 * mod.COLS)
    src = torch.randint(-30000, 30000, (rows, mod.COLS), dtype=torch.int16,
                        device="cuda").view(torch.bfloat16)
    nbytes = 2 * src.numel() * 2
    ref = torch.empty_like(src)
    rows_out = []
    memcpy_ms = bench.median_ms(lambda: ref.copy_(src), reps)
    rows_out.append(("cudaMemcpy D2D (torch copy_)", memcpy_ms))
    tri = triton_copy()
    if tri is not None:
        yt = torch.empty_like(src)
        tri(src.view(torch.int16), yt.view(torch.int16))
        torch.cuda.synchronize()
        assert torch.equal(yt.view(torch.int16), src.view(torch.int16)), "triton copy wrong"
        rows_out.append(("Triton load/store copy",
                         bench.median_ms(lambda: tri(src.view(torch.int16), yt.view(torch.int16)),
                                         reps)))
        del yt
    outs = {}
    for arch in ARCHS:
        k = mod.stream_copy.program(arch).kernel()
        dst = torch.full_like(src, float("nan"))
        tm_s = TensorMap(src, box=(mod.ROWS, mod.COLS), dtype=ptxdsl.bf16)
        tm_d = TensorMap(dst, box=(mod.ROWS, mod.COLS), dtype=ptxdsl.bf16)
        grid = bench.SMS * bench.ctas_per_sm(k.info)
        launch = k[grid]
        ntiles = rows // mod.ROWS
        launch(tm_s, tm_d, ntiles)
        torch.cuda.synchronize()
        if not torch.equal(dst.view(torch.int16), src.view(torch.int16)):
            raise SystemExit(f"stream_copy ({arch}) gave a wrong result")
        outs[arch] = dst
        ms = bench.median_ms(lambda: launch(tm_s, tm_d, ntiles), reps)  # noqa: B023
        rows_out.append((f"ptxdsl stream_copy {arch} build (4 stages of 32x256, grid {grid})",
                         ms))
    assert torch.equal(outs["sm_80"].view(torch.int16), outs["sm_90a"].view(torch.int16))
    lines = [f"| {name} | {total_bytes >> 20} MiB | {ms:.3f} | {nbytes / ms / 1e6:.0f} | "
             f"{memcpy_ms / ms:.3f} |" for name, ms in rows_out]
    return lines


def bench_norms(rows: int, reps: int) -> list[str]:
    n, eps = 8192, 1e-5
    module = ptxdsl.parse_file(HERE / "norms.ptxdsl")  # each kernel built alone for each arch
    x = (torch.randn(rows, n, device="cuda") * 2).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(n, device="cuda")).to(torch.bfloat16)
    b = (0.1 * torch.randn(n, device="cuda")).to(torch.bfloat16)
    nbytes = 2 * x.numel() * x.element_size()
    torch_fn = {
        "rmsnorm": lambda: torch.nn.functional.rms_norm(x, (n,), w, eps),
        "softmax": lambda: torch.softmax(x, dim=-1),
        "layernorm": lambda: torch.nn.functional.layer_norm(x, (n,), w, b, eps),
    }
    tri = bench.triton_kernels()
    lines = []
    for kind in ("rmsnorm", "softmax", "layernorm"):
        want = torch_fn[kind]().double()
        gbs = {}
        ys = {}
        for arch in ARCHS:
            k = Program(ptxdsl.ir.Module(kernels=(module.kernel(kind),)), arch).kernel()
            y = torch.full_like(x, float("nan"))
            args = {"rmsnorm": (x, w, y, rows), "softmax": (x, y, rows),
                    "layernorm": (x, w, b, y, rows)}[kind]
            grid = bench.SMS * bench.ctas_per_sm(k.info)
            launch = k[grid]
            launch(*args)
            torch.cuda.synchronize()
            err = ((y.double() - want).norm() / want.norm()).item()
            if not err < 2e-2:
                raise SystemExit(f"{kind} ({arch}) disagrees with torch: rel err {err:.3g}")
            ys[arch] = y
            ms = bench.median_ms(lambda: launch(*args), reps)  # noqa: B023
            gbs[arch] = (nbytes / ms / 1e6, grid)
        same = torch.equal(ys["sm_80"].view(torch.int16), ys["sm_90a"].view(torch.int16))
        t_gbs = nbytes / bench.median_ms(torch_fn[kind], reps) / 1e6
        tri_gbs = None
        if tri is not None:
            yt = torch.empty_like(x)
            tri_gbs = nbytes / bench.median_ms(lambda: tri(kind, x, w, b, yt, eps), reps) / 1e6  # noqa: B023
        tri_s = f"{tri_gbs:.0f}" if tri_gbs else "n/a"
        lines.append(f"| {kind} bf16 {rows}x{n} | {gbs['sm_80'][0]:.0f} | {gbs['sm_90a'][0]:.0f} "
                     f"| {gbs['sm_80'][0] / gbs['sm_90a'][0]:.2f} | {t_gbs:.0f} | {tri_s} | "
                     f"{'yes' if same else 'NO'} | {gbs['sm_80'][1]} |")
    return lines


def bench_guide(reps: int) -> list[str]:
    progs = {arch: ptxdsl.compile(HERE / "memcpy_async.ptxdsl", arch=arch) for arch in ARCHS}
    lines = []
    nctas, nbatch = bench.SMS * 8, 64
    for kname in ("with_memcpy_async", "with_barrier", "with_staging", "with_specialized_staging"):
        per = 128 if kname == "with_specialized_staging" else 256
        x = torch.randint(-(1 << 20), 1 << 20, (nctas * per * nbatch,), dtype=torch.int32,
                          device="cuda")
        want = x * 3 + 1
        res = {}
        for arch in ARCHS:
            k = progs[arch].kernel(kname)
            y = torch.full_like(x, -1)
            launch = k[nctas]
            launch(x, y, nbatch)
            torch.cuda.synchronize()
            if not torch.equal(y, want):
                raise SystemExit(f"{kname} ({arch}) gave a wrong result")
            ms = bench.median_ms(lambda: launch(x, y, nbatch), reps)  # noqa: B023
            res[arch] = 2 * x.numel() * 4 / ms / 1e6
        lines.append(f"| {kname} | {x.numel() * 4 >> 20} MiB | {res['sm_80']:.0f} | "
                     f"{res['sm_90a']:.0f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args()
    reps = 20 if a.quick else 50
    from cuda.bindings import driver as drv

    drv.cuInit(0)
    lines = [f"## sm_80 and sm_90a builds side by side, {datetime.date.today()}, "
             f"{torch.cuda.get_device_name(0)}, driver API {drv.cuDriverGetVersion()[1]}, "
             f"torch {torch.__version__}", "",
             "The sm_80 build is the Ampere lowering (cp.async spread over the issuing warp, "
             "cp.async.mbarrier.arrive.noinc, vector stores), JIT-compiled by the driver; the "
             "sm_90a build uses TMA. Same source, same Python call.", "",
             "### Streaming copy (bytes read + written)", "",
             "| kernel | buffer | median ms | GB/s | vs memcpy |", "|---|---|---|---|---|"]
    lines += bench_copy((256 if a.quick else 2048) << 20, reps)
    rows = 4096 if a.quick else 16384
    lines += ["", "### Row normalisations, samples/norms.ptxdsl (bytes read + written, GB/s)", "",
              "| kernel | sm_80 build | sm_90a build | sm_80 / sm_90a | torch | Triton | "
              "identical outputs | grid |", "|---|---|---|---|---|---|---|---|"]
    lines += bench_norms(rows, reps)
    lines += ["", "### CUDA-guide async-copy kernels, samples/memcpy_async.ptxdsl (GB/s)", "",
              "| kernel | input | sm_80 build | sm_90a build |", "|---|---|---|---|"]
    lines += bench_guide(reps)
    text = "\n".join(lines)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
