"""The block-scaled grouped fp8 GEMM (ptxdsl/kernels/grouped_fp8.py) in the interpreter
against numpy float64 products of the dequantised inputs: scales that differ block to block
by up to 2^16 (a scale applied to another block, row or expert fails), ragged M, N and K,
experts with no rows, and in the masked layout counts over the capacity and rows past a
count left untouched, bit for bit; and ptxas on its builds (no spills)."""

import numpy as np
import pytest
from conftest import assemble, assert_no_spills
from fuzzing import DEEP

from ptxdsl import bf16
from ptxdsl.interp import run_sample
from ptxdsl.kernels import grouped_fp8 as fam
from ptxdsl.runtime.dtypes import f32_to_bf16
from ptxdsl.tools.runner import compare

deep = pytest.mark.skipif(not DEEP, reason="seconds in the interpreter: PTXDSL_DEEP=1 (CI)")


def check(kd, ex: dict, seed: int = 0) -> np.ndarray:
    """Run `kd` on the example, compare C with the reference, return C's bits."""
    out = run_sample(kd.ir, {"kernel": kd.name, **ex}, seed=seed)
    r = compare("cp", out["cp"], ex["expected"]["cp"], bf16, ex["rtol"], ex["atol"])
    assert r.ok, r.detail
    return np.asarray(out["cp"]).view(np.uint16).reshape(ex["expected"]["cp"].shape)


def untouched(c_bits: np.ndarray, starts: list[int], used: list[int]) -> None:
    """Every row no expert owns still holds UNTOUCHED's bits."""
    owned = np.zeros(c_bits.shape[0], bool)
    for s0, u in zip(starts, used, strict=True):
        owned[s0:s0 + u] = True
    sentinel = f32_to_bf16(np.array([fam.UNTOUCHED], np.float32))[0]
    assert (c_bits[~owned] == sentinel).all(), "a row no expert owns was written"


def test_contiguous_ragged_with_an_empty_expert():
    """N = 72 (a partial tile and scale block), K = 144 (a second K block of 16), an empty
    expert between two ragged ones."""
    ex = fam.example(np.random.default_rng(1), rows=[3, 0, 20], n=72, k=144)
    check(fam.grouped_gemm_fp8, ex)


def test_masked_counts_over_the_capacity_and_untouched_rows():
    """Counts 25, 0, 3, 40 at a capacity of 32: the last is cut to 32, and the rows past each
    count keep what C held."""
    counts, cap = [25, 0, 3, 40], 32
    ex = fam.example(np.random.default_rng(2), rows=counts, n=64, k=128, masked=True, cap=cap)
    bits = check(fam.make_grouped_fp8(masked=True), ex)
    untouched(bits, [g * cap for g in range(len(counts))], [min(x, cap) for x in counts])


@deep
@pytest.mark.parametrize("grid", [None, 2])
def test_contiguous_tma_and_register_tiles(grid):
    """A whole 128-row tile (TMA stores) and tiles past an expert's end (registers), two
    tile-columns, the second partial; grid 2: each CTA walks several experts' tiles."""
    ex = fam.example(np.random.default_rng(3), **fam.SMALL, grid=grid)
    check(fam.grouped_gemm_fp8, ex, seed=1)


@deep
def test_masked_register_epilogue_and_six_stages():
    counts, cap = [130, 7, 0], 136
    ex = fam.example(np.random.default_rng(4), rows=counts, n=136, k=400, masked=True,
                     cap=cap)
    bits = check(fam.make_grouped_fp8(masked=True, stages=6, tma_epilogue=False), ex)
    untouched(bits, [g * cap for g in range(len(counts))], counts)


@pytest.mark.parametrize("kw", [{}, pytest.param({"masked": True, "stages": 6,
                                                  "tma_epilogue": False}, marks=deep)], ids=str)
def test_ptxas_assembles_without_spills(tmp_path, kw):
    assert_no_spills(assemble(fam.make_grouped_fp8(**kw).ptx("sm_90a"), tmp_path))
