"""Lagging releases (a wgmma group kept in flight across pipeline stages): `release` hands back
the oldest stage a consumer holds, `wait` takes the next; the lowering gives such a pipeline
a release cursor of its own, the builder and the lowering reject the forms whose lag is not
a constant of the text or that hold every stage, and the verifier and the interpreter catch
a stage released while a wgmma that reads it is in flight."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import sample_module, sample_path
from fuzzing import DEEP

import ptxdsl
from ptxdsl import ir
from ptxdsl.interp import run, run_sample
from ptxdsl.interp.errors import InterpError
from ptxdsl.interp.tensormap import TensorMapModel
from ptxdsl.lower import lower
from ptxdsl.tools.runner import compare

BROKEN = Path(__file__).parents[1] / "broken"

# The consumer holds the stage it waited on first while it waits on the next; out[i] is the
# stage index, and the first element of the stage, that wait i + 1 sees.
LAG = """
kernel lag(src: ptr<u32>, out: ptr<u32>, n: u32) threads(64) {{
    pipeline ring stages {stages} {{
        buf: u32[32] align 128;
    }}
    role producer warps 0 .. 1 {{
        if elect() {{
            for t in 0 .. n {{
                acquire(ring);
                bulk_load(ring.buf, src[t * 32]);
                commit(ring);
            }}
        }}
    }}
    role consumer warps 1 .. 2 {{
        wait(ring);
        for t in 1 .. n {{
            {body}
        }}
        release(ring);
    }}
}}
"""
LAG_BODY = """wait(ring);
            if %laneid == 0 {
                out[2 * (t - 1)] = ring.stage;
                out[2 * t - 1] = ring.buf[0];
            }
            release(ring);"""


def _errors(text: str) -> str:
    with pytest.raises(ptxdsl.CompileError) as e:
        ptxdsl.compile_module(ptxdsl.parse(text, "k.ptxdsl"))
    return str(e.value)


def _cursors(text: str) -> dict[str, int]:
    k = lower(ptxdsl.parse(text, "k.ptxdsl")).kernels[0]
    return {s.name: s.value.value for s in k.body
            if isinstance(s, ir.Let) and s.name.startswith("ring.")}


def test_a_lagging_consumer_gets_a_release_cursor_and_an_alternating_one_does_not():
    lagging = _cursors(LAG.format(stages=3, body=LAG_BODY))
    # the wait cursor starts one stage before stage 0, with the phase that wraps to 0
    assert lagging == {"ring.put_stage": 0, "ring.put_phase": 0, "ring.get_stage": 2,
                       "ring.get_phase": 1, "ring.rel_stage": 0}
    alternating = (Path(__file__).parents[2] / "samples" / "colsum.ptxdsl").read_text()
    assert _cursors(alternating) == {"ring.put_stage": 0, "ring.put_phase": 0,
                                     "ring.get_stage": 0, "ring.get_phase": 0}


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_after_a_lagging_wait_the_stage_is_the_one_waited_last(stages):
    n = 7
    src = np.repeat(np.arange(100, 100 + n, dtype=np.uint32), 32)
    out = np.zeros(2 * (n - 1), np.uint32)
    run(ptxdsl.parse(LAG.format(stages=stages, body=LAG_BODY), "k.ptxdsl").kernels[0], 1,
        {"src": src, "out": out, "n": n})
    waits = np.arange(1, n)
    assert out[0::2].tolist() == (waits % stages).tolist()  # ring.stage
    assert out[1::2].tolist() == (100 + waits).tolist()  # ring.buf: that wait's tile


def test_a_conditional_release_is_rejected_where_it_is_written():
    body = "wait(ring);\n            if t > 1 { release(ring); }"
    msg = _errors(LAG.format(stages=3, body=body))
    assert "k.ptxdsl:19:24: error: release(ring) without a matching wait(ring) earlier in the " \
        "same block (a release may lag behind its wait" in msg
    assert "issue the first step before the loop" in msg


def test_a_wait_that_is_never_released_is_rejected():
    msg = _errors(LAG.format(stages=3, body="wait(ring);"))
    assert "k.ptxdsl:18:13: error: wait(ring) is not closed by release(ring) in the same block" \
        in msg


def test_a_wait_while_holding_every_stage_is_rejected():
    msg = _errors(LAG.format(stages=1, body=LAG_BODY))
    assert "k.ptxdsl:18:13: error: wait(ring) while this role holds all 1 stage(s) of 'ring'" \
        in msg
    assert "k.ptxdsl:16:9: note: stage held since this wait(ring)" in msg


@pytest.mark.parametrize("name", ["wgmma_lag_release_before_wait",
                                  "wgmma_lag_wait_too_shallow"])
def test_interpreter_reports_a_lagging_release_under_a_pending_wgmma(name):
    """The corpus kernels that the verifier rejects, run anyway: in the schedules where the
    producer refills the released stage first, the interpreter names the wgmma."""
    from ptxdsl.runtime.dtypes import f32_to_bf16

    path = BROKEN / f"{name}.ptxdsl"
    text = path.read_text()
    wgmmas = [i for i, line in enumerate(text.split("\n"), 1) if "wgmma(acc" in line]
    k = ptxdsl.parse(text, path.name).kernels[0]
    a = f32_to_bf16(np.random.default_rng(0).standard_normal((64, 256), np.float32))
    races = 0
    for seed in range(6):
        try:
            run(k, 1, {"a": TensorMapModel(a, (64, 64), swizzle="128B"),
                       "b": TensorMapModel(a, (64, 64), swizzle="128B"),
                       "c": np.zeros(128, np.float32), "ktiles": 4}, seed=seed)
        except InterpError as e:
            assert e.kind == "race", str(e)
            assert "overwritten before wgmma_wait completed it" in str(e)
            assert any(f"{path.name}:{line}:" in str(e) for line in wgmmas), str(e)
            races += 1
    assert races


# the 2-stage case with PTXDSL_DEEP (CI); by default 4 stages here and the sample's 3 in test_interp
@pytest.mark.parametrize("stages, bn", [(4, 128)] + ([(2, 256)] if DEEP else []))
def test_gemm_keeps_a_group_in_flight_with_any_stage_count(stages, bn):
    """The GEMM twin with 2 stages (one stage in the tensor cores, one filling) and with 4
    (128 x 128 tiles: 4 stages of 128 x 256 exceed shared memory), on one CTA that walks two
    tiles, so the cursors run on from one tile's k-blocks into the next's."""
    from ptxdsl.runtime.dtypes import bf16_to_f32

    twin = sample_module("gemm")
    ex = twin.example(np.random.default_rng(stages), m=256, n=bn, k=192, grid=1, bn=bn)
    kdef = twin.make_gemm(stages=stages, bn=bn)
    kdef.program()  # verified
    c = bf16_to_f32(run_sample(kdef.ir, ex, seed=stages)["c"])
    ref = ex["expected"]["c"]
    assert (np.abs(c - ref) <= ex["rtol"] * np.abs(ref) + ex["atol"]).all()


@pytest.mark.parametrize("splits", [2, 3] if DEEP else [2])
def test_splitk_keeps_a_group_in_flight_over_uneven_slices(splits):
    """Split-K with 3 K steps in uneven slices (1 and 2; 1, 1 and 1 under DEEP): the first K
    step of each slice before the loop, the rest with a lagging release, one CTA going on to
    the next item of the persistent walk (test_schedule runs stream-K's uneven ranges over
    three, test_schedule the two-kernel form over one CTA)."""
    twin = sample_module("gemm_splitk")
    k = ptxdsl.parse_file(sample_path("gemm_splitk"))
    ex = twin.example(np.random.default_rng(9), m=128, n=256, k=192, splits=splits,
                      ordered=0, grid=1)
    out = run_sample(k.kernels[0], ex, seed=1)
    for name, want in ex["expected"].items():
        r = compare(name, out[name], want, None if name != "c" else ptxdsl.bf16, ex["rtol"],
                    ex["atol"])
        assert r.ok, f"{name}: {r.detail}"
