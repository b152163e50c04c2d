"""The decode GEMM's fused epilogues (gemm_smallm's `epilogue`: "residual" and "silu_mul") in
the interpreter against numpy: split K, where only the range that completes a tile's count
stores (R added once, not once a range), N ragged over the weight tiles, two m64 blocks a
warpgroup, M over several activation tiles. More shapes and ptxas with PTXDSL_DEEP=1."""

import numpy as np
import pytest
from conftest import assemble, assert_no_spills
from fuzzing import DEEP

from ptxdsl.interp import run_sample
from ptxdsl.kernels import gemm_smallm
from ptxdsl.tools.runner import compare

# (m, n, k, splits, mp, bw, epilogue, cols / cluster); n is the weight's rows (silu_mul: 2 F,
# C of F)
FAST = [(5, 72, 192, 3, 8, 64, "residual", {}),  # 3 K steps, one a range: R added once
        (5, 144, 192, 3, 8, 64, "silu_mul", {})]  # N ragged: the last tile holds 16 rows of 64
SLOW = [(3, 272, 128, 1, 8, 128, "silu_mul", {}),  # whole tiles: from the accumulators
        (20, 200, 1000, 3, 8, 128, "residual", {}),  # M over three tiles of 8; N ragged
        (13, 400, 1000, 4, 16, 256, "silu_mul", {}),  # two m64 blocks a warpgroup
        (5, 200, 320, 3, 8, 256, "residual", {}),
        (33, 176, 520, 5, 64, 64, "silu_mul", {}),  # 9 K steps in 5 ranges, three tiles
        # the decode tuner's wide configs: warpgroups side by side (their half of the
        # activation tile each), cluster pairs (an odd weight-tile count: a pair's second
        # stores nothing)
        (37, 144, 320, 2, 64, 64, "silu_mul", {"cols": 2}),
        (37, 200, 320, 2, 64, 64, "residual", {"cols": 2}),
        (21, 208, 256, 2, 32, 64, "residual", {"cluster": 2}),
        (21, 208, 256, 2, 32, 64, "silu_mul", {"cluster": 2})]


@pytest.mark.parametrize("m, n, k, splits, mp, bw, epilogue, wide",
                         FAST + (SLOW if DEEP else []))
def test_fused_epilogue_matches_numpy(m, n, k, splits, mp, bw, epilogue, wide):
    kd = gemm_smallm.make_smallm(mp=mp, bw=bw, stages=3, epilogue=epilogue, **wide)
    ex = gemm_smallm.example(np.random.default_rng(m + n + k), m=m, n=n, k=k, splits=splits,
                             mp=mp, bw=bw, epilogue=epilogue, **wide)
    out = run_sample(kd.ir, {"kernel": kd.name, **ex})
    types = {p.name: getattr(p.type, "elem", None) for p in kd.ir.params}
    assert out["c"].shape == ((m, n // 2) if epilogue == "silu_mul" else (m, n))
    for param, want in ex["expected"].items():
        r = compare(param, out[param], want, types[param], ex["rtol"], ex["atol"])
        assert r.ok, f"{param}: {r.detail}"


def test_gate_and_up_rows_interleave_in_groups():
    """Row 16 q + t of the interleaved weight is gate row 8 q + t, row 16 q + 8 + t up row
    8 q + t (F = 16: the gate rows 0-15, the up rows 16-31)."""
    w = np.arange(32)[:, None] * np.ones((1, 3), np.int64)
    got = gemm_smallm.interleave_gate_up(w)[:, 0]
    want = [*range(0, 8), *range(16, 24), *range(8, 16), *range(24, 32)]
    assert got.tolist() == want
    with pytest.raises(ValueError, match="multiple of 16, got 40"):
        gemm_smallm.interleave_gate_up(np.zeros((40, 3)))


@pytest.mark.parametrize("bad, words", [({"epilogue": "gelu"}, "got 'gelu'"),
                                        ({"epilogue": "residual", "dtype": gemm_smallm.e4m3,
                                          "scales": "tensor"}, "with bf16; got 'residual'")])
def test_bad_epilogues_are_named(bad, words):
    with pytest.raises(ValueError, match=words):
        gemm_smallm.make_smallm(**bad)


@pytest.mark.skipif(not DEEP, reason="ptxas of the tallest fused builds: PTXDSL_DEEP=1")
@pytest.mark.parametrize("epilogue", gemm_smallm.EPILOGUES)
@pytest.mark.parametrize("mp, bw", [(256, 128), (256, 64), (128, 256)])
def test_fused_builds_assemble_without_spills(mp, bw, epilogue, tmp_path):
    kd = gemm_smallm.make_smallm(mp=mp, bw=bw, epilogue=epilogue)
    assert_no_spills(assemble(kd.ptx("sm_90a"), tmp_path))
