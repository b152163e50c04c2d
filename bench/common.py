"""What every benchmark shares: the kernels' modules (the library's and the samples'), the
machine, GPU timing, correctness checks, and the results page (rows, sections, markdown).

torch is imported inside the functions that time on the GPU, so this module (and the
`python -m bench` command line, and its tests) import on a machine without torch or a GPU."""

from __future__ import annotations

import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import statistics
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
LIBRARY = ROOT / "ptxdsl" / "kernels"  # the kernel library's families


class BenchError(Exception):
    """A benchmark that cannot give a trustworthy number (a wrong result, a missing GPU);
    `python -m bench` prints it and exits 1, `all` records it in the section instead."""


class Unavailable(BenchError):
    """A workload this machine cannot run (the two-GPU copies on one GPU): `all` keeps its
    previous section, says why, and does not count it as a failure."""


# ----------------------------------------------------------------------------- samples


def twin(name: str) -> ModuleType:
    """The Python module of a kernel: the library family ptxdsl.kernels.<name>, or the sample
    samples/<name>.py, imported once (under the one name the tests and the runner use)."""
    from ptxdsl.tools.runner import import_twin

    path = LIBRARY / f"{name}.py"
    if not path.is_file():
        path = SAMPLES / f"{name}.py"
    if not path.is_file():
        raise BenchError(f"no kernel module ptxdsl/kernels/{name}.py or samples/{name}.py")
    return import_twin(path)


# ----------------------------------------------------------------------------- machine


def sh(*cmd: str) -> str:
    """stdout of a command, or why it did not run (machine facts are best-effort)."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"({' '.join(cmd)} failed: {e})"


def gpu_name() -> str:
    """The short name of GPU 0 ("H200"), as the page's GPU column shows it; "no GPU" for a
    workload that ran without one (compile times)."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0).removeprefix("NVIDIA ")
    except ImportError:
        pass
    return "no GPU"


def sms() -> int:
    import torch

    return torch.cuda.get_device_properties(0).multi_processor_count


def machine() -> str:
    """GPU (name, driver, max SM clock, memory), driver API, CPU, Python and library versions."""
    try:
        from cuda.bindings import driver as drv

        drv.cuInit(0)
        api = f"CUDA driver API {drv.cuDriverGetVersion()[1]}"
    except Exception as e:  # the compile workload runs without a GPU
        api = f"no CUDA driver ({type(e).__name__})"
    smi = sh("nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,memory.total",
             "--format=csv,noheader").splitlines()
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = []
    for mod in ("torch", "triton", "cupy", "liger_kernel"):
        try:  # liger_kernel has no __version__; cupy's distribution is named cupy-cuda13x
            version = getattr(__import__(mod), "__version__", None) or \
                importlib.metadata.version(mod.replace("_", "-"))
            versions.append(f"{mod} {version}")
        except (ImportError, importlib.metadata.PackageNotFoundError):
            versions.append(f"{mod} not installed")
    gpus = f"{smi[0]} ({len(smi)} GPU{'s' * (len(smi) != 1)})" if smi and "failed" not in \
        smi[0] else "no GPU"
    return (f"{gpus}; {api}; CPU {cpu} ({os.cpu_count()} threads); Python "
            f"{platform.python_version()}; " + ", ".join(versions))


def tile_grid(kdef: Any, m: int, n: int, bm: int, bn: int, cluster: int = 1) -> int:
    """The persistent grid of a GEMM kernel over bm x bn tiles on GPU 0
    (`ptxdsl.runtime.occupancy`: resident CTAs, at most one a tile)."""
    from ptxdsl.runtime.occupancy import resident_ctas, tile_grid

    return tile_grid(resident_ctas(kdef.program().kernel(), cluster), m, n, bm, bn, cluster)


def ctas_per_sm(info: Any) -> int:
    """CTAs of a kernel (its KernelInfo) that fit on one SM by shared memory and threads."""
    by_smem = 233472 // (info.smem_bytes + 1024) if info.smem_bytes else 32
    by_threads = 2048 // (info.threads[0] * info.threads[1] * info.threads[2])
    return max(1, min(by_smem, by_threads, 32))


def resident(kernel: Any) -> int:
    """CTAs of `kernel` resident on the device at once (registers, shared memory, threads)."""
    from ptxdsl.runtime.occupancy import max_active_clusters

    return max_active_clusters(kernel, (1, 1, 1))


# ----------------------------------------------------------------------------- timing


def median_ms(fn: Callable[[], Any], reps: int, warmup: int = 3, batch: int = 1) -> float:
    """Median milliseconds of one call of `fn` over `reps` CUDA-event-timed intervals.

    batch 1: each call timed alone on an idle GPU, so the interval holds the caller's host
    launch time (what an eager caller waits); batch N: N calls back to back per interval,
    the host cost hidden behind the queue (GPU time per call)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(batch):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / batch)
    return statistics.median(times)


def settle(fns: dict[str, Callable[[], Any]], seconds: float = 1.0) -> None:
    """Run the functions in turn for `seconds` of wall time: a power-capped GPU left idle
    (while kernels compile on the CPU) boosts its clocks for the first tens of milliseconds
    of work, up to ~12% measured on the H200, which would go to whichever runs first."""
    import time

    import torch

    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()


def interleaved_ms(fns: dict[str, Callable[[], Any]], reps: int, rounds: int = 3,
                   batch: int = 1, timer: Callable[..., float] = median_ms,
                   warm: Callable[[dict], None] | None = settle) -> dict[str, float]:
    """The best of `rounds` medians of each function (`timer(fn, reps, batch=batch)`), after
    `warm(fns)` (`settle`: the GPU at its steady clocks), the functions taking turns within
    each round, the order rotated by one each round, so that clocks and temperature treat
    them alike."""
    if warm is not None:
        warm(fns)
    names = list(fns)
    best: dict[str, float] = {}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            ms = timer(fns[name], reps, batch=batch)
            best[name] = min(ms, best.get(name, ms))
    return best


def op_over_kernel(op: Callable[[], Any], kernel: Callable[[], Any], reps: int) -> float:
    """The throughput of a torch op's calls as a fraction of its kernel's launched directly,
    both queued 10 deep (GPU time per call, as a model's layers run): 1.0 when the op's host
    path keeps up with the GPU."""
    ms = interleaved_ms({"op": op, "kernel": kernel}, reps, batch=10)
    return ms["kernel"] / ms["op"]


OP_THROUGHPUT_MIN = 4096**3  # M N K from which the op's throughput is reported


def queued_ms(fn: Callable[[], Any], reps: int, stream: Any, batches: int = 3) -> float:
    """Per-call milliseconds of `reps` calls queued back to back on `stream` (a torch stream)
    behind a sleep kernel, so the host has queued all of them before the GPU reaches the
    first; the median of `batches` such batches."""
    import torch

    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(batches):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            torch.cuda._sleep(5_000_000)  # ~2.5 ms: the host queues everything meanwhile
            a.record(stream)
            for _ in range(reps):
                fn()
            b.record(stream)
        b.synchronize()
        out.append(a.elapsed_time(b) / reps)
    return statistics.median(out)


def alone_ms(fn: Callable[[], Any], stream: Any, trials: int = 30) -> float:
    """Median milliseconds of one call alone: each between two events after a short sleep
    kernel, so it starts on an idle stream and nothing overlaps its start or end."""
    import torch

    fn()
    torch.cuda.synchronize()
    pairs = []
    with torch.cuda.stream(stream):
        torch.cuda._sleep(5_000_000)
        for _ in range(trials):
            torch.cuda._sleep(20_000)  # ~10 us gap
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(stream)
            fn()
            b.record(stream)
            pairs.append((a, b))
    pairs[-1][1].synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in pairs)


# ----------------------------------------------------------------------------- checks


def check_equal(what: str, got: Any, want: Any) -> None:
    """Bit-exact comparison of two torch tensors (viewed as integers of their width)."""
    import torch

    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    g, w = got.view(ints[got.element_size()]), want.view(ints[want.element_size()])
    if not torch.equal(g, w):
        raise BenchError(f"{what} gave a wrong result")


def rel_err(got: Any, want: Any) -> float:
    """||got - want|| / ||want|| in float64."""
    g, w = got.double(), want.double()
    return float((g - w).norm() / w.norm())


def check_close(what: str, got: Any, want: Any, tol: float = 2e-2) -> float:
    """The relative error of `got` against `want`; raises BenchError above `tol`."""
    err = rel_err(got, want)
    if not err < tol:
        raise BenchError(f"{what} disagrees with the reference: relative error {err:.3g}")
    return err


def gemm_error(c: Any, a: Any, b: Any) -> float:
    """max |C - A B^T| / tolerance against an f32 reference (<= 1 passes)."""
    return ref_error(c, a.float() @ b.float().T, a.shape[1])


def ref_error(c: Any, ref: Any, k: int) -> float:
    """max |C - ref| / tolerance for a product over K = k (<= 1 passes: rtol 2^-7 for the
    bf16 rounding of C, atol for sums near zero)."""
    tol = 2 ** -7 * ref.abs() + 1e-3 * k ** 0.5
    return float(((c.float() - ref).abs() / tol).max())


# ----------------------------------------------------------------------------- results page

LOWER_IS_BETTER = {"us", "ms"}


def ratio(ours: float, ref: float, unit: str) -> float:
    """How many times better ptxdsl is than the reference (> 1: ahead), whichever way the
    unit counts: more GB/s or TFLOP/s is better, fewer microseconds is."""
    return ref / ours if unit in LOWER_IS_BETTER else ours / ref


def fmt(value: float, unit: str) -> str:
    if unit in LOWER_IS_BETTER:
        return f"{value:.2f} {unit}"
    return f"{value:.1f} {unit}" if value < 1000 else f"{value:.0f} {unit}"


@dataclass
class Row:
    """One comparison: ptxdsl's best against the strongest reference of the same process."""

    case: str
    ours: str  # which ptxdsl kernel or variant
    ours_value: float
    ref: str  # which reference (or "target" where there is none)
    ref_value: float
    unit: str
    command: str  # reproduces the row
    target: float | None = None  # the ratio this row should reach
    date: str = ""
    gpu: str = ""

    @property
    def ratio(self) -> float:
        return ratio(self.ours_value, self.ref_value, self.unit)

    @property
    def missed(self) -> bool:
        return self.target is not None and self.ratio < self.target

    def render(self) -> str:
        target = "" if self.target is None else \
            f"{self.target:g}x: {'**missed**' if self.missed else 'met'}"
        return (f"| {self.case} | {fmt(self.ours_value, self.unit)} ({self.ours}) | "
                f"{fmt(self.ref_value, self.unit)} ({self.ref}) | {self.ratio:.3f} | {target} | "
                f"{self.date} | {self.gpu} | `{self.command}` |")


HEAD = ["| case | ptxdsl | strongest reference | ptxdsl / ref | target | date | GPU | "
        "command |", "|---|---|---|---|---|---|---|---|"]


@dataclass
class Section:
    """A workload's part of the page: what it measures, its rows, notes of the run, and what
    limits ptxdsl (printed only while a row misses its target)."""

    key: str  # the workload: `python -m bench <key>`
    title: str
    about: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    limits: str = ""
    plot: str = ""  # an image `python -m bench plots` draws from this workload's --json runs

    def stamp(self, date: str, gpu: str) -> Section:
        for r in self.rows:
            r.date, r.gpu = r.date or date, r.gpu or gpu
        return self

    def render(self) -> str:
        out = [heading(self.title, self.key), "", self.about, ""]
        if self.plot:
            out += [f"![{self.title}]({self.plot})", ""]
        if self.rows:
            out += [*HEAD, *(r.render() for r in self.rows), ""]
        if self.notes:
            out += [*self.notes, ""]
        if self.limits and any(r.missed for r in self.rows):
            out += [f"What limits it: {self.limits}", ""]
        return "\n".join(out)


def heading(title: str, key: str) -> str:
    return f"## {title} (`python -m bench {key}`)"


SECTION_RE = re.compile(r"^## .*\(`python -m bench (\S+)`\)$", re.M)


def split_page(text: str) -> tuple[str, dict[str, str]]:
    """A page's header and its sections' text by workload, as `render_page` wrote them."""
    marks = list(SECTION_RE.finditer(text))
    if not marks:
        return text, {}
    sections: dict[str, str] = {}
    for i, m in enumerate(marks):  # a workload may write several sections (decode-gemm: bf16, fp8)
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        part = text[m.start():end].rstrip() + "\n"
        key = m.group(1)
        sections[key] = sections[key] + "\n" + part if key in sections else part
    return text[:marks[0].start()], sections


def render_page(intro: str, machine_line: str, sections: list[str]) -> str:
    """The whole page: title, how it was made, the machine, then one section per workload
    (each already rendered, or kept from the previous page)."""
    head = ["# ptxdsl benchmarks", "", intro, "", f"Machine: {machine_line}", ""]
    return "\n".join(head) + "\n" + "\n".join(s.rstrip() + "\n" for s in sections)


def today() -> str:
    return f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}"


def save_json(path: Path, workload: str, unit: str, points: list[dict[str, Any]]) -> None:
    """A run's measurements as JSON, for `python -m bench plots`: the workload, the unit of
    every value, when and where it ran, and its points (each a case's fields and a
    {contender: value} map)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"workload": workload, "unit": unit, "date": today(), "gpu": gpu_name(),
            "machine": machine(), "points": points}
    path.write_text(json.dumps(data, indent=1) + "\n")


def print_section(s: Section) -> None:
    print(s.render(), flush=True)
