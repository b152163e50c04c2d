"""Python API: the column multicast of ../api_multicast_col_part.py in its correct form: each
CTA delivers the part of its place in the column (y)."""

import runpy
from pathlib import Path

kernel = runpy.run_path(str(Path(__file__).parents[1] / "api_multicast_col_part.py"))["build"]("y")
