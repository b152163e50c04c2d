"""The block-scaled grouped fp8 GEMM (ptxdsl/kernels/grouped_fp8.py) on the GPU, from its
example (fresh random data, block-quantised, magnitudes differing by up to 2^16 from K block
to K block) against numpy float64 products of the dequantised inputs, within 2^-7 |ref| +
2^-6 ||a row|| ||b row|| / sqrt(K): ragged and empty experts, tiles past an expert's last
row, ragged N and K, and in the masked layout (both epilogues) counts over the capacity and
the rows past each count left as they were (C starts at UNTOUCHED, which the reference
expects there)."""

import numpy as np
import pytest
from conftest import assert_ok

from ptxdsl.kernels import grouped_fp8 as fam
from ptxdsl.tools.runner import run_example

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("rows, n, k", [
    ([300, 0, 129, 1, 64], 1032, 528),       # ragged, an empty expert, a 1-row expert
    ([512, 512], 1024, 1024),                # whole tiles only (TMA stores)
    ([0, 0, 77], 136, 16),                   # leading empty experts, one short K block
    ([17, 250, 3, 0, 511, 128, 129], 2056, 2048),  # ragged N, many tiles a CTA
])
def test_contiguous(rows, n, k):
    ex = fam.example(np.random.default_rng(sum(rows) + n + k), rows=rows, n=n, k=k)
    assert_ok(run_example(fam.grouped_gemm_fp8, ex))


@pytest.mark.parametrize("counts, cap, n, k", [
    ([3, 0, 40, 64, 17, 1], 64, 512, 1024),   # decode: a few tokens per expert
    ([200, 5, 129], 130, 264, 528),           # counts over the capacity are cut to it
])
@pytest.mark.parametrize("variant", [{}, {"stages": 6, "tma_epilogue": False}], ids=str)
def test_masked_leaves_the_rows_past_each_count(counts, cap, n, k, variant):
    ex = fam.example(np.random.default_rng(cap + n), rows=counts, n=n, k=k, masked=True,
                     cap=cap)
    assert_ok(run_example(fam.make_grouped_fp8(masked=True, **variant), ex))
