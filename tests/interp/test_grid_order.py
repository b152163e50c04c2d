"""Global memory across the CTAs of a grid (issue 44, classes 7 and 9): CTAs that talk through
global memory run interleaved, and a plain access to another CTA's plain store must follow an
acquire of a release that the store happened before (interp/gorder.py). Each broken kernel
fails at every seed, located at its racing access; its twin passes at every seed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ptxdsl
from ptxdsl.interp import InterpError, run

SEEDS = range(4)

# thread 0 bumps with acq_rel, but no CTA barrier orders the other threads' stores before it
BUMP_BEFORE_BARRIER = (Path(__file__).parents[1] / "decided" /
                       "last_cta_bump_before_barrier.ptxdsl").read_text()

# the same merge with the barrier: the twin
BUMP_AFTER_BARRIER = BUMP_BEFORE_BARRIER.replace(
    "    if tid == 0 {\n        last[0]", "    bar_sync(0);\n    if tid == 0 {\n        last[0]")

# every CTA stores its row into the same elements of 'dst', nothing ordering the stores
SAME_ROWS = """
kernel same_rows(src: ptr<f32>, dst: ptr<f32>) threads(32) {
    let tid = %tid.x;
    dst[tid] = src[%ctaid.x * 32 + tid];
}
"""

# each CTA stores its own row: the twin
OWN_ROWS = SAME_ROWS.replace("dst[tid]", "dst[%ctaid.x * 32 + tid]")

# every CTA bumps a counter (relaxed: nothing is published) and stores into the same
# elements; the counter makes the grid interleave
SAME_ROWS_COUNTED = """
kernel same_rows_counted(src: ptr<f32>, dst: ptr<f32>, sem: ptr<u32>) threads(32) {
    let tid = %tid.x;
    if tid == 0 {
        let old: u32 = atomic_add(sem[0], 1, relaxed);
    }
    dst[tid] = src[%ctaid.x * 32 + tid];
}
"""


def launch(source: str, seed: int, grid: int = 3) -> dict[str, np.ndarray]:
    k = ptxdsl.parse(source, "grid.ptxdsl").kernels[0]
    rng = np.random.default_rng(seed)
    args: dict[str, object] = {"src": rng.standard_normal(32 * grid).astype(np.float32)}
    for p in k.params:
        if p.name != "src":
            args[p.name] = np.zeros(32 * grid, ptxdsl.types.numpy_dtype(p.type.elem))
    run(k, grid, args, seed=seed)
    return args  # type: ignore[return-value]


@pytest.mark.parametrize("seed", SEEDS)
def test_bump_before_the_barrier_races(seed):
    with pytest.raises(InterpError, match="no release of that CTA after the store was acquired"
                       ) as e:
        launch(BUMP_BEFORE_BARRIER, seed)
    assert "grid.ptxdsl:16:" in str(e.value)  # the merge's read of 'part'


@pytest.mark.parametrize("seed", SEEDS)
def test_bump_after_the_barrier_merges(seed):
    out = launch(BUMP_AFTER_BARRIER, seed)
    want = (2 * out["src"]).reshape(3, 32).sum(axis=0)
    np.testing.assert_allclose(out["dst"][:32], want, rtol=1e-6)
    assert out["sem"][0] == 3


@pytest.mark.parametrize("seed", SEEDS)
def test_unordered_stores_of_two_ctas_race(seed):
    with pytest.raises(InterpError, match=r"writes element \d+ of 'dst', which thread \d+ of "
                       r"CTA \d stored") as e:
        launch(SAME_ROWS_COUNTED, seed)
    assert "grid.ptxdsl:7:" in str(e.value)


@pytest.mark.parametrize("seed", SEEDS)
def test_own_rows_pass(seed):
    out = launch(OWN_ROWS.replace("threads(32) {", "threads(32) {\n    if %tid.x == 0 {\n"
                                  "        let old: u32 = atomic_add(sem[0], 1, relaxed);\n"
                                  "    }").replace("dst: ptr<f32>)", "dst: ptr<f32>, "
                                                  "sem: ptr<u32>)"), seed)
    np.testing.assert_array_equal(out["dst"], out["src"])


@pytest.mark.parametrize("seed", SEEDS)
def test_unordered_stores_race_without_atomics_too(seed):
    """No atomics: the CTAs run one after another, and whichever ran last would leave its
    row; the record of stores (interp/gwrites.py) reports the second store at every seed."""
    with pytest.raises(InterpError, match=r"writes element \d+ of 'dst', which thread \d+ of "
                       r"CTA \d stored, and nothing orders the two stores") as e:
        launch(SAME_ROWS, seed)
    assert "grid.ptxdsl:4:" in str(e.value)


@pytest.mark.parametrize("seed", SEEDS)
def test_own_rows_pass_without_atomics(seed):
    out = launch(OWN_ROWS, seed)
    np.testing.assert_array_equal(out["dst"], out["src"])


# CTA 0 waits (parked on global memory) for CTA 1's flag; CTA 1 raises it and then waits in
# a loop with a body, which never parks, for CTA 0's answer
PING_PONG = """
kernel ping_pong(flags: ptr<u32>) threads(32) {
    if %tid.x == 0 {
        if %ctaid.x == 0 {
            while ld_acquire(flags[0]) == 0 {
            }
            st_release(flags[1], 1);
        } else {
            st_release(flags[0], 1);
            let spins: u32 = 0;
            while ld_acquire(flags[1]) == 0 {
                spins += 1;
            }
        }
    }
}
"""


@pytest.mark.parametrize("seed", SEEDS)
def test_a_woken_cta_runs_while_another_spins(seed):
    k = ptxdsl.parse(PING_PONG, "grid.ptxdsl").kernels[0]
    flags = np.zeros(2, np.uint32)
    run(k, 2, {"flags": flags}, seed=seed, max_steps=20_000)
    assert list(flags) == [1, 1]
