"""`python -m bench <workload> [options] [--out FILE]`, `python -m bench all --out FILE`,
`python -m bench plots`, `python -m bench gpu-tests --out GPU_RUNS.md`; `python -m bench
--help` lists the workloads.

A workload prints its section of the results page; with --out it writes that section into
the page FILE (the page's other sections are kept). `all` runs every workload in one process
(about 6-8 minutes on an H200) and rewrites the whole page; a workload that cannot run there
(the two-GPU copies on one GPU) keeps its previous section and says why."""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType

from .common import (
    BenchError,
    Section,
    Unavailable,
    gpu_name,
    heading,
    machine,
    render_page,
    split_page,
    today,
)

# name -> (module, fixed options); `all` runs them in this order
WORKLOADS: dict[str, tuple[str, dict]] = {
    "copy": ("copies", {}),
    "launch": ("launch", {}),
    "op-launch": ("op_launch", {}),
    "norms": ("norms", {}),
    "longrow": ("longrow", {}),
    "topk": ("topk", {}),
    "gemm": ("gemm", {"cluster": False}),
    "cluster-gemm": ("gemm", {"cluster": True}),
    "decode-gemm": ("decode_gemm", {}),
    "fp8": ("fp8", {}),
    "attention": ("attention", {}),
    "attention-backward": ("attention_bwd", {}),
    "decode-attention": ("decode_attention", {}),
    "torch-block": ("torch_block", {}),
    "splitk": ("splitk", {}),
    "streamk": ("streamk", {}),
    "grouped": ("grouped", {}),
    "sm80": ("sm80", {}),
    "peer": ("peer", {}),
    "tp": ("tp", {}),
    "allreduce": ("allreduce", {}),
    "compile": ("compile_time", {}),
}
INTRO = ("The current results: ptxdsl against the strongest reference measured in the same "
         "process on the same inputs, every result checked before it is timed. `ptxdsl / ref` "
         "above 1 means ptxdsl is ahead (more GB/s or TFLOP/s, fewer us or ms). Contenders timed "
         "in rounds take turns, in an order rotated each round, after a second of warm-up "
         "(an idle power-capped GPU boosts its clocks for the first work). Each row names "
         "its date, GPU and the command that reproduces it; `python -m bench all --out "
         "BENCHMARKS.md` regenerates the page (workload options: `python -m bench WORKLOAD "
         "--help`; `--sweep` runs the exhaustive variants). The plots are drawn by `python -m "
         "bench plots` from the results the workloads save with `--json`. Earlier runs, "
         "profiles and what was tried: bench/history/.")


def module(name: str) -> ModuleType:
    return importlib.import_module(f"bench.{WORKLOADS[name][0]}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="workload", required=True, metavar="WORKLOAD")
    for name, (_, fixed) in WORKLOADS.items():
        mod = module(name)
        first = " ".join(mod.__doc__.split("\n\n")[0].split())
        w = sub.add_parser(name, help=first + (" (the 2 x 1 cluster form)" if fixed.get(
                           "cluster") else ""), description=mod.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_args(w)
        w.add_argument("--out", help="write this section into the results page FILE")
        w.set_defaults(**fixed)
    a = sub.add_parser("all", help="every workload, one process: the whole results page")
    a.add_argument("--out", help="the results page to write (e.g. BENCHMARKS.md)")
    a.add_argument("--skip", default="", help="comma-separated workloads to leave as they are")
    from . import plots

    pl = sub.add_parser("plots", help="draw the page's plots from the workloads' --json results",
                        description=plots.__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    plots.add_args(pl)
    g = sub.add_parser("gpu-tests", help="run `pytest -m gpu` and record it at the top of FILE")
    g.add_argument("--out", help="the record to update (e.g. GPU_RUNS.md)")
    g.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    return p


def defaults(name: str) -> argparse.Namespace:
    """The options a workload runs with in `all`: its defaults."""
    return parser().parse_args([name])


def write_page(out: str, machine_line: str, fresh: dict[str, str], notes: dict[str, str]) -> str:
    """The page at `out` with the sections in `fresh` replaced (others kept as they were; a
    section in `notes` that could not be re-measured keeps its old text plus the reason)."""
    path = Path(out)
    _, old = split_page(path.read_text()) if path.exists() else ("", {})
    sections = []
    for name in WORKLOADS:
        if name in fresh:
            sections.append(fresh[name])
        elif name in old or name in notes:
            text = old.get(name, f"{heading(name, name)}\n\nNot measured yet.\n")
            if name in notes:
                text = text.rstrip() + f"\n\nNot re-measured on {today()}: {notes[name]}\n"
            sections.append(text)
    page = render_page(INTRO, machine_line, sections)
    path.write_text(page)
    return page


def run_all(a: argparse.Namespace) -> int:
    fresh, failed, unavailable = {}, {}, {}
    skip = set(filter(None, a.skip.split(",")))
    mach = machine()
    gpu, date = gpu_name(), today()
    print(f"Machine: {mach}", flush=True)
    for name in WORKLOADS:
        if name in skip:
            continue
        t0 = time.perf_counter()
        try:
            sections = module(name).run(defaults(name))
        except Unavailable as e:
            unavailable[name] = str(e)
            print(f"== {name}: not run here: {e}", flush=True)
            continue
        except Exception as e:  # one workload's failure must not lose the others' numbers
            traceback.print_exc()
            failed[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            print(f"== {name}: FAILED after {time.perf_counter() - t0:.0f} s", flush=True)
            continue
        fresh[name] = "\n".join(s.stamp(date, gpu).render() for s in sections)
        print(fresh[name], flush=True)
        print(f"== {name}: {time.perf_counter() - t0:.0f} s", flush=True)
    if a.out:
        write_page(a.out, mach, fresh, {**unavailable, **failed})
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        if a.workload == "all":
            return run_all(a)
        if a.workload == "plots":
            from .plots import main as draw

            return draw(a)
        if a.workload == "gpu-tests":
            from .gpu_runs import record

            return record(a.out, a.pytest_args)
        sections: list[Section] = module(a.workload).run(a)
        text = "\n".join(s.stamp(today(), gpu_name()).render() for s in sections)
        print(text)
        if a.out:
            write_page(a.out, machine(), {a.workload: text}, {})
        return 0
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
