"""Pipeline and turn statements inside `async` blocks: the passes that run before the
one-shot lowering (turns, pipelines) see them, and the interpreter runs the result."""

import numpy as np
import pytest

import ptxdsl
from ptxdsl import ir
from ptxdsl.interp import run
from ptxdsl.lower import lower

# The producer fills a two-stage ring from inside a one-shot load's block (which also loads
# `bsh`); the two consumer warpgroups wait, take turns and release inside another one. Each
# turn logs the stage's value and the warpgroup, so the log shows the stages in order and
# the warpgroups alternating.
ASYNC_PIPELINE = """
kernel k(b: ptr<u32>, out: ptr<u32>) threads(384) {
    shared bsh: u32[32] align 128;
    shared log: u32[8];
    shared n: u32[1];
    pipeline ring stages 2 {
        buf: u32[4] align 16;
    }
    if %tid.x == 0 {
        n[0] = 0;
    }
    bar_sync(0);
    role producer warps 0 .. 4 {
        if %tid.x == 0 {
            async params {
                bulk_load(bsh, b[0]);
                for t in 0 .. 4 {
                    acquire(ring);
                    ring.buf[0] = t + 10;
                    commit(ring);
                }
            }
        }
    }
    role consumers warps 4 .. 12 {
        let wg = %warp / 4 - 1;
        async turns {
            for i in 0 .. 4 {
                wait(ring);
                turn {
                    if %tid.x % 128 == 0 {
                        log[n[0]] = ring.buf[0] * 10 + wg;
                        n[0] = n[0] + 1;
                    }
                }
                release(ring);
            }
        }
        await(turns);
        await(params);
        if %tid.x >= 256 {
            if %tid.x < 256 + 8 { out[%tid.x - 256] = log[%tid.x - 256]; }
        }
        if %tid.x >= 256 + 32 {
            if %tid.x < 256 + 64 { out[%tid.x - 256 - 32 + 8] = bsh[%tid.x - 256 - 32]; }
        }
    }
}
"""


def test_turns_and_pipeline_operations_inside_async_blocks_are_lowered():
    k = lower(ptxdsl.parse(ASYNC_PIPELINE, "k.ptxdsl")).kernels[0]
    left = {type(s).__name__ for s in ir.walk(k.body)
            if isinstance(s, (ir.Turn, ir.AsyncLoad, ir.Acquire, ir.Commit, ir.Wait,
                              ir.Release))}
    assert left == set()
    counts = {s.name: s.count for s in ir.walk(k.body) if isinstance(s, ir.BarrierDecl)}
    # one committing thread; eight consumer warps releasing with one elected arrival each
    assert counts == {"params.bar": 1, "turns.bar": 256, "ring.full": 1, "ring.empty": 8}


@pytest.mark.parametrize("seed", [0, 1])
def test_interpreter_runs_pipeline_and_turns_inside_async_blocks(seed):
    b = np.arange(32, dtype=np.uint32) * 3
    out = np.zeros(40, np.uint32)
    run(ptxdsl.parse(ASYNC_PIPELINE, "k.ptxdsl").kernel(), 1, {"b": b, "out": out}, seed=seed)
    assert list(out[:8]) == [10 * (10 + t) + wg for t in range(4) for wg in range(2)]
    assert (out[8:] == b).all()
