"""Benchmark ptxdsl kernels against every reference, side by side in one process on the GPU.

    python samples/bench.py [--quick] [--only copy,norms,launch] [--no-compile] [--out FILE]
                            [--batch N]

One table per kernel: each reference and ptxdsl's best variant on the same inputs, results
checked first, times the median of many CUDA-event-timed runs, bandwidth counting bytes read
plus written; each table ends with ptxdsl's ratio to the best reference and says plainly
when ptxdsl is behind. The launch table times every launcher the same way (each call timed
on its own, the queue drained every 50 calls). References are in samples/bench_refs.py; the
C launch loop is samples/bench_launch.c (built here with `cc` when one is installed)."""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import bench_refs as refs  # noqa: E402

import ptxdsl  # noqa: E402
from ptxdsl import b16, bf16, ptr, tmap, u32  # noqa: E402
from ptxdsl.runtime import (  # noqa: E402
    Stream,
    TensorMap,
    capture,
    launch_overhead_us,
    synchronize,
    to_device,
)


def _twin(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# Launches per timed interval (--batch). 1: each launch is timed alone on an idle GPU, so the
# interval holds the launcher's host time before the kernel starts (what an eager caller
# waits); N > 1: N launches queued back to back, the host cost hidden behind the kernels.
BATCH = 1


def median_ms(fn, reps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(BATCH):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / BATCH)
    return statistics.median(times)


def ctas_per_sm(info) -> int:
    by_smem = 233472 // (info.smem_bytes + 1024) if info.smem_bytes else 32
    by_threads = 2048 // (info.threads[0] * info.threads[1] * info.threads[2])
    return max(1, min(by_smem, by_threads, 32))


SMS = torch.cuda.get_device_properties(0).multi_processor_count


class Table:
    """Rows of (name, ms, GB/s or us, ptxdsl?, ranked?); renders markdown with ratios.

    Unranked rows (a floor, a breakdown, a CUDA graph) are shown but not compared."""

    def __init__(self, title: str, unit: str = "GB/s"):
        self.title, self.unit, self.rows, self.notes = title, unit, [], []

    def add(self, name: str, ms: float, value: float | None, ours: bool = False,
            ranked: bool = True) -> None:
        self.rows.append((name, ms, value, ours, ranked))

    def note(self, text: str) -> None:
        self.notes.append(text)

    def best(self, ours: bool):
        rows = [r for r in self.rows if r[3] == ours and r[4] and r[2] is not None]
        if not rows:
            return None
        key = (lambda r: r[2]) if self.unit == "GB/s" else (lambda r: -r[2])
        return max(rows, key=key)

    def render(self) -> list[str]:
        higher = self.unit == "GB/s"  # bandwidth: more is better; microseconds: less is
        best_ours, best_ref = self.best(True), self.best(False)
        col = "ms" if higher else "us per call"
        out = [f"### {self.title}", "", f"| implementation | {col} | {self.unit} | "
               f"ptxdsl best / this |", "|---|---|---|---|"]
        for name, ms, value, _, ranked in self.rows:
            if value is None:
                out.append(f"| {name} | n/a | n/a | |")
                continue
            ratio = ""
            if best_ours is not None and ranked:
                ratio = f"{best_ours[2] / value if higher else value / best_ours[2]:.3f}"
            mark = "**" if best_ours is not None and best_ours[0] == name else ""
            shown = f"{ms:.3f}" if higher else f"{value:.2f}"
            val = f"{value:.0f}" if higher else f"{value:.2f}"
            out.append(f"| {mark}{name}{mark} | {shown} | {val} | {ratio} |")
        out.append("")
        if best_ours and best_ref:
            r = best_ours[2] / best_ref[2] if higher else best_ref[2] / best_ours[2]
            verdict = "ahead of" if r >= 1.0 else "BEHIND"
            out.append(f"ptxdsl best ({best_ours[0]}): {r:.3f}x the best reference "
                       f"({best_ref[0]}): ptxdsl is {verdict} it.")
        out += self.notes
        out.append("")
        return out


# ----------------------------------------------------------------------------- copy


def bench_copy(total_bytes: int, reps: int) -> Table:
    sc, vc = _twin("stream_copy"), _twin("vector_copy")
    rows = total_bytes // (2 * sc.COLS)
    src = torch.randint(-30000, 30000, (rows, sc.COLS), dtype=torch.int16, device="cuda") \
        .view(torch.bfloat16)
    nbytes = 2 * src.numel() * 2
    dst = torch.empty_like(src)
    t = Table(f"Streaming copy, {total_bytes >> 20} MiB (bytes read + written)")

    def gbs(ms):
        return nbytes / ms / 1e6

    def checked(name, fn):
        dst.view(torch.int16).fill_(-1)
        fn()
        torch.cuda.synchronize()
        if not torch.equal(dst.view(torch.int16), src.view(torch.int16)):
            raise SystemExit(f"{name} gave a wrong result")
        return median_ms(fn, reps)

    ms = checked("memcpy", lambda: dst.copy_(src))
    t.add("cudaMemcpy D2D (torch copy_)", ms, gbs(ms))
    tri = refs.triton_copy()
    if tri is None:
        t.add("Triton load/store copy: not installed", 0, None)
    else:
        s16, d16 = src.view(torch.int16).view(-1), dst.view(torch.int16).view(-1)
        best = None
        for block, warps in ((4096, 4), (8192, 8), (16384, 8)):
            ms = checked("triton copy", lambda b=block, w=warps: tri(s16, d16, b, w))
            if best is None or ms < best[0]:
                best = (ms, block, warps)
        ms, block, warps = best
        t.add(f"Triton load/store copy (best of 3: BLOCK {block}, {warps} warps)", ms, gbs(ms))

    words = src.view(torch.uint32).view(-1)
    dwords = dst.view(torch.uint32).view(-1)
    variants = []

    def vector(threads, unroll, load="", store="", grids=("full",)):
        kd = vc.make_vector_copy(threads, unroll, load, store,
                                 name=f"vcopy_{threads}_{unroll}_{len(variants)}")
        k = kd.program().kernel()
        nchunks = words.numel() // vc.chunk_words(threads, unroll)
        assert nchunks * vc.chunk_words(threads, unroll) == words.numel()
        for g in grids:
            grid = {"full": SMS * ctas_per_sm(k.info),
                    "half": SMS * max(1, ctas_per_sm(k.info) // 2), "all": nchunks}[g]
            launch = k[grid]
            ms = checked(kd.name, lambda la=launch, c=nchunks: la(words, dwords, c))
            quals = f", ld{load or ''} st{store or ''}" if load or store else ""
            variants.append((ms, f"ptxdsl vector_copy: {threads} threads, {unroll} x 16 B in "
                             f"flight{quals}, grid {grid}"
                             f"{' (one chunk per CTA)' if g == 'all' else ''}"))

    for threads, unroll in ((256, 4), (256, 8), (512, 4), (512, 8), (1024, 4), (128, 8),
                            (128, 16)):
        vector(threads, unroll, grids=("full", "half", "all"))
    for threads, unroll in ((256, 8), (512, 4), (128, 16)):
        for load, store in ((".nc.L1::no_allocate", ".cs"), (".L2::256B", ""),
                            (".nc.L1::no_allocate.L2::256B", ""), ("", ".cs"), (".lu", ".cs")):
            vector(threads, unroll, load, store)
    # TMA tensor tiles and 1D bulk copies: persistent pipelines ("full" occupancy grid) and
    # one tile per CTA ("all": grid = number of tiles, the pipeline never wraps)
    for stages, box_rows, l2, g in ((4, 32, "none", "full"), (3, 128, "256B", "full"),
                                    (8, 16, "256B", "full"), (1, 32, "none", "all"),
                                    (1, 64, "256B", "all"), (1, 128, "256B", "all")):
        kd = sc.make_stream_copy(stages, box_rows)
        k = kd.program().kernel()
        tm_src = TensorMap(src, box=(box_rows, sc.COLS), dtype=ptxdsl.bf16, l2_promotion=l2)
        tm_dst = TensorMap(dst, box=(box_rows, sc.COLS), dtype=ptxdsl.bf16, l2_promotion=l2)
        ntiles = rows // box_rows
        grid = SMS * ctas_per_sm(k.info) if g == "full" else ntiles
        launch = k[grid]
        ms = checked("stream_copy", lambda la=launch, a=tm_src, b=tm_dst, n=ntiles: la(a, b, n))
        variants.append((ms, f"ptxdsl stream_copy (TMA): {stages} stage{'s' * (stages > 1)} "
                         f"of {box_rows}x256, L2 promotion {l2}, grid {grid}"
                         f"{' (one tile per CTA)' if g == 'all' else ''}"))
    s8, d8 = src.view(torch.uint8).view(-1), dst.view(torch.uint8).view(-1)
    bytes_ = s8.numel()
    for stages, chunk, g in ((4, 16384, "full"), (2, 65536, "full"), (1, 16384, "all"),
                             (1, 32768, "all")):
        k = make_bulk_copy(stages, chunk).program().kernel()
        grid = SMS * ctas_per_sm(k.info) if g == "full" else bytes_ // chunk
        launch = k[grid]
        ms = checked("bulk copy", lambda la=launch, n=bytes_ // chunk: la(s8, d8, n))
        variants.append((ms, f"ptxdsl 1D bulk copy: {stages} stage{'s' * (stages > 1)} of "
                         f"{chunk >> 10} KiB, grid {grid}"
                         f"{' (one chunk per CTA)' if g == 'all' else ''}"))
    variants.sort()
    for ms, name in variants[:6]:
        t.add(name, ms, gbs(ms), ours=True)
    t.note(f"{len(variants)} ptxdsl variants measured, the 6 fastest above; all of them, "
           "fastest first (GB/s):")
    t.note("")
    t.notes += [f"- {gbs(ms):.0f}: {name}" for ms, name in variants]
    return t


def make_bulk_copy(stages: int, chunk: int) -> ptxdsl.KernelDef:
    """The TMA pipeline with 1D bulk copies of contiguous chunks instead of tensor tiles."""
    from ptxdsl import u8

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


def bench_norms(rows: int, n: int, reps: int, dtype, use_compile: bool) -> list[Table]:
    mod = _twin("norms")
    tdt = torch.bfloat16 if dtype == ptxdsl.bf16 else torch.float32
    eps = 1e-5
    x = (torch.randn(rows, n, device="cuda") * 2).to(tdt)
    w = (1 + 0.1 * torch.randn(n, device="cuda")).to(tdt)
    b = (0.1 * torch.randn(n, device="cuda")).to(tdt)
    nbytes = 2 * x.numel() * x.element_size()
    ctx = dict(mod=mod, x=x, w=w, b=b, eps=eps, reps=reps, nbytes=nbytes, dtype=dtype,
               use_compile=use_compile, tri=refs.triton_norms(),
               fused=refs.triton_fused_softmax(), liger=refs.liger_norms())
    return [norm_table(kind, **ctx) for kind in ("rmsnorm", "softmax", "layernorm")]


def norm_table(kind, *, mod, x, w, b, eps, reps, nbytes, dtype, use_compile, tri, fused,
               liger) -> Table:
    rows, n = x.shape
    t = Table(f"{kind}, {str(x.dtype).split('.')[1]} {rows} x {n} (bytes read + written)")
    eager = refs.torch_norm(kind, n, w, b, eps)
    want64 = eager(x).double()

    def check(name, y):
        torch.cuda.synchronize()
        err = ((y.double() - want64).norm() / want64.norm()).item()
        if not err < 2e-2:
            raise SystemExit(f"{name} {kind} disagrees with torch: rel err {err:.3g}")
        return err

    def row(name, fn, ours=False):
        ms = median_ms(fn, reps)
        t.add(name, ms, nbytes / ms / 1e6, ours)

    row("torch (eager)", lambda: eager(x))
    if use_compile:
        best = None
        for form, comp in refs.compiled_norms(kind, n, w, b, eps):
            try:
                check("torch.compile", comp(x))
                ms = median_ms(lambda c=comp: c(x), reps)
            except Exception as e:  # report, do not hide: the table says why it is missing
                t.add(f"torch.compile of {form}: failed ({type(e).__name__}: {str(e)[:80]})",
                      0, None)
                continue
            if best is None or ms < best[0]:
                best = (ms, form)
        if best:
            t.add(f"torch.compile (Inductor), best of 2 forms: {best[1]}", best[0],
                  nbytes / best[0] / 1e6)
    else:
        t.add("torch.compile: skipped (--no-compile)", 0, None)
    y = torch.empty_like(x)
    if tri is not None:
        best = None
        for warps in (4, 8, 16):
            tri(kind, x, w, b, y, eps, warps)
            check("triton", y)
            ms = median_ms(lambda wp=warps: tri(kind, x, w, b, y, eps, wp), reps)
            if best is None or ms < best[0]:
                best = (ms, warps)
        t.add(f"Triton, one row per program (this benchmark's; best of 4/8/16 warps: "
              f"{best[1]})", best[0], nbytes / best[0] / 1e6)
    else:
        t.add("Triton: not installed", 0, None)
    if kind == "softmax" and fused is not None:
        best = None
        for per_sm in (2, 4, 8):
            for stages in (2, 4):
                fused(x, y, SMS * per_sm, stages)
                check("triton fused softmax", y)
                ms = median_ms(lambda p=per_sm, s=stages: fused(x, y, SMS * p, s), reps)
                if best is None or ms < best[0]:
                    best = (ms, per_sm, stages)
        ms, per_sm, stages = best
        t.add(f"Triton tutorial fused softmax (persistent, 8 warps; best: grid "
              f"{SMS * per_sm}, {stages} stages)", ms, nbytes / ms / 1e6)
    if liger is None:
        t.add("Liger-Kernel: not installed", 0, None)
    elif kind in liger:
        try:
            fn = liger[kind]
            check("liger", fn(x, w, b, eps))
            row("Liger-Kernel", lambda: fn(x, w, b, eps))
        except Exception as e:
            t.add(f"Liger-Kernel: failed ({type(e).__name__}: {str(e)[:80]})", 0, None)
    variants = []  # (ms, form, description, rel err)

    def ours(form, kd, grid_of, desc):
        k = kd.program().kernel()
        grid = grid_of(k)
        yy = torch.full_like(x, float("nan"))
        args = {"rmsnorm": (x, w, yy, rows), "softmax": (x, yy, rows),
                "layernorm": (x, w, b, yy, rows)}[kind]
        launch = k[grid]
        launch(*args)
        err = check(f"ptxdsl {form} ({desc})", yy)
        ms = median_ms(lambda la=launch, a=args: la(*a), reps)
        variants.append((ms, form, f"{desc}, grid {grid}", err))

    for warps, minctas in ((4, None), (8, None), (8, 4), (16, None)):
        kd = mod.make_norm_row(kind, n, dtype, warps, eps, minctas=minctas,
                               name=f"{kind}_row_{dtype}_{warps}_{minctas}")
        ours("one row per CTA", kd, lambda k: rows,
             f"{warps} warps{f', minctas {minctas}' if minctas else ''}")
    for stages, warps in ((2, 8), (3, 8), (2, 16), (3, 16)):
        if stages * n * x.element_size() > 200 * 1024:
            continue
        kd = mod.make_norm(kind, n, dtype, stages, warps, eps,
                           name=f"{kind}_{dtype}_{stages}_{warps}")
        ours("TMA ring", kd, resident, f"{stages} stages, {warps} consumer warps")
    variants.sort()
    for form in ("one row per CTA", "TMA ring"):
        ms, _, desc, err = next(v for v in variants if v[1] == form)
        t.add(f"ptxdsl {form} (best: {desc}, rel err {err:.1e})", ms, nbytes / ms / 1e6,
              ours=True)
    t.note(f"All {len(variants)} ptxdsl variants, fastest first (GB/s):")
    t.note("")
    t.notes += [f"- {nbytes / ms / 1e6:.0f}: {form}, {desc}" for ms, form, desc, _ in variants]
    return t


def resident(k) -> int:
    """CTAs of kernel k that fit on the device at once (registers, shared memory, threads)."""
    from ptxdsl.runtime.occupancy import max_active_clusters

    return max_active_clusters(k, (1, 1, 1))


# ----------------------------------------------------------------------------- launch


@ptxdsl.kernel(threads=128)
def launch_probe(k, m: tmap(bf16, 2), p: ptr(b16), n: u32):
    """Does nothing unless n == 12345: the launch is all there is to time. (`p` is b16 so
    that bf16 torch tensors and uint16 cupy arrays both fit it.)"""
    with k.if_(n == 12345):
        k.tma_prefetch_desc(m)
        p[0] = p[1]


def c_launch_floor(cubin: bytes, name: str, n: int) -> float | str:
    """Median us of cuLaunchKernel from C (samples/bench_launch.c), or why it did not run."""
    with tempfile.TemporaryDirectory() as tmp:
        exe, cub = Path(tmp) / "bench_launch", Path(tmp) / "probe.cubin"
        cub.write_bytes(cubin)
        try:
            subprocess.run(["cc", "-O2", "-o", str(exe), str(HERE / "bench_launch.c"), "-ldl"],
                           check=True, capture_output=True, text=True)
            out = subprocess.run([str(exe), str(cub), name, str(n)], check=True,
                                 capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as e:
            return f"did not run ({type(e).__name__}: {getattr(e, 'stderr', '') or e})"
        return float(out.stdout.strip())


def bench_launch(n: int) -> Table:
    t = Table("Host launch: a tensor map, a tensor and a u32 (median us per call, each call "
              "timed alone, queue drained every 50)", unit="us")
    prog = launch_probe.program()
    k = prog.kernel()
    src = torch.zeros(64, 256, dtype=torch.bfloat16, device="cuda")
    dst = torch.zeros_like(src)
    tm = TensorMap(src, box=(32, 256))
    arr = to_device(np.zeros((64, 256), np.uint16), dtype="bf16")

    def us(fn):
        return launch_overhead_us(fn, n=n)

    floor = c_launch_floor(ptxdsl.runtime.load(prog.ptx_module).cubin, k.name, n)
    if isinstance(floor, float):
        t.add("C loop of cuLaunchKernel (the driver's floor on this machine; not ranked)", 0,
              floor, ranked=False)
    else:
        t.add(f"C loop of cuLaunchKernel: {floor}", 0, None)
    cp = refs.cupy_probe()
    if cp is None:
        t.add("cupy RawKernel: not installed", 0, None)
    else:
        for name, fn in cp:
            t.add(name, 0, us(fn) if fn else None)
    x = torch.zeros(64, device="cuda")
    t.add("torch elementwise (x.add_(1), 64 floats)", 0, us(lambda: x.add_(1)))
    tp = refs.triton_probe()
    t.add("Triton launch (a tensor + an int)" if tp else "Triton: not installed", 0,
          us(tp) if tp else None)

    launch = k[1]
    t.add("ptxdsl k[1](tmap, torch tensor, u32), k[1] indexed on every call", 0,
          us(lambda: k[1](tm, dst, 7)), ours=True)
    t.add("ptxdsl launch(tmap, torch tensor, u32), launcher bound once", 0,
          us(lambda: launch(tm, dst, 7)), ours=True)
    t.add("ptxdsl launch(TensorMap(src, box) built per call (cached), torch tensor, u32)", 0,
          us(lambda: launch(TensorMap(src, box=(32, 256)), dst, 7)), ours=True)
    t.add("ptxdsl launch(tmap, ptxdsl DeviceArray, u32), bound once", 0,
          us(lambda: launch(tm, arr, 7)), ours=True)
    try:
        import cupy

        carr = cupy.zeros(64 * 256, dtype=cupy.uint16)
        t.add("ptxdsl launch(tmap, cupy array, u32), bound once", 0,
              us(lambda: launch(tm, carr, 7)), ours=True)
    except ImportError:
        t.add("ptxdsl launch with a cupy array: cupy not installed", 0, None)
    packer = k._packers.get(__import__("threading").get_ident())
    t.add("ptxdsl argument checks + packing alone (no driver call; not ranked)", 0,
          us(lambda: packer.fast(tm, dst, 7)), ranked=False)
    cfg, handle, drv_launch = launch._cfg, k._handle, k._launch_ex
    addr = packer.params_address
    t.add("cuda-bindings cuLaunchKernelEx with pre-packed parameters (Python's floor; not "
          "ranked)", 0, us(lambda: drv_launch(cfg, handle, addr, 0)), ranked=False)
    # CUDA graph: 100 launches captured once, replayed; per-launch cost = replay / 100
    s = Stream(non_blocking=True)
    on_s = k[1, None, s]
    on_s(tm, dst, 7)  # checked and prepared before the capture
    s.synchronize()
    with capture(s) as g:
        for _ in range(100):
            on_s(tm, dst, 7)
    replay_us = us(g.replay)
    t.add("ptxdsl CUDA graph of 100 captured launches: one replay / 100 (not ranked)", 0,
          replay_us / 100, ours=True, ranked=False)
    t.note(f"One replay of the 100-launch graph costs {replay_us:.2f} us of host time.")
    ours = next(r for r in t.rows if r[0].startswith("ptxdsl launch(tmap, torch tensor"))
    cupy_rows = [r for r in t.rows if r[0].startswith("cupy") and r[2]]
    if ours[2] is not None:
        cupy_best = min((r[2] for r in cupy_rows), default=None)
        t.note(f"Targets, for a bound launcher with a tensor map and a torch tensor: < 5 us: "
               f"{'met' if ours[2] < 5 else 'MISSED'} ({ours[2]:.2f} us); at or below cupy's "
               f"RawKernel: " + ("cupy not measured" if cupy_best is None else
                                 f"{'met' if ours[2] <= cupy_best else 'MISSED'} "
                                 f"({cupy_best:.2f} us)") + ".")
    g.close()
    s.close()
    synchronize()
    return t


def machine() -> str:
    from cuda.bindings import driver as drv

    drv.cuInit(0)
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,"
                              "memory.total", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        smi = torch.cuda.get_device_name(0)
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = [f"torch {torch.__version__}"]
    for mod in ("triton", "cupy", "liger_kernel"):
        try:  # liger_kernel has no __version__; cupy's distribution is named cupy-cuda13x
            version = getattr(__import__(mod), "__version__", None) or \
                importlib.metadata.version(mod.replace("_", "-"))
            versions.append(f"{mod} {version}")
        except (ImportError, importlib.metadata.PackageNotFoundError):
            versions.append(f"{mod} not installed")
    return (f"{smi}; CUDA driver API {drv.cuDriverGetVersion()[1]}; CPU {cpu} "
            f"({os.cpu_count()} threads); Python {platform.python_version()}; "
            + ", ".join(versions))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer runs")
    ap.add_argument("--only", default="copy,norms,launch", help="comma-separated tables")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile references")
    ap.add_argument("--out", help="also write the tables (markdown) to this file")
    ap.add_argument("--batch", type=int, default=1,
                    help="kernel launches per timed interval (default 1: each launch timed "
                         "alone, its host launch cost included; N > 1 hides it)")
    a = ap.parse_args()
    global BATCH
    BATCH = max(1, a.batch)
    only = set(a.only.split(","))
    reps = 10 if a.quick else 30
    timing = ("each launch timed alone on an idle GPU (the launcher's host time included)"
              if BATCH == 1 else f"{BATCH} launches back to back per timed interval (host "
              "launch cost hidden)")
    lines = [f"## ptxdsl benchmark, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}"
             " UTC", "", f"Machine: {machine()}", "", f"Kernel timing: {timing}.", ""]

    def emit(t: Table) -> None:
        text = t.render()
        print("\n".join(text), flush=True)
        lines.extend(text)

    if "copy" in only:
        emit(bench_copy((256 if a.quick else 2048) << 20, reps))
    if "launch" in only:
        emit(bench_launch(1000 if a.quick else 5000))
    if "norms" in only:
        rows = 4096 if a.quick else 16384
        for dtype in (ptxdsl.bf16, ptxdsl.f32):
            for t in bench_norms(rows, 8192, reps if a.quick else 100, dtype,
                                 not a.no_compile):
                emit(t)
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
