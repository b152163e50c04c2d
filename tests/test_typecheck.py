"""mypy over the package (configured in pyproject.toml): the default suite fails on a type
error, so CI type-checks every change."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT


def test_mypy_finds_no_errors(tmp_path):
    p = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"),
                        "--no-error-summary"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
