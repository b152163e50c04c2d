"""mypy over the package (configured in pyproject.toml): the default suite fails on a type
error, so CI type-checks every change. The cache is the checkout's (.mypy_cache, ignored by
git): a clean clone checks everything once, an inner loop only what changed."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT


def test_mypy_finds_no_errors():
    p = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(ROOT / ".mypy_cache"),
                        "--no-error-summary"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
