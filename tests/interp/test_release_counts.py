"""The empty-barrier count the compiler derives for a pipeline equals the arrivals that the
interpreter sees on it, for producers and one to three consumer roles of one or two warps
that all read every stage, released by whole warps or by some lanes, over one to three
stages (issue 44: two roles sharing every stage got the count of one role).

A property over role / warp / stage combinations: the default budget is small and fixed;
PTXDSL_FUZZ_EXAMPLES=N draws N fresh ones."""

from __future__ import annotations

from unittest import mock

import numpy as np
from fuzzing import SETTINGS, examples
from hypothesis import given, settings
from hypothesis import strategies as st

import ptxdsl
from ptxdsl.interp import run
from ptxdsl.interp.mbarrier import MBarrier
from ptxdsl.lower import lower


def kernel_text(roles: list[tuple[int, int]], stages: int) -> str:
    """A producer warp, then one consumer role per (warps, lanes that release) of `roles`:
    each of its releasing lanes sums element `lane` of every tile."""
    nwarps = 1 + sum(w for w, _ in roles)
    parts = [f"kernel shared_ring(src: ptr<f32>, out: ptr<f32>, ntiles: u32) "
             f"threads({32 * nwarps}) {{",
             f"    pipeline ring stages {stages} {{\n        tile: f32[32] align 128;\n    }}",
             "    role producer warps 0 .. 1 {\n        if elect() {\n"
             "            for t in 0 .. ntiles {\n                acquire(ring);\n"
             "                bulk_load(ring.tile, src[t * 32]);\n"
             "                commit(ring);\n            }\n        }\n    }"]
    w0 = 1
    for i, (warps, lanes) in enumerate(roles):
        parts.append(
            f"    role consumer{i} warps {w0} .. {w0 + warps} {{\n"
            f"        if %laneid < {lanes} {{\n"
            "            let acc: f32 = 0.0;\n"
            "            for t in 0 .. ntiles {\n                wait(ring);\n"
            "                acc += ring.tile[%laneid];\n                release(ring);\n"
            "            }\n            out[%tid.x] = acc;\n        }\n    }")
        w0 += warps
    return "\n".join(parts) + "\n}\n"


def derived_empty_count(text: str) -> int:
    k = lower(ptxdsl.parse(text, "shared_ring.ptxdsl")).kernels[0]
    [count] = [d.count for d in k.body
               if isinstance(d, ptxdsl.ir.BarrierDecl) and d.name == "ring.empty"]
    return count


@settings(max_examples=examples(6, deep=30), **SETTINGS)
@given(roles=st.lists(st.tuples(st.integers(1, 2), st.sampled_from([1, 8, 32])), min_size=1,
                      max_size=3), stages=st.integers(1, 3), turns=st.integers(1, 2))
def test_derived_empty_count_equals_the_interpreters_arrivals(roles, stages, turns):
    text = kernel_text(roles, stages)
    count = derived_empty_count(text)
    arrivals: dict[str, int] = {}
    arrive = MBarrier.arrive

    def counted(self, th, n, node):
        arrivals[self.label] = arrivals.get(self.label, 0) + n
        arrive(self, th, n, node)

    ntiles = stages * turns
    src = np.arange(32 * ntiles, dtype=np.float32)
    out = np.zeros(32 * (1 + sum(w for w, _ in roles)), np.float32)
    with mock.patch.object(MBarrier, "arrive", counted):
        run(ptxdsl.parse(text, "shared_ring.ptxdsl").kernels[0], 1,
            {"src": src, "out": out, "ntiles": ntiles}, seed=turns)
    empty = {label: n for label, n in arrivals.items() if "ring.empty" in label}
    assert len(empty) == stages, arrivals
    # each stage's empty barrier completes one phase per turn of the ring
    assert all(n == count * turns for n in empty.values()), (count, empty)
    # and the count is the releasing warps (whole warps arrive once) or lanes
    assert count == sum(w if lanes == 32 else w * lanes for w, lanes in roles)
