"""The attention forward's window build (make_attention(window=True): FlashAttention's
sliding-window / local attention, the window given at launch) in the interpreter against
numpy's float64 reference: windows narrower than a key block, windows crossing block edges,
one bound unbounded, odd lengths; key blocks wholly outside every row's window are not read."""

import os

import numpy as np
import pytest
from conftest import sample_module
from test_interp import assert_outputs

DEEP = bool(os.environ.get("PTXDSL_DEEP"))
deep = pytest.mark.skipif(not DEEP, reason="seconds in the interpreter: PTXDSL_DEEP=1 runs it")


def window_case(d, seq, kv_seq, window, nwg=2, heads=2, kv_heads=1, batch=1, grid=2):
    twin = sample_module("attention")
    kd = twin.make_attention(d, window=True, nwg=nwg)
    ex = twin.example(np.random.default_rng(seq + kv_seq), batch=batch, heads=heads,
                      kv_heads=kv_heads, seq=seq, kv_seq=kv_seq, d=d, grid=grid, nwg=nwg,
                      window=window)
    return twin, kd, ex


@pytest.mark.parametrize("d, seq, kv_seq, window", [
    (64, 100, 190, (5, 3)),      # 9 keys a row, the window crossing the 128-key edge
    pytest.param(64, 130, 300, (140, -1), marks=deep),  # left-bounded: windows starting a
])                                                      # block after the tile's first
def test_window_matches_numpy(d, seq, kv_seq, window):
    _, kd, ex = window_case(d, seq, kv_seq, window, heads=1, grid=1)
    assert_outputs(kd, ex, max_steps=20_000_000)


def test_window_does_not_read_blocks_outside_it():
    """64 queries at the end of 400 keys with the window (10, 0): the tile reads key blocks
    2 and 3 only; blocks 0 and 1 hold NaN, which any read of them (masked or not: 0 x NaN in
    P V) would carry into O."""
    from ptxdsl.runtime.dtypes import bf16_to_f32, f32_to_bf16

    twin, kd, ex = window_case(128, 64, 400, (10, 0), heads=1, grid=1)
    q, k, v = (bf16_to_f32(ex["inputs"][x]) for x in "qkv")
    k[:, :, :256] = np.nan
    v[:, :, :256] = np.nan
    ex["inputs"]["k"], ex["inputs"]["v"] = f32_to_bf16(k), f32_to_bf16(v)
    o, lse = twin.reference(q, np.nan_to_num(k), np.nan_to_num(v), False, 128 ** -0.5, (10, 0))
    assert np.isfinite(o).all()
    ex["expected"] = {"o": o, "lse": lse.reshape(-1)}
    assert_outputs(kd, ex, max_steps=20_000_000)


def test_window_bounds_and_mask():
    """window_bounds turns FlashAttention's -1 (unbounded) into kv_seq keys; window_mask is
    the end-aligned band (and causal is the window (-1, 0))."""
    twin = sample_module("attention")
    assert twin.window_bounds((-1, 3), 50) == (50, 3)
    assert twin.window_bounds((70, -1), 50) == (50, 50)
    m = twin.window_mask(3, 5, window=(1, 0))  # row r's diagonal: key r + 2
    assert m.tolist() == [[False, True, True, False, False], [False, False, True, True, False],
                          [False, False, False, True, True]]
    assert (twin.window_mask(4, 6, causal=True) == twin.window_mask(4, 6, window=(-1, 0))).all()
    assert twin.window_mask(4, 6, window=(-1, -1)).all()


def test_window_build_refuses_causal():
    with pytest.raises(ValueError, match="not also causal"):
        sample_module("attention").make_attention(64, causal=True, window=True)


@deep
@pytest.mark.parametrize("d, seq, kv_seq, window, nwg, heads, kv_heads, batch", [
    (128, 70, 333, (-1, 130), 2, 2, 1, 1),   # right-bounded only, head dim 128 (lazy max)
    (64, 250, 330, (200, 60), 3, 3, 3, 1),   # 192-row tiles, both edges inside the range
    (64, 1, 300, (0, 0), 2, 4, 2, 2),        # decode: one row, one key
    (128, 257, 257, (127, 1), 2, 2, 2, 1),   # an odd length, a band of 129 keys
    (64, 200, 200, (0, -1), 2, 1, 1, 1),     # a row sees its own key and the later ones
])
def test_window_more_shapes(d, seq, kv_seq, window, nwg, heads, kv_heads, batch):
    _, kd, ex = window_case(d, seq, kv_seq, window, nwg, heads, kv_heads, batch, grid=3)
    assert_outputs(kd, ex, max_steps=40_000_000)


def test_window_lse_is_natural_log():
    """The reference's LSE of a one-key window is the scaled score of that key (a check of
    the reference the kernel is compared with)."""
    twin = sample_module("attention")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, n, 64)) for n in (4, 6, 6))
    o, lse = twin.reference(q, k, v, False, 0.125, (0, 0))
    diag = np.arange(4) + 2
    assert np.allclose(o[0, 0], v[0, 0, diag])
    assert np.allclose(lse[0, 0], np.einsum("qd,qd->q", q[0, 0], k[0, 0, diag]) * 0.125)
