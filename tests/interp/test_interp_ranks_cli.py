"""`ptxdsl interp FILE --ranks N` (issue 44, deliver 7): a multi-rank kernel from the command
line, as tests/multigpu's driver runs it (`run_ranks`): each rank waits for its flag, stores
its row into a symmetric buffer every rank shares and releases the next rank's flag."""

from __future__ import annotations

import textwrap

from conftest import cli

RING = """
kernel ring(flags: ptr<u32>, rows: ptr<u32>, rank: u32, world: u32) threads(32) {
    if %tid.x == 0 {
        if rank != 0 {
            while ld_acquire(flags[rank], sys) == 0 {
            }
        }
    }
    bar_sync(0);
    rows[rank * 32 + %tid.x] = rank * 100 + %tid.x;
    bar_sync(0);
    if %tid.x == 0 {
        st_release(flags[(rank + 1) % world], 1, sys);
    }
}
"""

TWIN = """
import numpy as np

def ranks_example(rng, world):
    flags = np.zeros(world, np.uint32)
    rows = np.zeros(world * 32, np.uint32)
    want = (np.arange(world)[:, None] * 100 + np.arange(32)).astype(np.uint32).reshape(-1)
    return {"grid": 1, "expected": {"rows": want + OFFSET},
            "ranks": [{"flags": flags, "rows": rows, "rank": r, "world": world}
                      for r in range(world)]}
"""


def write(tmp_path, offset=0):
    (tmp_path / "ring.ptxdsl").write_text(RING)
    (tmp_path / "ring.py").write_text(textwrap.dedent(TWIN).replace("OFFSET", str(offset)))
    return str(tmp_path / "ring.ptxdsl")


def test_ranks_run_and_compare(tmp_path):
    for world in (2, 4):
        r = cli("interp", write(tmp_path), "--ranks", str(world), "--seed", "1")
        assert r.returncode == 0, r.stderr
        assert f"PASS ring x {world} ranks: rows" in r.stdout


def test_a_wrong_reference_fails(tmp_path):
    r = cli("interp", write(tmp_path, offset=1), "--ranks", "2")
    assert r.returncode == 1 and "FAIL ring x 2 ranks: rows" in r.stdout


def test_a_twin_without_ranks_example_is_named(tmp_path):
    path = write(tmp_path)
    (tmp_path / "ring.py").write_text("def example(rng):\n    return {}\n")
    r = cli("interp", path, "--ranks", "2")
    assert r.returncode != 0 and "needs ranks_example(rng, world)" in r.stderr
    assert "Traceback" not in r.stderr
