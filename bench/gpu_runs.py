"""`python -m bench gpu-tests --out GPU_RUNS.md`: run the GPU tests and put a short record of
the run (date, machine, commit, counts, failures, skip reasons) at the top of the record
file, above the earlier runs."""

from __future__ import annotations

import collections
import datetime
import re
import subprocess
import sys
from pathlib import Path

from .common import ROOT, sh

COMMAND = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/", "-q", "-rs",
           "-p", "no:cacheprovider"]
TITLE = "# GPU test runs"
INTRO = ("The GPU tests are marked `gpu` and run only where a CUDA GPU is present (`pytest -m "
         "gpu`); `python -m bench gpu-tests --out GPU_RUNS.md` runs them and adds the run "
         "here, newest first. `bash .ci/gpu-run` also runs every sample under "
         "compute-sanitizer. Earlier runs, in full: bench/history/gpu-runs-2026-11.md.")


def summarize(output: str) -> tuple[str, list[str], list[str]]:
    """pytest's final counts line, its FAILED/ERROR lines, and the skip reasons counted."""
    lines = output.splitlines()
    counts = next((ln.strip("= ") for ln in reversed(lines)
                   if re.search(r"\d+ (passed|failed|error)", ln)), "no summary line")
    failures = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
    skips: collections.Counter[str] = collections.Counter()
    for ln in lines:
        m = re.match(r"SKIPPED \[(\d+)\] [^:]+:\d+: (.*)", ln)
        if m:
            skips[m.group(2)] += int(m.group(1))
    return counts, failures, [f"{n} x {why}" for why, n in skips.most_common()]


def commit_text(head: str, status: str) -> str:
    """The commit a run is of, saying so when the tree differs from it (a copy of a working
    tree whose .git lags behind, as on a lent GPU machine: name the commit in the record by
    hand then)."""
    return head if not status.strip() else f"{head} plus local changes"


def section(command: list[str], output: str) -> str:
    counts, failures, skips = summarize(output)
    gpus = sh("nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader")
    commit = commit_text(sh("git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"),
                         sh("git", "-C", str(ROOT), "status", "--porcelain",
                            "--untracked-files=no"))
    when = f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"
    shown = " ".join(["python3", *command[1:]])
    out = [f"## {when}, {gpus.replace(chr(10), '; ')}", "",
           f"`{shown}` at commit {commit}: **{counts}**.", ""]
    if failures:
        out += ["Failures:", "", *(f"- `{f}`" for f in failures), ""]
    if skips:
        out += ["Skipped: " + "; ".join(skips) + ".", ""]
    return "\n".join(out)


def insert(path: Path, new: str) -> str:
    """The record with `new` as its first run (after the title and the introduction)."""
    text = path.read_text() if path.exists() else ""
    first = text.find("\n## ")
    rest = text[first + 1:] if first >= 0 else ""
    return f"{TITLE}\n\n{INTRO}\n\n{new.rstrip()}\n" + (f"\n{rest}" if rest else "")


def record(out: str | None, extra: list[str]) -> int:
    command = COMMAND + list(extra)
    p = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    print(p.stdout + p.stderr)
    new = section(command, p.stdout + p.stderr)
    print(new)
    if out:
        Path(out).write_text(insert(Path(out), new))
    return p.returncode
