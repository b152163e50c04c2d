"""The KV-cache append family (ptxdsl/kernels/kv_append.py) in the interpreter against numpy,
bit for bit: paged and contiguous caches, 1 and 5 new tokens, uneven lengths (negative, 0, 1,
past the capacity), a page boundary inside a sequence's new tokens, table entries outside the
cache, new K / V as views of wider rows, fewer CTAs than rows; and every build assembles."""

import numpy as np
import pytest
from conftest import assemble, assert_no_spills

from ptxdsl.interp import run_sample
from ptxdsl.kernels import kv_append as ka
from ptxdsl.tools.runner import compare

CASES = [
    dict(),  # pages of 8, 5 new tokens: sequence 1 crosses a page, sequence 2 the capacity
    dict(page_size=None, seq=1, lens=(0, 1, 32)),  # contiguous: -1 skipped, 0 and 31 written
    dict(seq=2, lens=(-3, 4, 20), bad_pages=True),  # a negative length; pages outside
    dict(page_size=16, seq=3, lens=(3, 17, 40), wide=3, grid=2, d=128, kv_heads=1),
    dict(page_size=None, seq=5, lens=(7, 32, 33), wide=1, kv_heads=3, capacity=40, d=16),
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_append_matches_numpy(case):
    kd = ka.make_kv_append(d=case.get("d", 64))
    ex = ka.example(np.random.default_rng(len(repr(case))), **case)
    out = run_sample(kd.ir, ex)
    for param, want in ex["expected"].items():
        before = ex["inputs"][param]
        assert not np.array_equal(want, before), "the case writes nothing"
        r = compare(param, out[param], want, None, 0.0, 0.0)
        assert r.ok, f"{param}: {r.detail}"


def test_reference_skips_what_the_kernel_must():
    """The numpy reference itself: positions below 0 and at the capacity are skipped, and a
    page outside the cache is skipped."""
    new = np.arange(1, 7).reshape(2, 3, 1, 1)
    cache = np.zeros((2, 4, 1, 1), np.int64)
    out = ka.reference(new, cache, np.array([2, 5]), None)
    assert out[0, :, 0, 0].tolist() == [2, 3, 0, 0]  # token 0 at -1: skipped
    assert out[1, :, 0, 0].tolist() == [0, 0, 4, 5]  # token 2 at 4 = the capacity: skipped
    pages = np.zeros((3, 2, 1, 1), np.int64)
    out = ka.reference(new, pages, np.array([3, 4]), np.array([[2, 0], [9, 1]]))
    assert out[2, :, 0, 0].tolist() == [1, 2] and out[0, 0, 0, 0] == 3
    assert out[1, :, 0, 0].tolist() == [5, 6]  # sequence 1's page 9 is outside: token 0 lost


@pytest.mark.parametrize("d", [4, 12, 520])
def test_bad_head_dims_are_named(d):
    with pytest.raises(ValueError, match=f"multiple of 8 from 8 to 512, not {d}"):
        ka.make_kv_append(d=d)


@pytest.mark.ptxas
@pytest.mark.parametrize("d", [64, 128])
def test_builds_assemble_without_spills(d, tmp_path):
    assert_no_spills(assemble(ka.make_kv_append(d=d).ptx(), tmp_path))
