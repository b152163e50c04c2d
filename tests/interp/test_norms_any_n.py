"""The norms family on rows of any length, in the interpreter against numpy: the masked
one-row-per-CTA form (make_norm_masked) and the two-sweep form for long rows
(make_norm_loop), for RMSNorm, LayerNorm and softmax, bf16 and f32, on fresh random data.
Small warp counts keep the rows short enough for the CPU; PTXDSL_DEEP=1 adds longer ones."""

from __future__ import annotations

import os

import numpy as np
import pytest

import ptxdsl
from ptxdsl.interp.run import run
from ptxdsl.kernels import norms

DEEP = os.environ.get("PTXDSL_DEEP") == "1"
KINDS = ("rmsnorm", "layernorm", "softmax")
DTYPES = ("bf16", "f32")
TOL = {"bf16": 2e-2, "f32": 2e-5}


def check(kd, kind: str, n: int, dtype: str, rows: int = 3, grid: int = 2, seed: int = 0,
          shift: float = 0.0) -> None:
    """Run `kd` over `rows` fresh random rows (rows > grid: a CTA takes several) and compare
    with the float64 reference; every element of y must be written."""
    elem = ptxdsl.types.SCALARS[dtype]
    rng = np.random.default_rng([seed, n])
    npd = ptxdsl.types.numpy_dtype(elem)
    x = (shift + 2 * rng.standard_normal((rows, n))).astype(npd)
    w = (1 + 0.1 * rng.standard_normal(n)).astype(npd)
    b = (0.1 * rng.standard_normal(n)).astype(npd)
    y = np.full_like(x, np.nan)
    args = {"x": x, "y": y, "rows": rows}
    if kind != "softmax":
        args["w"] = w
    if kind == "layernorm":
        args["b"] = b
    run(kd, grid, args)
    want = norms.reference(kind, x.astype(np.float64), w.astype(np.float64),
                           b.astype(np.float64), 1e-5)
    got = y.astype(np.float64)
    assert not np.isnan(got).any(), "an element was not written"
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= TOL[dtype] * max(scale, 1.0 if kind != "softmax" else scale)


MASKED = [(1, 2, None), (7, 2, None), (33, 1, None), (1000, 2, None), (1000, 1, 2), (1001, 1, 1)]
MASKED += [(2880, 4, None), (4097, 8, 1)] if DEEP else []


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, warps, vec", MASKED)
def test_masked_rows(kind, dtype, n, warps, vec):
    """Rows that are not whole vectors for every thread (and narrower loads, as a misaligned
    tensor takes): the loads past the end masked, the statistics over the true n."""
    if vec is None and n % (16 // ptxdsl.types.SCALARS[dtype].nbytes):
        vec = 1
    kd = norms.make_norm_masked(kind, n, ptxdsl.types.SCALARS[dtype], warps, vec)
    check(kd, kind, n, dtype, seed=warps)


LOOP = [(33, 1, 1, 1), (1000, 1, None, 2), (1001, 1, 1, 4)]
LOOP += [(40000, 4, None, 4), (128256 // 8 + 3, 4, 1, 4)] if DEEP else []


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, warps, vec, unroll", LOOP)
def test_long_rows_in_two_sweeps(kind, dtype, n, warps, vec, unroll):
    kd = norms.make_norm_loop(kind, n, ptxdsl.types.SCALARS[dtype], warps, vec, unroll)
    check(kd, kind, n, dtype, seed=unroll)


@pytest.mark.parametrize("make", [norms.make_norm_masked, norms.make_norm_loop])
def test_layernorm_tails_stay_accurate_far_from_zero(make):
    """Rows of 1000 + N(0, 2): the masked form reduces the mean first, the loop form shifts by
    the row's first element, so neither loses the variance to cancellation."""
    check(make("layernorm", 999, ptxdsl.f32, 1, 1), "layernorm", 999, "f32", shift=1000.0)


def test_softmax_of_a_row_with_minus_infinity():
    """-inf inputs (a causal mask) give 0, as the masked lanes do, in both forms."""
    n = 100
    x = np.random.default_rng(3).standard_normal((2, n)).astype(np.float32)
    x[:, ::3] = -np.inf
    want = norms.reference("softmax", x)
    for kd in (norms.make_norm_masked("softmax", n, ptxdsl.f32, 2, 1),
               norms.make_norm_loop("softmax", n, ptxdsl.f32, 1, 2, 1)):
        y = np.full_like(x, np.nan)
        run(kd, 1, {"x": x, "y": y, "rows": 2})
        assert np.abs(y - want).max() < 1e-6


def test_short_rows_need_whole_loads():
    with pytest.raises(AssertionError, match="multiple of the elements a load takes"):
        norms.make_norm_masked("rmsnorm", 1001, ptxdsl.bf16, 2, 2)
