"""The producer tail for every role shape, and a property over pipeline shapes: a pipeline
kernel either passes `check` and runs in the interpreter without deadlock and with the right
result, or `check` rejects it with located errors; never "check ok, then deadlock".

The named shapes also run on the GPU (marked gpu). The property's default budget is small and
fixed (the same examples every run); PTXDSL_FUZZ_EXAMPLES=N draws N fresh ones.
"""

from __future__ import annotations

import numpy as np
import pytest
from fuzzing import SETTINGS, examples
from hypothesis import given, settings
from hypothesis import strategies as st
from pipeline_shapes import Shape

import ptxdsl
from ptxdsl.errors import CompileError
from ptxdsl.interp import run_sample
from ptxdsl.lower import lower


def checked(shape: Shape) -> ptxdsl.ir.Module:
    """The shape's module after `ptxdsl check` (lower, verify); raises CompileError."""
    module = ptxdsl.parse(shape.text(), "shape.ptxdsl")
    lower(module)
    return module


def assert_runs(module, shape: Shape, nbatch: int, seed: int) -> None:
    ex = shape.example(np.random.default_rng(seed), nbatch)
    out = run_sample(module, ex, seed=seed)
    np.testing.assert_array_equal(out["global_out"], ex["expected"]["global_out"])


# ----------------------------------------------------------------------------- role shapes

NAMED = {
    # a producer role and a consumer role (the warp-specialised form)
    "producer_and_consumer_roles": Shape(3, "split", (0, 1), "elect", (1, 3), "all",
                                         "separate", 2),
    # one role that acquires and waits: one thread fetches ahead for all (issue 28)
    "unified_one_thread": Shape(4, "one", (0, 1), "tid", (0, 4), "all", "prefetch", 2),
    # one role, one elected thread per warp acquires, every thread waits
    "unified_elected_per_warp": Shape(2, "one", (0, 2), "elect", (0, 2), "all", "lockstep", 3),
    # one role, every thread acquires and waits
    "unified_every_thread": Shape(2, "one", (0, 2), "all", (0, 2), "all", "prefetch", 2),
    # one role partitioned by lane: warp 0 acquires, the even lanes of both warps wait
    "partitioned_by_lane": Shape(2, "one", (0, 1), "all", (0, 2), "even", "prefetch", 2),
    # one role whose producer loop sits under its own guard: separate loops
    "one_role_separate_loops": Shape(2, "one", (0, 1), "lane0", (1, 2), "all", "separate", 1),
}


@pytest.mark.parametrize("nbatch", [0, 1, 2, 5])
@pytest.mark.parametrize("name", sorted(NAMED))
def test_role_shape_checks_and_runs_in_the_interpreter(name, nbatch):
    shape = NAMED[name]
    assert_runs(checked(shape), shape, nbatch, seed=nbatch)


def test_tail_is_guarded_only_where_threads_that_do_not_acquire_run_the_loop():
    """Where every thread that runs the producer loop acquires (a producer role, or a loop
    under the acquiring guard) the tail needs no flag, and the PTX is as before."""
    def flagged(shape: Shape) -> bool:
        lowered = lower(ptxdsl.parse(shape.text()), checks=False)
        return any(isinstance(s, ptxdsl.ir.Let) and s.name == "ring.put_acquired"
                   for s in ptxdsl.ir.walk(lowered.kernels[0].body))

    assert not flagged(NAMED["producer_and_consumer_roles"])
    assert not flagged(NAMED["one_role_separate_loops"])
    assert not flagged(NAMED["unified_every_thread"])
    assert flagged(NAMED["unified_one_thread"])
    assert flagged(NAMED["partitioned_by_lane"])


def test_unified_role_with_one_fetching_thread_ran_into_the_tail_before():
    """The form of issue 28: every thread of the role waited in the tail on a phase that only
    the fetching thread's acquires had reached. Checked with its text and its Python twin
    (samples/cuda_pipeline.py), which build equal IR."""
    from conftest import SAMPLES, sample_module

    text = ptxdsl.parse_file(SAMPLES / "cuda_pipeline.ptxdsl")
    twin = sample_module("cuda_pipeline")
    for kname in ("with_staging_role", "with_partitioned_staging"):
        kd = getattr(twin, kname)
        assert text.kernel(kname) == kd.ir
        for nbatch in (0, 1, 3):
            ex = twin.example(np.random.default_rng(nbatch), kernel=kname, nctas=2,
                              nbatch=nbatch)
            out = run_sample(kd.ir, {"kernel": kname, **ex}, seed=nbatch)
            np.testing.assert_array_equal(out["global_out"], ex["expected"]["global_out"])


def test_an_acquire_that_depends_on_the_iteration_is_a_located_error():
    shape = NAMED["unified_one_thread"]
    bad = Shape(**{**shape.__dict__, "dependent": True})
    with pytest.raises(CompileError) as e:
        checked(bad)
    text = e.value.render()
    assert "shape.ptxdsl:" in text and "cannot tell which threads run this statement" in text


@pytest.mark.gpu
@pytest.mark.parametrize("nbatch", [0, 1, 7])
@pytest.mark.parametrize("name", sorted(NAMED))
def test_role_shape_runs_on_the_gpu(name, nbatch):
    from conftest import assert_ok

    from ptxdsl.tools.runner import run_example

    shape = NAMED[name]
    ex = shape.example(np.random.default_rng(), nbatch, nctas=8)
    assert_ok(run_example(ptxdsl.compile(shape.text(), watchdog_ms=2000), ex))


# ----------------------------------------------------------------------------- the property


@st.composite
def shapes(draw) -> Shape:
    nwarps = draw(st.integers(1, 3))
    layout = draw(st.sampled_from(["none", "one", "split"] if nwarps > 1 else ["none", "one"]))
    if layout == "split":
        split = draw(st.integers(1, nwarps - 1))
        acq_range, wait_range = (0, split), (split, nwarps)
    else:
        acq_range = wait_range = (0, nwarps)
    a0 = draw(st.integers(acq_range[0], acq_range[1] - 1))
    a1 = draw(st.integers(a0 + 1, acq_range[1]))
    v0 = draw(st.integers(wait_range[0], wait_range[1] - 1))
    v1 = draw(st.integers(v0 + 1, wait_range[1]))
    shape = Shape(nwarps, layout, (a0, a1), draw(st.sampled_from(["elect", "lane0", "tid",
                                                                  "all"])),
                  (v0, v1), draw(st.sampled_from(["all", "even", "lane0"])),
                  draw(st.sampled_from(["lockstep", "prefetch", "separate"])),
                  draw(st.integers(1, 3)), draw(st.booleans() if draw(st.integers(0, 7)) == 0
                                                else st.just(False)))
    if shape.schedule == "separate" and shape.acquire_threads() & shape.wait_threads():
        # a thread that fills every stage before it waits on any would wait on itself
        shape = Shape(**{**shape.__dict__, "schedule": "lockstep"})
    return shape


@settings(max_examples=examples(20, deep=40), **SETTINGS)
@given(shapes(), st.sampled_from([0, 1, 2, 4]), st.integers(0, 3))
def test_pipeline_shapes_pass_check_and_run_or_are_rejected_located(shape, nbatch, seed):
    try:
        module = checked(shape)
    except CompileError as e:
        assert all(d.span is not None and d.span.line > 0 for d in e.diagnostics), e.render()
        assert shape.dependent, f"a correct shape was rejected:\n{shape.text()}\n{e.render()}"
        return
    assert not shape.dependent, f"check accepted an acquire it cannot count:\n{shape.text()}"
    assert_runs(module, shape, nbatch, seed)
