"""The split-KV decode attention family (ptxdsl/kernels/decode_attention.py) in the interpreter
against numpy: uneven lengths with 0 and 1, a page boundary inside a 128-key block, splits
that do not divide the blocks, GQA 4:1, several new tokens with the causal mask, more rows than
one tile; the cache past each length holds NaN (an unwritten page), so a kernel that lets it
into O fails. The combine is bit-identical whichever split finishes last, the semaphores end
at zero, and every build assembles. More cases with PTXDSL_DEEP=1."""

import numpy as np
import pytest
from conftest import assemble, assert_no_spills
from fuzzing import DEEP

from ptxdsl.interp import run_sample
from ptxdsl.kernels import decode_attention as da
from ptxdsl.tools.runner import compare

# example() keyword sets: fast ones first
FAST = [
    # contiguous, lengths 0, 1 and one past a block, split in 3 ranges of 2 blocks; 4 CTAs
    # walk the 9 items
    dict(batch=3, lens=(0, 1, 257), capacity=384, splits=3, heads=4, kv_heads=1, grid=4),
]
SLOW = [
    # pages of 16 (8 copies a block, the length inside a page), GQA 4:1 with 2 KV heads,
    # 2 new tokens causal, splits that do not divide the 3 blocks; a CTA an item
    dict(batch=2, lens=(2, 300), capacity=384, splits=2, page_size=16, seq=2, heads=8,
         kv_heads=2),
    dict(batch=2, lens=(77, 300), capacity=512, splits=3, page_size=256, d=128, seq=16,
         heads=8, kv_heads=1, grid=5),  # 128 rows: two row tiles; a page holds 2 blocks
    dict(batch=3, lens=(1, 130, 300), capacity=512, splits=2, page_size=64, causal=False,
         grid=1),  # one CTA walks every item
    dict(batch=2, lens=(5, 700), capacity=768, splits=5, page_size=32, seq=3, heads=4,
         kv_heads=2, d=128),  # 6 blocks in ranges of 2: 3 of the 5 splits idle
    dict(batch=1, lens=(3,), capacity=128, splits=1, seq=4, heads=2, kv_heads=1),  # n < S
    dict(batch=2, lens=(-4, 1000), capacity=512, splits=4),  # clamped to 0 and to 512
]


def run(seed=0, **kw):
    kd = da.make_decode_attention(d=kw.get("d", 64), box=da.box_for(kw.get("page_size")),
                                  stages=2)
    ex = da.example(np.random.default_rng(sum(kw.get("lens", ()))), **kw)
    out = run_sample(kd.ir, {"kernel": kd.name, **ex}, seed=seed)
    types = {p.name: getattr(p.type, "elem", None) for p in kd.ir.params}
    for param, want in ex["expected"].items():
        r = compare(param, out[param], want, types[param], ex["rtol"], ex["atol"])
        assert r.ok, f"{param}: {r.detail}"
    return out["o"]


# FAST runs (against numpy too) in the combine test below, at two seeds
@pytest.mark.parametrize("case", FAST + SLOW if DEEP else [], ids=repr)
def test_decode_attention_matches_numpy(case):
    run(**case)


@pytest.mark.parametrize("seeds", [(0, 1)] + ([(2, 3)] if DEEP else []))
def test_combine_is_the_same_whichever_split_is_last(seeds):
    """Two interleavings of the CTAs: another split completes the count, and O is the same
    bit for bit (the slots are summed in slot order)."""
    case = dict(batch=1, lens=(200,), capacity=256, splits=2)  # a CTA a split
    first, second = (run(seed=s, **case) for s in seeds)
    assert np.array_equal(first, second)


def test_reference_handles_what_the_kernel_must():
    """The numpy reference itself: a row that sees no key is zero, and causal new token t of
    a length-n sequence sees keys up to n - S + t."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 2, 1, 4))
    k = rng.standard_normal((1, 8, 1, 4))
    v = rng.standard_normal((1, 8, 1, 4))
    o = da.reference(q, k, v, np.array([1]), True, 0.5)
    assert np.all(o[0, 0] == 0) and np.allclose(o[0, 1, 0], v[0, 0, 0])
    o3 = da.reference(q, k, v, np.array([3]), True, 0.5)
    s = k[0, :2, 0] @ q[0, 0, 0] * 0.5
    w = np.exp(s - s.max())
    assert np.allclose(o3[0, 0, 0], w @ v[0, :2, 0] / w.sum())


@pytest.mark.parametrize("bad, words", [({"d": 96}, "head dim is 64 or 128, not 96"),
                                        ({"box": 8}, "box is 16, 32, 64 or 128 keys, not 8")])
def test_bad_configurations_are_named(bad, words):
    with pytest.raises(ValueError, match=words):
        da.make_decode_attention(**bad)


def test_splits_fill_the_sms_once():
    """One sequence of 128k keys, 8 KV heads: 16 splits each (128 CTAs, one wave); 64
    sequences x 8 heads fill the SMs unsplit; a short cache is not cut below MIN_BLOCKS
    blocks a split."""
    assert da.pick_splits(1, 8, 1, 131072) == 16
    assert da.pick_splits(64, 8, 1, 4096) == 1
    assert da.pick_splits(1, 8, 1, 1024) == 2
    assert da.pick_splits(16, 8, 1, 8192) == 1
    assert da.workspace(1, 8, 1, 16, 128) == (8 * 16 * 64 * 130, 8)
    assert da.workspace(64, 8, 1, 1, 128) == (1, 512)
    assert da.launch_grid(1, 8, 1, 16) == 128 and da.launch_grid(64, 8, 1, 1) == 132
    assert da.row_tiles(16, 8) == 2 and da.row_tiles(1, 4) == 1
    assert [da.box_for(p) for p in (None, 16, 64, 128, 256)] == [128, 16, 64, 128, 128]


@pytest.mark.ptxas
@pytest.mark.parametrize("d, box", [(128, 128)] +
                         ([(128, 16)] + [(64, b) for b in da.BOXES] if DEEP else []))
def test_builds_fit_and_assemble_without_spills(d, box, tmp_path):
    kd = da.make_decode_attention(d=d, box=box)
    assert kd.program().kernels[0].smem_bytes <= 232448
    assert_no_spills(assemble(kd.ptx(), tmp_path))
