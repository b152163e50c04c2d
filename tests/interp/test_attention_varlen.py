"""The attention forward's varlen build (make_attention(varlen=True): packed sequences of
different lengths, FlashAttention's cu_seqlens layout) in the interpreter against numpy's
float64 reference per sequence: sequence ends inside a query tile and inside a key block,
sequences of 0 and 1 rows, the window (causal among them) on top."""

import os

import numpy as np
import pytest
from conftest import sample_module
from test_interp import assert_outputs

DEEP = bool(os.environ.get("PTXDSL_DEEP"))
deep = pytest.mark.skipif(not DEEP, reason="seconds in the interpreter: PTXDSL_DEEP=1 runs it")


def varlen_case(d, lengths, window=None, nwg=2, heads=2, kv_heads=1, grid=2, pingpong=False):
    twin = sample_module("attention")
    kd = twin.make_attention(d, pingpong=pingpong, nwg=nwg, window=window is not None,
                             varlen=True)
    ex = twin.example_varlen(np.random.default_rng(len(lengths) + d), lengths, heads=heads,
                             kv_heads=kv_heads, d=d, nwg=nwg, window=window, grid=grid)
    return kd, ex


@pytest.mark.parametrize("lengths, window", [
    # a sequence of 0 and one of 1 row; the first tile's rows run into three later sequences
    # (stored, they would overwrite those rows; the last tile's, past the packed rows, would
    # store outside O); keys ending inside a block
    ([(30, 50), (0, 0), (1, 7), (70, 140)], None),
    pytest.param([(30, 50), (1, 1), (70, 140)], (-1, 0), marks=deep),  # causal, aligned to
])                                                                      # each sequence's end
def test_varlen_matches_numpy(lengths, window):
    assert_outputs(*varlen_case(64, lengths, window, heads=1), max_steps=40_000_000)


@deep
def test_a_sequence_without_keys_gets_zeros():
    """Queries of a sequence with no key (FlashAttention's convention): O is 0 there, and
    the other sequences are untouched."""
    from ptxdsl.interp import run_sample
    from ptxdsl.runtime.dtypes import bf16_bits_to_f32

    kd, ex = varlen_case(64, [(20, 30), (5, 0), (9, 9)], heads=1, grid=2)
    out = run_sample(kd.ir, {"kernel": kd.name, **ex})
    o = bf16_bits_to_f32(out["o"])
    assert (o[20:25] == 0).all()
    want = ex["expected"]["o"]
    for rows in (slice(0, 20), slice(25, 34)):
        assert np.abs(o[rows] - want[rows]).max() < 2 ** -6 * (1 + np.abs(want[rows]).max())


@deep
@pytest.mark.parametrize("d, lengths, window, nwg, heads, kv_heads, pingpong", [
    (128, [(200, 200), (3, 300), (129, 129)], None, 2, 2, 1, False),  # head dim 128 (lazy max)
    (64, [(250, 260), (1, 1), (193, 400)], (40, 0), 3, 3, 3, False),  # 192-row tiles, local
    (64, [(130, 130), (7, 7), (60, 333)], (-1, 0), 2, 4, 2, True),    # GQA, turns, causal
    (128, [(64, 64), (0, 5), (100, 100)], (9, 9), 2, 2, 2, False),    # a band, a query-less one
])
def test_varlen_more_shapes(d, lengths, window, nwg, heads, kv_heads, pingpong):
    kd, ex = varlen_case(d, lengths, window, nwg, heads, kv_heads, grid=3, pingpong=pingpong)
    assert_outputs(kd, ex, max_steps=60_000_000)
