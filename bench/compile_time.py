"""Compile time: .ptxdsl -> PTX in this process (parse, lower, verify, emit), no GPU needed.

    python -m bench compile [--reps 30]

The first call in the process (which loads the grammar), then the median of `reps` warm
calls and the median of each phase, for the GEMM (the 30 ms target) and two other samples."""

from __future__ import annotations

import argparse
import statistics
import time

from .common import ROOT, SAMPLES, Row, Section

NORMS = ROOT / "ptxdsl" / "kernels" / "norms.ptxdsl"

FILES = (SAMPLES / "gemm.ptxdsl", SAMPLES / "gemm_splitk.ptxdsl", NORMS)
ABOUT = ("`.ptxdsl` -> PTX in one process on the benchmark machine's CPU: parse, lower, "
         "verify, emit; the median of warm calls (the first call also loads the grammar).")
LIMITS = ("lark's LALR parse with positions (~15 us a token in Python) and the verifier's "
          "thread-set trace; on the 2-core dev VM gemm.ptxdsl takes about 31 ms.")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reps", type=int, default=30, help="warm compiles per file")


def phases(path, reps: int) -> tuple[float, float, dict[str, float]]:
    """(first call ms, median ms, median ms of each phase) of compiling `path` to PTX."""
    import ptxdsl
    from ptxdsl.lower import emit, lower
    from ptxdsl.target import target
    from ptxdsl.verify import verify_module

    HOPPER = target("sm_90a")
    src = path.read_text()
    times: dict[str, list[float]] = {"parse": [], "lower": [], "verify": [], "emit": []}
    totals = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        m = ptxdsl.parse(src, path.name)
        t1 = time.perf_counter()
        low = lower(m, HOPPER, checks=False)
        t2 = time.perf_counter()
        verify_module(low, HOPPER)
        t3 = time.perf_counter()
        emit(low, HOPPER)
        t4 = time.perf_counter()
        for k, a, b in (("parse", t0, t1), ("lower", t1, t2), ("verify", t2, t3),
                        ("emit", t3, t4)):
            times[k].append(1e3 * (b - a))
        totals.append(1e3 * (t4 - t0))
    return totals[0], statistics.median(totals[1:]), \
        {k: statistics.median(v[1:]) for k, v in times.items()}


def run(a: argparse.Namespace) -> list[Section]:
    s = Section("compile", "Compile time", ABOUT, limits=LIMITS)
    for path in FILES:
        name = path.name
        first, median, parts = phases(path, a.reps)
        split = ", ".join(f"{k} {v:.1f}" for k, v in parts.items())
        if name == "gemm.ptxdsl":
            s.rows.append(Row(name, f"median of {a.reps}; {split}", median, "target", 30.0,
                              "ms", "python -m bench compile", target=1.0))
        s.notes.append(f"{name}: first call {first:.1f} ms, median {median:.1f} ms ({split}).")
    return [s]
