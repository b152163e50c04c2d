"""The grouped GEMM's offsets kernel (`grouped_bounds`, ptxdsl/kernels/grouped_gemm.py) in the
interpreter: E int32 row ends, in order, out of order, negative and past T, become 0 then
the running maximum of each end clamped to 0 .. T."""

import numpy as np
import pytest

from ptxdsl.interp import run_sample
from ptxdsl.kernels.grouped_gemm import make_bounds


@pytest.mark.parametrize("experts, tokens", [(1, 5), (3, 100), (32, 64), (70, 500)])
def test_bounds_are_clamped_running_maxima(experts, tokens):
    rng = np.random.default_rng(experts)
    ends = rng.integers(-20, tokens + 40, experts).astype(np.int32)
    want = np.concatenate([[0], np.maximum.accumulate(np.clip(ends, 0, tokens))])
    example = {"grid": 1, "inputs": {"ends": ends, "offs": np.full(experts + 1, 7, np.uint32),
                                     "experts": experts, "tokens": tokens},
               "expected": {"offs": want.astype(np.uint32)}}  # what run_sample hands back
    got = run_sample(make_bounds().ir, example, seed=experts)["offs"]
    np.testing.assert_array_equal(got, want.astype(np.uint32))
