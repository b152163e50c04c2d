"""The e4m3 attention forward (ptxdsl/kernels/attention_fp8.py) in the interpreter against
numpy's float64 attention of the dequantised inputs: O within P's e4m3 rounding at its worst
(example's tolerance: 2^-4 of the attention of |V|, plus 2^-7 relative), the LSE to 2^-16
relative; odd lengths, causal with more keys than queries, GQA."""

import os

import numpy as np
import pytest

from ptxdsl.interp import run_sample
from ptxdsl.kernels import attention_fp8 as fp8attn
from ptxdsl.tools.runner import compare

DEEP = bool(os.environ.get("PTXDSL_DEEP"))
deep = pytest.mark.skipif(not DEEP, reason="seconds in the interpreter: PTXDSL_DEEP=1 runs it")


def run_case(d, seq, kv_seq, causal, heads=1, kv_heads=1, batch=1, grid=2, seed=0,
             promote=True):
    kd = fp8attn.make_attention_fp8(d, causal, promote=promote)
    ex = fp8attn.example(np.random.default_rng(seed + seq + kv_seq), batch=batch, heads=heads,
                         kv_heads=kv_heads, seq=seq, kv_seq=kv_seq, d=d, causal=causal,
                         grid=grid)
    out = run_sample(kd.ir, {"kernel": kd.name, **ex}, max_steps=60_000_000)
    return ex, out


def check(ex, out):
    types = {"o": fp8attn.bf16, "lse": fp8attn.f32}
    o = compare("o", out["o"], ex["expected"]["o"], types["o"], ex["rtol"], ex["atol"])
    assert o.ok, o.detail
    lse = compare("lse", out["lse"], ex["expected"]["lse"], types["lse"], 2 ** -16, 0.0)
    assert lse.ok, lse.detail


def test_fp8_attention_causal_odd_lengths():
    """37 query rows at the end of 45 keys (causal, aligned to the end), head dim 64."""
    check(*run_case(64, 37, 45, True, grid=1))


@deep
@pytest.mark.parametrize("d, seq, kv_seq, causal, heads, kv_heads, batch", [
    (128, 131, 257, True, 2, 1, 1),   # three key blocks, the last one masked at 257
    (64, 100, 190, False, 2, 1, 1),   # GQA, two key blocks
    (128, 200, 200, False, 2, 2, 2),  # batch 2: the walk over batch and heads
    (64, 1, 300, True, 4, 2, 1),      # decode: one row sees every key
])
def test_fp8_attention_shapes(d, seq, kv_seq, causal, heads, kv_heads, batch):
    check(*run_case(d, seq, kv_seq, causal, heads, kv_heads, batch, grid=3))


@deep
def test_fp8_attention_unpromoted():
    """O accumulated in the tensor cores over every key block (promote=False)."""
    check(*run_case(128, 131, 300, True, grid=1, promote=False))


def test_fp8_attention_refuses_other_head_dims():
    with pytest.raises(ValueError, match="head dim is 64 or 128, not 96"):
        fp8attn.make_attention_fp8(96)
