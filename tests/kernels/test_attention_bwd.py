"""The attention backward (ptxdsl/kernels/attention_bwd.py) in the interpreter: its three
kernels chained on small random problems against a float64 numpy backward, with
PTXDSL_DEEP=1 (as CI runs it; seconds each): head dim 64 with ragged lengths, causal, a
longer KV, GQA 2:1, head dim 128, the deterministic mode."""

from __future__ import annotations

import math
import os
import warnings

import numpy as np
import pytest

from ptxdsl.interp import InterpWarning, TensorMapModel, run
from ptxdsl.kernels import attention, attention_bwd
from ptxdsl.runtime.dtypes import bf16_to_f32, f32_to_bf16

DEEP = bool(os.environ.get("PTXDSL_DEEP"))
deep = pytest.mark.skipif(not DEEP, reason="seconds in the interpreter: PTXDSL_DEEP=1 runs it")


def problem(rng: np.random.Generator, batch: int, heads: int, kv_heads: int, seq: int,
            kv_seq: int, d: int, causal: bool, window: tuple[int, int] = (-1, -1),
            softcap: float = 0.0) -> dict:
    """bf16 Q, K, V, dO; O (bf16) and the LSE (f32, natural units) as the forward leaves
    them; the float64 reference gradients of the bf16 values (`window` and `softcap` as
    attention.reference takes them)."""
    q = f32_to_bf16(rng.standard_normal((batch, heads, seq, d), np.float32))
    k = f32_to_bf16(rng.standard_normal((batch, kv_heads, kv_seq, d), np.float32))
    v = f32_to_bf16(rng.standard_normal((batch, kv_heads, kv_seq, d), np.float32))
    do = f32_to_bf16(rng.standard_normal((batch, heads, seq, d), np.float32))
    scale = 1.0 / math.sqrt(d)
    qf, kf, vf, dof = (bf16_to_f32(x) for x in (q, k, v, do))
    o, lse = attention.reference(qf, kf, vf, causal, scale, window, softcap)
    return {"q": q, "k": k, "v": v, "do": do, "o": f32_to_bf16(o.astype(np.float32)),
            "lse": lse.astype(np.float32).reshape(-1), "scale": scale, "softcap": softcap,
            "expected": attention_bwd.reference(qf, kf, vf, dof, causal, scale, window,
                                                softcap)}


def scalars(pb: dict) -> dict:
    """The main kernel's scale_log2 and scale, and with a softcap its cap_scale (the capped
    scores in units of the cap: P = exp2(tanh(s cap_scale) softcap log2 e - LSE))."""
    scale, cap = pb["scale"], pb["softcap"]
    log2e = math.log2(math.e)
    return {"scale_log2": np.float32(cap * log2e if cap else scale * log2e),
            "scale": np.float32(scale), **({"cap_scale": np.float32(scale / cap)} if cap else {})}


def backward(pb: dict, causal: bool, deterministic: bool = False, seed: int = 0,
             raw: dict | None = None, stages: tuple[int, int] | None = None,
             window: tuple[int, int] | None = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dQ, dK, dV (f32) from the three kernels run in the interpreter (`stages`: the main
    kernel's; `window`: the window builds', (left, right) as attention.reference takes it);
    `raw` receives the f32 dQ accumulator and the semaphores as the main kernel left
    them."""
    q, k, v, do = pb["q"], pb["k"], pb["v"], pb["do"]
    b, h, s, d = q.shape
    kvh, skv = k.shape[1], k.shape[2]
    gqa = h != kvh
    sp = attention_bwd.padded(s)
    lse2 = np.zeros(b * h * sp, np.float32)
    dps = np.zeros(b * h * sp, np.float32)
    dqacc = np.full((b, h, s, d), np.nan, np.float32)  # the preprocess must zero it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InterpWarning)
        run(attention_bwd.make_preprocess(d, window=window is not None),
            -(-b * h * sp // attention_bwd.PRE_THREADS),
            {"o": pb["o"], "dout": do, "lse": pb["lse"], "lse2": lse2, "dps": dps,
             "dqacc": dqacc, "seq": s, "seq_pad": sp, "rows": b * h}, seed=seed)
        if gqa:  # per query head, for the finish kernel to sum
            dk = np.zeros((b, h, skv, d), np.float32)
            dv = np.zeros((b, h, skv, d), np.float32)
        else:
            dk = np.zeros((b, h, skv, d), np.uint16)
            dv = np.zeros((b, h, skv, d), np.uint16)
        box = {"swizzle": "128B", "dtype": "bf16"}
        sem = np.zeros(b * h * sp // 64, np.uint32)  # a dQ tile's count: zero between launches
        kern = attention_bwd.make_attention_bwd(d, causal, gqa, deterministic, stages,
                                                window=window is not None,
                                                softcap=bool(pb["softcap"]))
        bounds = {} if window is None else dict(zip(
            ("window_left", "window_right"), attention.window_bounds(window, skv), strict=True))
        run(kern, attention_bwd.grid(b, h, skv),
            {"q": TensorMapModel(q, box=(1, 1, 64, 64), **box),
             "key": TensorMapModel(k, box=(1, 1, 128, 64), **box),
             "value": TensorMapModel(v, box=(1, 1, 128, 64), **box),
             "dout": TensorMapModel(do, box=(1, 1, 64, 64), **box),
             "lse2": lse2, "dps": dps,
             "dqacc": TensorMapModel(dqacc, box=(1, 1, 64, 32), swizzle="128B"),
             "sem": sem, "dk": dk, "dv": dv,
             "seq": s, "kv_seq": skv, "seq_pad": sp, "heads": h, "kv_heads": kvh,
             **scalars(pb), **bounds}, seed=seed, max_steps=50_000_000)
        if raw is not None:
            raw.update(dqacc=dqacc.copy(), sem=sem)
        fin = attention_bwd.make_finish()

        def finish(src: np.ndarray, group: int, scale: float, heads: int) -> np.ndarray:
            out = np.zeros((b, heads) + src.shape[2:], np.uint16)
            total = out.size
            run(fin, -(-total // (4 * attention_bwd.FINISH_THREADS)),
                {"src": src, "out": out, "total": total, "per_head": src[0, 0].size,
                 "group": group, "scale": np.float32(scale)}, seed=seed)
            return bf16_to_f32(out)

        dq = finish(dqacc, 1, pb["scale"], h)
        if gqa:
            dk, dv = finish(dk, h // kvh, 1.0, kvh), finish(dv, h // kvh, 1.0, kvh)
        else:
            dk, dv = bf16_to_f32(dk), bf16_to_f32(dv)
    return dq, dk, dv


def check(got: tuple, want: tuple) -> None:
    """bf16 outputs against the float64 gradients: within 2^-6 relative to each tensor's
    largest magnitude (the bf16 P and dS the wgmmas take cost a few 2^-9 each)."""
    for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert g.shape == w.shape, f"{name}: shape {g.shape}, expected {w.shape}"
        err = np.abs(g - w).max() / np.abs(w).max()
        assert np.isfinite(g).all() and err < 2 ** -6, f"{name}: max error {err:.4f} of the max"


@deep
def test_backward_head_dim_64_ragged():
    """Lengths that are no multiple of the blocks: padded query rows and keys past the end
    are masked, and the dQ reduce-adds of the last query block are clipped by the map."""
    pb = problem(np.random.default_rng(0), 1, 1, 1, 70, 130, 64, False)
    check(backward(pb, False), pb["expected"])


@deep
@pytest.mark.parametrize("seq, kv_seq", [(100, 100), (90, 200)])
def test_backward_causal(seq, kv_seq):
    """Causal, the mask aligned to the end: key blocks start at the query block holding
    their diagonal, and the blocks that cross it are masked element by element."""
    pb = problem(np.random.default_rng(seq), 1, 2, 2, seq, kv_seq, 64, True)
    check(backward(pb, True), pb["expected"])


@deep
@pytest.mark.parametrize("stages", [(1, 1), (1, 3)])
def test_backward_pipeline_depths(stages):
    """Other depths of the two Q / dO pipelines (the MN-major copies may run ahead of the
    K-major ones), over five query blocks."""
    pb = problem(np.random.default_rng(11), 1, 1, 1, 300, 200, 64, False)
    check(backward(pb, False, stages=stages), pb["expected"])


@deep
@pytest.mark.parametrize("batch, seq, kv_seq, causal", [(2, 65, 129, False), (1, 96, 96, True)])
def test_backward_gqa(batch, seq, kv_seq, causal):
    """GQA 2:1: dK and dV as f32 partials per query head, summed by the finish kernel (two
    batches: every head and batch coordinate of the maps and offsets)."""
    pb = problem(np.random.default_rng(5), batch, 4, 2, seq, kv_seq, 64, causal)
    check(backward(pb, causal), pb["expected"])


@deep
@pytest.mark.parametrize("heads, kv_heads, seq, kv_seq, causal, deterministic",
                         [(1, 1, 80, 150, False, False), (4, 2, 130, 200, True, True)])
def test_backward_head_dim_128(heads, kv_heads, seq, kv_seq, causal, deterministic):
    """Head dim 128, where the warpgroups share dS and each adds half of dQ's columns over
    all 128 keys (the pair barrier orders their reads and writes of dS)."""
    pb = problem(np.random.default_rng(7), 1, heads, kv_heads, seq, kv_seq, 128, causal)
    check(backward(pb, causal, deterministic), pb["expected"])


@deep
def test_backward_deterministic_is_bit_identical():
    """The deterministic mode adds each dQ tile's partials in one key-block order (the last
    key block reaching the tile first, down to block 0): runs with different CTA orders and
    interleavings (seeds) leave the same f32 dQ bits (the seeds chosen are ones whose
    unordered adds differ), and the semaphores end at zero (causal with 200 queries and 300
    keys, the first two query blocks get adds from two of the three key blocks: block 0
    resets their counts)."""
    runs = []
    for seed, seq, kv_seq in ((0, 70, 400), (2, 70, 400), (0, 200, 300)):
        pb = problem(np.random.default_rng(9), 1, 1, 1, seq, kv_seq, 64, True)
        raw: dict = {}
        check(backward(pb, True, deterministic=True, seed=seed, raw=raw), pb["expected"])
        assert not raw["sem"].any(), f"semaphores left at {raw['sem']}"
        runs.append(raw["dqacc"])
    assert np.array_equal(runs[0], runs[1])
