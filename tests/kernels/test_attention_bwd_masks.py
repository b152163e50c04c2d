"""The attention backward's window, varlen and softcap builds (make_attention_bwd(window=,
varlen=, softcap=), ptxdsl/kernels/attention_bwd_masks.py) in the interpreter against a
float64 numpy backward, with PTXDSL_DEEP=1: window edges crossing key and query blocks,
keys no row sees (zero dK, dV), rows that see no key (zero dQ), packed sequences of odd
lengths with one of no query and one of no key, softcap, and the deterministic mode
bit-identical across CTA orders."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from test_attention_bwd import backward, check, deep, problem, scalars

from ptxdsl.interp import InterpWarning, TensorMapModel, run
from ptxdsl.kernels import attention, attention_bwd
from ptxdsl.kernels.attention_bwd_masks import head_rows, padded
from ptxdsl.runtime.dtypes import bf16_to_f32, f32_to_bf16


def test_window_and_varlen_builds_are_not_also_causal():
    with pytest.raises(ValueError, match="not also causal"):
        attention_bwd.make_attention_bwd(64, causal=True, window=True)


@deep
@pytest.mark.parametrize("seq, kv_seq, window, d", [
    (70, 200, (40, 10), 64),  # both edges cross blocks; keys 0 .. 89 seen by no row
    (130, 130, (2, 1), 64),  # a narrow band along the diagonal
    (100, 300, (-1, 0), 128),  # causal as the window: dQ's columns split at 128
    (90, 90, (20, -1), 64),  # bounded left only
])
def test_window(seq, kv_seq, window, d):
    pb = problem(np.random.default_rng(seq + d), 1, 2, 1, seq, kv_seq, d, False, window)
    check(backward(pb, False, window=window), pb["expected"])


@deep
def test_window_deterministic_is_bit_identical():
    """The window's key blocks of a query block (first .. last) count its adds: two seeds
    (CTA orders) give the same dQ bits and leave the semaphores at 0."""
    runs = []
    for seed in (0, 2):
        pb = problem(np.random.default_rng(3), 1, 1, 1, 150, 400, 64, False, (150, 30))
        raw: dict = {}
        check(backward(pb, False, True, seed, raw, window=(150, 30)), pb["expected"])
        assert not raw["sem"].any(), f"semaphores left at {raw['sem']}"
        runs.append(raw["dqacc"])
    assert np.array_equal(*runs)


@deep
@pytest.mark.parametrize("window", [None, (30, 5)])
def test_softcap(window):
    pb = problem(np.random.default_rng(4), 1, 2, 2, 80, 150, 64, False, window or (-1, -1),
                 softcap=2.0)
    check(backward(pb, False, window=window), pb["expected"])


def varlen_problem(rng: np.random.Generator, lengths: list[tuple[int, int]], heads: int,
                   kv_heads: int, d: int, window: tuple[int, int] | None,
                   softcap: float = 0.0) -> dict:
    """Packed bf16 Q, dO (total_q, H, D), K, V (total_k, KVH, D) of sequences of `lengths`
    (query rows, keys), O and the LSE (H, total_q) as the forward leaves them, and the
    float64 gradients sequence by sequence (zero for a sequence without keys)."""
    nq, nk = (np.array([n[i] for n in lengths]) for i in (0, 1))
    cu_q, cu_k = (np.concatenate([[0], np.cumsum(n)]).astype(np.int32) for n in (nq, nk))
    tq, tk = int(cu_q[-1]), int(cu_k[-1])
    q, do = (f32_to_bf16(rng.standard_normal((tq, heads, d), np.float32)) for _ in "qo")
    k, v = (f32_to_bf16(rng.standard_normal((tk, kv_heads, d), np.float32)) for _ in "kv")
    scale = 1.0 / math.sqrt(d)
    o, lse = np.zeros((tq, heads, d)), np.full((heads, tq), -np.inf)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(k.shape)
    for b in range(len(lengths)):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if nq[b] == 0 or nk[b] == 0:
            continue
        qb, kb, vb, dob = (bf16_to_f32(x[part]).transpose(1, 0, 2)[None] for x, part in
                           ((q, rows), (k, keys), (v, keys), (do, rows)))
        w = window or (-1, -1)
        ob, lb = attention.reference(qb, kb, vb, False, scale, w, softcap)
        o[rows], lse[:, rows] = ob[0].transpose(1, 0, 2), lb[0]
        grads = attention_bwd.reference(qb, kb, vb, dob, False, scale, w, softcap)
        for x, part, g in zip((dq, dk, dv), (rows, keys, keys), grads, strict=True):
            x[part] = g[0].transpose(1, 0, 2)
    return {"q": q, "k": k, "v": v, "do": do, "o": f32_to_bf16(o.astype(np.float32)),
            "lse": lse.astype(np.float32).reshape(-1), "cu_q": cu_q, "cu_k": cu_k,
            "maxq": int(nq.max()), "maxk": int(nk.max()), "scale": scale, "softcap": softcap,
            "expected": (dq, dk, dv)}


def varlen_backward(pb: dict, window: tuple[int, int] | None, deterministic: bool = False,
                    seed: int = 0, raw: dict | None = None) -> tuple[np.ndarray, ...]:
    """dQ, dK, dV (f32) from the varlen builds of the three kernels in the interpreter."""
    q, k, do = pb["q"], pb["k"], pb["do"]
    (tq, h, d), (tk, kvh, _) = q.shape, k.shape
    batch = len(pb["cu_q"]) - 1
    rows, sp = head_rows(tq, batch), padded(pb["maxq"])
    gqa = h != kvh
    lse2, dps = (np.full(h * rows, np.nan, np.float32) for _ in "ld")
    dqacc = np.full((tq, h, d), np.nan, np.float32)  # the preprocess must zero it
    part = np.zeros((tk, h, d), np.float32) if gqa else np.zeros((tk, kvh, d), np.uint16)
    dk, dv = part, part.copy()
    sem = np.zeros(h * rows // 64, np.uint32)
    bounds = {} if window is None else dict(zip(
        ("window_left", "window_right"), attention.window_bounds(window, tk), strict=True))
    box = {"swizzle": "128B", "dtype": "bf16"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InterpWarning)
        run(attention_bwd.make_preprocess(d, varlen=True, window=window is not None),
            -(-batch * h * sp // attention_bwd.PRE_THREADS),
            {"o": pb["o"], "dout": do, "lse": pb["lse"], "lse2": lse2, "dps": dps,
             "dqacc": dqacc, "cu_seqlens_q": pb["cu_q"], "seq_pad": sp, "rows": batch * h,
             "heads": h, "total_q": tq, "head_rows": rows}, seed=seed)
        kern = attention_bwd.make_attention_bwd(d, False, gqa, deterministic,
                                                window=window is not None, varlen=True,
                                                softcap=bool(pb["softcap"]))
        run(kern, attention_bwd.grid(batch, h, pb["maxk"]),
            {"q": TensorMapModel(q, box=(64, 1, 64), **box),
             "key": TensorMapModel(k, box=(128, 1, 64), **box),
             "value": TensorMapModel(pb["v"], box=(128, 1, 64), **box),
             "dout": TensorMapModel(do, box=(64, 1, 64), **box),
             "lse2": lse2, "dps": dps,
             "dqacc": TensorMapModel(dqacc, box=(64, 1, 32), swizzle="128B"),
             "sem": sem, "dk": dk, "dv": dv, "cu_seqlens_q": pb["cu_q"],
             "cu_seqlens_k": pb["cu_k"], "kv_seq": pb["maxk"], "seq_pad": rows,
             "heads": h, "kv_heads": kvh, **scalars(pb), **bounds},
            seed=seed, max_steps=50_000_000)
        if raw is not None:
            raw.update(dqacc=dqacc.copy(), sem=sem)
        fin = attention_bwd.make_finish()

        def finish(src: np.ndarray, group: int, scale: float, heads: int) -> np.ndarray:
            out = np.zeros((src.shape[0], heads, d), np.uint16)
            run(fin, -(-out.size // (4 * attention_bwd.FINISH_THREADS)),
                {"src": src, "out": out, "total": out.size, "per_head": d, "group": group,
                 "scale": np.float32(scale)}, seed=seed)
            return bf16_to_f32(out)

        got_dq = finish(dqacc, 1, pb["scale"], h)
        if gqa:
            return got_dq, finish(dk, h // kvh, 1.0, kvh), finish(dv, h // kvh, 1.0, kvh)
        return got_dq, bf16_to_f32(dk), bf16_to_f32(dv)


@deep
@pytest.mark.parametrize("lengths, window, heads, kv_heads, d", [
    ([(70, 130), (0, 5), (1, 1), (33, 0), (130, 65)], None, 1, 1, 64),
    ([(70, 130), (1, 40), (100, 100)], (-1, 0), 2, 1, 64),  # causal: GQA partials
    ([(65, 200), (3, 3)], (50, 7), 1, 1, 128),
])
def test_varlen(lengths, window, heads, kv_heads, d):
    """Sequences of odd lengths, of one row, of no query and of no key (its rows get zero
    dQ); tiles that run past their sequence into the next one's rows and keys."""
    pb = varlen_problem(np.random.default_rng(len(lengths) + d), lengths, heads, kv_heads, d,
                        window)
    check(varlen_backward(pb, window), pb["expected"])


@deep
def test_varlen_softcap():
    pb = varlen_problem(np.random.default_rng(8), [(50, 90), (70, 70)], 1, 1, 64, (20, 0),
                        softcap=1.5)
    check(varlen_backward(pb, (20, 0)), pb["expected"])


@deep
def test_varlen_deterministic_is_bit_identical():
    runs = []
    for seed in (0, 2):
        pb = varlen_problem(np.random.default_rng(6), [(150, 300), (20, 260)], 1, 1, 64,
                            (-1, 0))
        raw: dict = {}
        check(varlen_backward(pb, (-1, 0), True, seed, raw), pb["expected"])
        assert not raw["sem"].any(), f"semaphores left at {raw['sem']}"
        runs.append(raw["dqacc"])
    assert np.array_equal(*runs)
