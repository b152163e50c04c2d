"""Python API: the ring of ../api_wait_ring_one_behind.py in its correct form: the producer's
waits on the fresh empty barriers start at parity 1, the consumers' waits on 'full' at 0."""

import runpy
from pathlib import Path

kernel = runpy.run_path(str(Path(__file__).parents[1] / "api_wait_ring_one_behind.py"))["build"](0)
