"""A copy's source chosen per stage: one producer thread branching on data (a loop variable,
a parameter) between arms that issue the same pipeline operations. The pipeline pass counts
the arrivals without knowing the arm taken; arms that differ, an arm whose acquire sits in a
loop, or a branch on data taken by several threads stay located errors."""

import numpy as np
import pytest

import ptxdsl
from ptxdsl.errors import CompileError
from ptxdsl.interp import run_sample

PICK = """\
kernel pick(a: tmap<bf16, 2>, b: tmap<bf16, 2>, dst: tmap<bf16, 2>, ntiles: u32,
            odd_from_b: u32) threads(64) {
    pipeline ring stages 2 {
        tile: bf16[32][256] align 128;
    }
    role producer warps 0 .. 1 {
        if elect() {
            for t in %ctaid.x .. ntiles step %nctaid.x {
                if t % 2 == 1 && odd_from_b != 0 {
                    ARM_B
                } else {
                    acquire(ring);
                    tma_load(ring.tile, a, [0, (t * 32) as s32]);
                    commit(ring);
                }
            }
        }
    }
    role consumer warps 1 .. 2 {
        if elect() {
            for t in %ctaid.x .. ntiles step %nctaid.x {
                wait(ring);
                tma_store(dst, [0, (t * 32) as s32], ring.tile);
                release(ring);
            }
        }
    }
}
"""


ARM_B = """acquire(ring);
                    tma_load(ring.tile, b, [0, (t * 32) as s32]);
                    commit(ring);"""


def pick(arm_b: str = ARM_B) -> str:
    return PICK.replace("ARM_B", arm_b)


def compiled(text: str, **kw):
    return ptxdsl.compile_module(ptxdsl.parse(text, "pick.ptxdsl"), source_name="pick.ptxdsl",
                                 **kw)


def example(rng: np.random.Generator, ntiles: int, odd_from_b: int, grid: int) -> dict:
    a = rng.integers(0, 1 << 14, size=(ntiles * 32, 256), dtype=np.uint16)
    b = rng.integers(0, 1 << 14, size=(ntiles * 32, 256), dtype=np.uint16)
    want = a.copy()
    if odd_from_b:
        for t in range(1, ntiles, 2):
            want[t * 32:(t + 1) * 32] = b[t * 32:(t + 1) * 32]
    box = {"box": (32, 256)}
    return {"grid": grid, "inputs": {"a": a, "b": b, "ntiles": ntiles, "odd_from_b": odd_from_b},
            "tensor_maps": {"a": box, "b": box, "dst": box},
            "outputs": {"dst": np.zeros_like(a)}, "expected": {"dst": want}}


@pytest.mark.parametrize("ntiles, odd_from_b, grid", [(5, 1, 2), (4, 0, 1), (7, 1, 3)])
def test_a_source_chosen_per_stage_checks_and_runs_in_the_interpreter(ntiles, odd_from_b, grid):
    module = ptxdsl.parse(pick(), "pick.ptxdsl")
    ex = example(np.random.default_rng(ntiles), ntiles, odd_from_b, grid)
    out = run_sample(module, ex, seed=grid)
    np.testing.assert_array_equal(out["dst"], ex["expected"]["dst"])
    assert "cp.async.bulk.tensor" in compiled(pick()).ptx


@pytest.mark.parametrize("arm_b", [
    "let skipped: u32 = t;",  # this arm acquires nothing
    "for i in 0 .. 1 {\n" + ARM_B + "\n}",  # its acquire in a loop: how often is not the arm's
    ARM_B + "\n" + ARM_B,  # twice
])
def test_arms_that_do_not_issue_the_same_operations_are_refused(arm_b):
    with pytest.raises(CompileError) as e:
        compiled(pick(arm_b))
    text = e.value.render()
    assert "pick.ptxdsl:" in text and "cannot tell which threads run this statement" in text, \
        text


def test_a_branch_on_data_taken_by_a_whole_warp_is_refused():
    """Every lane of warp 0 acquires under the branch: how many arrive is not one thread's."""
    text = pick().replace("        if elect() {\n            for t in %ctaid.x .. ntiles "
                          "step %nctaid.x {\n                if t % 2",
                          "        if true {\n            for t in %ctaid.x .. ntiles "
                          "step %nctaid.x {\n                if t % 2", 1)
    assert text != pick()
    with pytest.raises(CompileError) as e:
        compiled(text)
    assert "cannot tell which threads run this statement" in e.value.render()


@pytest.mark.gpu
@pytest.mark.parametrize("ntiles, odd_from_b, grid", [(9, 1, 4), (6, 0, 2)])
def test_a_source_chosen_per_stage_runs_on_the_gpu(ntiles, odd_from_b, grid):
    from conftest import assert_ok

    from ptxdsl.tools.runner import run_example

    ex = example(np.random.default_rng(), ntiles, odd_from_b, grid)
    assert_ok(run_example(ptxdsl.compile(pick(), watchdog_ms=2000), ex))
