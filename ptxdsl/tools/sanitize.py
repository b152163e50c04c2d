"""`ptxdsl run --sanitize`: run a sample under NVIDIA compute-sanitizer, one tool at a time.

Each tool re-runs `python -m ptxdsl run FILE` in a child process under
`compute-sanitizer --tool T --error-exitcode 86`, so the sample's own pass/fail and the
sanitizer's findings are reported apart. racecheck and synccheck check shared-memory hazards
and barrier use; memcheck out-of-bounds and misaligned accesses; initcheck reads of
uninitialised global memory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import LaunchError

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
FINDINGS_EXIT = 86  # compute-sanitizer's exit status when it reported an error


@dataclass(frozen=True)
class SanitizerRun:
    tool: str
    returncode: int
    output: str

    @property
    def status(self) -> str:
        if self.returncode == 0:
            return "clean"
        return "findings" if self.returncode == FINDINGS_EXIT else "sample failed"


def parse_tools(spec: str) -> tuple[str, ...]:
    """'all' or a comma-separated list of tools, checked."""
    tools = TOOLS if spec == "all" else tuple(t.strip() for t in spec.split(",") if t.strip())
    bad = [t for t in tools if t not in TOOLS]
    if bad or not tools:
        raise LaunchError(f"--sanitize takes 'all' or some of {', '.join(TOOLS)}; got {spec!r}")
    return tools


def sanitizer_path() -> str:
    """compute-sanitizer from PATH or the CUDA toolkit, or a clear error."""
    found = shutil.which("compute-sanitizer")
    for root in filter(None, (os.environ.get("CUDA_HOME"), "/usr/local/cuda")):
        candidate = os.path.join(root, "bin", "compute-sanitizer")
        if found is None and os.access(candidate, os.X_OK):
            found = candidate
    if found is None:
        raise LaunchError("--sanitize needs NVIDIA's compute-sanitizer (from the CUDA toolkit) "
                          "on PATH or in $CUDA_HOME/bin; it was not found")
    return found


def command(tool: str, file: str, extra: Sequence[str], sanitizer: str) -> list[str]:
    return [sanitizer, "--tool", tool, "--error-exitcode", str(FINDINGS_EXIT),
            "--target-processes", "all", sys.executable, "-m", "ptxdsl", "run", file, *extra]


def sanitize(file: str, tools: Sequence[str], extra: Sequence[str] = ()) -> list[SanitizerRun]:
    sanitizer = sanitizer_path()
    runs = []
    for tool in tools:
        p = subprocess.run(command(tool, file, extra, sanitizer), capture_output=True, text=True,
                           check=False)
        runs.append(SanitizerRun(tool, p.returncode, p.stdout + p.stderr))
    return runs
