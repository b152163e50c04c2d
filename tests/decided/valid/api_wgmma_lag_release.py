"""Python API: the lagging release of ../api_wgmma_lag_wait_two.py in its correct form:
wgmma_wait(1) retires the previous iteration's group, whose stage goes back to the producer."""

import runpy
from pathlib import Path

kernel = runpy.run_path(str(Path(__file__).parents[1] / "api_wgmma_lag_wait_two.py"))["build"](1)
