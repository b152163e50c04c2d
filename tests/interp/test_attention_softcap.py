"""The attention forward's softcap build (make_attention(softcap=True): the scores capped
as softcap tanh(s scale / softcap) before the softmax) in the interpreter against numpy's
float64 reference, with PTXDSL_DEEP=1: a cap small enough to change every row's weights,
with the causal mask and with a window."""

import os

import numpy as np
import pytest
from conftest import sample_module
from test_interp import assert_outputs

DEEP = bool(os.environ.get("PTXDSL_DEEP"))


@pytest.mark.skipif(not DEEP, reason="seconds in the interpreter: PTXDSL_DEEP=1 runs it")
@pytest.mark.parametrize("d, causal, window", [(64, True, None), (128, False, (60, 5))])
def test_softcap_matches_numpy(d, causal, window):
    twin = sample_module("attention")
    kd = twin.make_attention(d, causal, window=window is not None, softcap=True)
    ex = twin.example(np.random.default_rng(d), heads=2, seq=100, kv_seq=190, d=d,
                      causal=causal, grid=2, window=window, softcap=1.5)
    assert_outputs(kd, ex, max_steps=40_000_000)
