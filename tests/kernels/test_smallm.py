"""The small-M (decode) GEMM family (ptxdsl/kernels/gemm_smallm.py) in the interpreter
against numpy: odd M, N off the weight tile, K off the 64-wide step and split into ranges
that do not divide it, an M past one activation tile; the slot sum is bit-identical whichever
range finishes last (the interpreter's seed changes the order CTAs run in), and the
semaphores end at zero. The e4m3 form likewise, with per-tensor and per-row scales, against
the dequantised product (ml_dtypes' float8_e4m3fn in numpy). More shapes with PTXDSL_DEEP=1."""

import numpy as np
import pytest
from conftest import assemble, assert_no_spills
from fuzzing import DEEP

import ptxdsl
from ptxdsl import bf16, e4m3
from ptxdsl.interp import run_sample
from ptxdsl.kernels import gemm_smallm
from ptxdsl.tools.runner import compare

# (m, n, k, splits, mp, bw): fast ones first
# (5, 72, 320, 3, 8, 64): K steps 5 in ranges 2, 2, 1, N < one weight tile: the split-sum
# test's case, checked against numpy there at two seeds
FAST = [(1, 72, 128, 1, 8, 128),  # whole tiles: C straight from the accumulators
        (5, 72, 128, 4, 8, 64)]  # 4 ranges asked of 2 K steps: 2 slots a tile, two tiles
SLOW = [(33, 136, 520, 5, 64, 64),  # 9 K steps in 5 ranges; N ragged over three tiles
        (13, 200, 1000, 4, 16, 128), (20, 200, 1000, 3, 8, 128),  # M over three tiles of 8
        (3, 264, 64, 4, 8, 64),  # one K step: one range however many are asked for
        (5, 200, 320, 3, 8, 256), (13, 264, 1000, 4, 16, 256),  # two m64 blocks a warpgroup
        (100, 64, 456, 2, 128, 128)]
# e4m3, (m, n, k, splits, mp, bw, scales): K steps of 128, each summed into a temporary and
# added into f32 (ranges of an odd and an even count of steps end the loop differently)
FAST_FP8 = [(7, 72, 1168, 3, 8, 64, "tensor")]  # 10 K steps in ranges of 4, 3, 3: pairs
SLOW_FP8 = [(5, 136, 528, 3, 8, 128, "row"),  # 5 K steps, the last short, in 2, 2, 1; N
            # ragged; two 64-row warpgroups
            (5, 72, 528, 3, 8, 64, "tensor"),  # the same in one warpgroup, per-tensor scales
            (13, 72, 256, 1, 16, 64, "row"),  # whole tiles: C straight from the accumulators
            (3, 200, 784, 1, 8, 128, "tensor"),  # whole tiles of 7 K steps: three pairs
            (33, 136, 1040, 5, 64, 64, "row"),  # 9 K steps in 5 ranges; three weight tiles
            (20, 200, 1008, 3, 8, 128, "tensor"),  # M over three tiles of 8
            (3, 264, 128, 4, 8, 64, "row"),  # one K step: one range
            (5, 200, 640, 3, 8, 256, "row"),  # two m64 blocks a warpgroup
            (13, 264, 1008, 4, 16, 256, "tensor"), (100, 64, 464, 2, 128, 128, "tensor"),
            (150, 72, 656, 2, 128, 64, "row")]  # M over two tiles of 128
# two warpgroups side by side over the activation tile (cols 2: M 129 to 256 in one tile)
# and 2-CTA cluster pairs sharing it (cluster 2): (m, n, k, splits, mp, bw, dtype, scales,
# cols, cluster, grid: None for a CTA per work item)
FAST_WIDE = [(131, 16, 256, 2, 256, 64, e4m3, "tensor", 2, 1, 1),  # 2 K steps in 2 ranges,
             # which one CTA walks in turn (as with two waves): its ring runs on into the next
             (5, 72, 128, 2, 16, 64, bf16, None, 1, 2, 2)]  # a pair walking both ranges
SLOW_WIDE = [(129, 8, 128, 2, 256, 64, bf16, None, 2, 1, None),
             (133, 72, 320, 3, 256, 64, bf16, None, 2, 1, None),  # 5 K steps in 2, 2, 1
             (17, 72, 320, 3, 32, 64, bf16, None, 2, 1, None),  # 16 rows a warpgroup
             (133, 136, 656, 3, 256, 128, bf16, None, 2, 1, None),  # four warpgroups
             (101, 264, 328, 2, 128, 256, bf16, None, 2, 1, None),  # four, two m64 blocks each
             (201, 72, 1040, 3, 256, 64, e4m3, "row", 2, 1, None),  # 9 K steps in 3, 3, 3
             (255, 200, 784, 1, 256, 64, e4m3, "tensor", 2, 1, None),  # whole tiles, 7 steps
             (133, 136, 656, 3, 256, 128, bf16, None, 2, 1, 2),  # 6 items on 2 CTAs
             (5, 136, 320, 3, 16, 64, bf16, None, 1, 2, None),  # 3 weight tiles: the second
             # pair's second tile past N
             (133, 72, 320, 3, 256, 64, bf16, None, 2, 2, None),  # side by side, in pairs
             (131, 16, 256, 2, 256, 64, e4m3, "tensor", 2, 2, 2),
             (33, 136, 656, 3, 64, 64, e4m3, "row", 1, 2, 2),  # 6 items on one pair
             (20, 264, 1000, 2, 32, 128, bf16, None, 1, 2, 4),
             (101, 264, 328, 2, 128, 256, bf16, None, 2, 2, None)]


def run(m, n, k, splits, mp, bw, seed=0, dtype=bf16, scales=None, cols=1, cluster=1,
        grid=None) -> np.ndarray:
    kd = gemm_smallm.make_smallm(mp=mp, bw=bw, stages=3, dtype=dtype, scales=scales, cols=cols,
                                 cluster=cluster)
    ex = gemm_smallm.example(np.random.default_rng(m + n + k), m=m, n=n, k=k, splits=splits,
                             mp=mp, bw=bw, dtype=dtype, scales=scales, cols=cols,
                             cluster=cluster, grid=grid)
    out = run_sample(kd.ir, {"kernel": kd.name, **ex}, seed=seed)
    types = {p.name: getattr(p.type, "elem", None) for p in kd.ir.params}
    for param, want in ex["expected"].items():
        r = compare(param, out[param], want, types[param], ex["rtol"], ex["atol"])
        assert r.ok, f"{param}: {r.detail}"
    return out["c"]


@pytest.mark.parametrize("m, n, k, splits, mp, bw", FAST + (SLOW if DEEP else []))
def test_smallm_matches_numpy(m, n, k, splits, mp, bw):
    run(m, n, k, splits, mp, bw)


@pytest.mark.parametrize("m, n, k, splits, mp, bw, scales", FAST_FP8 + (SLOW_FP8 if DEEP else []))
def test_smallm_fp8_matches_numpy(m, n, k, splits, mp, bw, scales):
    run(m, n, k, splits, mp, bw, dtype=e4m3, scales=scales)


@pytest.mark.parametrize("m, n, k, splits, mp, bw, dtype, scales, cols, cluster, grid",
                         FAST_WIDE + (SLOW_WIDE if DEEP else []))
def test_smallm_side_by_side_and_pairs_match_numpy(m, n, k, splits, mp, bw, dtype, scales,
                                                   cols, cluster, grid):
    run(m, n, k, splits, mp, bw, dtype=dtype, scales=scales, cols=cols, cluster=cluster,
        grid=grid)


@pytest.mark.parametrize("seeds, cols, cluster", [((0, 1), 1, 1)] + (
    [((2, 3), 1, 1), ((0, 1), 2, 1), ((0, 1), 1, 2)] if DEEP else []))
def test_split_sum_is_the_same_whichever_range_is_last(seeds, cols, cluster):
    """Two interleavings of the CTAs: another range completes each tile's count, and C
    is the same bit for bit (the sum is in slot order, not arrival order)."""
    m, mp = (5, 8 * cluster) if cols == 1 else (133, 256)
    first, second = (run(m, 72, 320, 3, mp, 64, seed=s, cols=cols, cluster=cluster)
                     for s in seeds)
    assert np.array_equal(first, second)


@pytest.mark.parametrize("bad, words", [({"mp": 12}, "mp is a multiple of 8"),
                                        ({"mp": 264}, "from 8 to 256, got 264"),
                                        ({"bw": 96}, "bw is 64, 128 or 256, got 96"),
                                        ({"bw": 256, "mp": 136}, "for mp up to 128"),
                                        ({"dtype": e4m3}, "e4m3 takes scales"),
                                        ({"dtype": e4m3, "scales": "block"}, "'block'"),
                                        ({"scales": "row"}, "bf16 none"),
                                        ({"dtype": ptxdsl.f16}, "bf16 or e4m3, got f16"),
                                        ({"dtype": e4m3, "scales": "tensor", "mp": 256},
                                         "e4m3 kernel with bw 128, .* up to 128, got mp 256"),
                                        ({"dtype": e4m3, "scales": "row", "mp": 128,
                                          "bw": 256}, "for mp up to 64, got mp 128"),
                                        ({"cols": 3}, "cols is 1 or 2"),
                                        ({"cols": 2, "mp": 8}, "cols 2 with mp 8"),
                                        ({"cols": 2, "dtype": e4m3, "scales": "row"},
                                         "takes bw 64"),
                                        ({"cols": 2, "bw": 256, "mp": 256},
                                         "cols 2 .* up to 128, got mp 256"),
                                        ({"cluster": 2, "mp": 8}, "cluster 2 with mp 8"),
                                        ({"cluster": 2, "mp": 24, "bw": 64},
                                         "cluster 2 with mp 24"),
                                        ({"cluster": 4}, "cluster is 1, or 2"),
                                        ({"cluster": 2, "mp": 256},
                                         "cluster 2 .* up to 128, got mp 256")])
def test_bad_configurations_are_named(bad, words):
    with pytest.raises(ValueError, match=words):
        gemm_smallm.make_smallm(**bad)


@pytest.mark.parametrize("m, mp", [(1, 8), (8, 8), (9, 16), (64, 64), (65, 128), (256, 256),
                                   (300, 256)])
def test_activation_tile_holds_m(m, mp):
    assert gemm_smallm.pad_m(m) == mp


@pytest.mark.parametrize("m, mp", [(1, 8), (100, 128), (129, 128), (256, 128)])
def test_e4m3_activation_tiles_stop_at_128_rows(m, mp):
    """e4m3 keeps two temporaries beside its accumulator: past 128 rows, M takes two tiles,
    or one of two warpgroups side by side (64-row weight tiles only: four warpgroups have
    no registers for the temporaries)."""
    assert gemm_smallm.pad_m(m, gemm_smallm.max_mp(64, e4m3)) == mp
    assert gemm_smallm.max_mp(128, e4m3) == 128 and gemm_smallm.max_mp(256, e4m3) == 64
    assert gemm_smallm.max_mp(64, e4m3, cols=2) == 256
    assert gemm_smallm.max_mp(128, e4m3, cols=2) == 0


def test_four_warpgroups_share_the_register_file():
    """Two consumer warpgroups get the 232 registers of the one-producer layout; four get
    what 640 threads' launch registers (96 each) leave beside the producer's 40."""
    assert gemm_smallm.consumer_regs_for(1) == gemm_smallm.consumer_regs_for(2) == 232
    assert gemm_smallm.consumer_regs_for(4) == 104
    assert 128 * 40 + 512 * 104 <= 640 * 96
    assert gemm_smallm.max_mp(128, bf16, cols=2) == 256
    assert gemm_smallm.max_mp(256, bf16, cols=2) == 128


def test_splits_fill_the_sms_once():
    """4096 x 4096 weights in 128-row tiles: 32 tiles, 4 ranges of 16 K steps each (bf16); a
    weight with more tiles than SMs is not split; a short K is not cut below MIN_KSTEPS."""
    assert gemm_smallm.pick_splits(1, 4096, 4096, 128, 8) == 4
    assert gemm_smallm.launch_grid(1, 4096, 4096, 128, 8, 4) == 128
    assert gemm_smallm.pick_splits(64, 28672, 4096, 128, 64) == 1
    assert gemm_smallm.pick_splits(1, 4096, 512, 128, 8) == 2
    assert gemm_smallm.workspace(1, 4096, 4096, 128, 8, 4) == (32 * 4 * 128 * 8, 64)
    assert gemm_smallm.workspace(1, 4096, 4096, 256, 8, 4) == (16 * 4 * 256 * 8, 32)
    assert gemm_smallm.workspace(64, 28672, 4096, 128, 64, 1) == (1, 448)
    # a semaphore per consumer warpgroup: four with 128-row tiles and two side by side
    assert gemm_smallm.workspace(256, 4096, 4096, 128, 256, 1, cols=2) == (1, 128)
    assert gemm_smallm.workspace(256, 4096, 4096, 64, 256, 2, cols=2) == (
        64 * 2 * 64 * 256, 128)
    # fp8: K steps of 128, half as many: 4 ranges of 8 at 4096 x 4096; K 512 (4 steps) is
    # not split; at K 256, 2 ranges however many are asked for
    bk = gemm_smallm.BK_FP8
    assert gemm_smallm.pick_splits(1, 4096, 4096, 128, 8, bk=bk) == 4
    assert gemm_smallm.pick_splits(1, 4096, 512, 128, 8, bk=bk) == 1
    assert gemm_smallm.workspace(1, 4096, 256, 128, 8, 4, bk) == (32 * 2 * 128 * 8, 64)
    assert gemm_smallm.launch_grid(1, 4096, 256, 128, 8, 4, bk=bk) == 64
    # two waves: twice the ranges (8 of 8 K steps at 64 x 4096 x 4096), 132 CTAs walking
    # them; 7168 x 8192 in 56 tiles of 128 x 128: 4 ranges, not 2
    assert gemm_smallm.pick_splits(64, 4096, 4096, 128, 64, waves=2) == 8
    assert gemm_smallm.launch_grid(64, 4096, 4096, 128, 64, 8) == 132
    assert gemm_smallm.pick_splits(128, 7168, 8192, 128, 128) == 2
    assert gemm_smallm.pick_splits(128, 7168, 8192, 128, 128, waves=2) == 4
    # cluster pairs: whole pairs of weight tiles (3 tiles of 64 rows: 2 pairs, the last
    # one's second past N), a pair of CTAs an item, whole pairs in the grid
    assert gemm_smallm.tiles_of(5, 136, 64, 16, cluster=2) == 4
    assert gemm_smallm.workspace(5, 136, 320, 64, 16, 3, cluster=2) == (4 * 3 * 64 * 16, 4)
    assert gemm_smallm.launch_grid(5, 136, 320, 64, 16, 3, cluster=2) == 12
    assert gemm_smallm.pick_splits(128, 7168, 8192, 128, 128, cluster=2) == 2
    assert gemm_smallm.launch_grid(128, 7168, 8192, 128, 128, 2, cluster=2) == 112
    assert gemm_smallm.launch_grid(128, 7168, 8192, 128, 128, 4, sms=120, cluster=2) == 120


def test_every_activation_tile_builds_and_fits():
    """Each activation-tile height the gemm op may ask for (pad_m of M = 1 .. 256; the
    tallest only, without PTXDSL_DEEP) with each weight tile its registers allow builds, its
    ring within a CTA's shared memory; with PTXDSL_DEEP, the e4m3 builds too (their stages
    hold as many bytes)."""
    mps = sorted({gemm_smallm.pad_m(m) for m in range(1, 257)})
    kinds = ((bf16, None), (e4m3, "tensor"), (e4m3, "row")) if DEEP else ((bf16, None),)
    for mp in mps if DEEP else mps[-1:]:
        for dtype, scales in kinds:
            for bw in (64, 128, 256):
                if mp <= gemm_smallm.max_mp(bw, dtype):
                    kd = gemm_smallm.make_smallm(mp=mp, bw=bw, dtype=dtype, scales=scales)
                    assert kd.program().kernels[0].smem_bytes <= 232448


def wide_builds() -> list[tuple]:
    """Every wide build the decode tuner can pick (ptxdsl.torch.kernels: from 64 rows on, the
    tile of a bucket its registers hold, mp or half of it), bf16 with each fused epilogue and
    e4m3 in both scale modes: a shorter tile is no safer (its slot sum unrolls further)."""
    out = set()
    for bucket in (64, 128, 256):
        for bw in (64, 128, 256):
            for cols, cluster in ((2, 1), (1, 2), (2, 2)):
                for dtype, scales, epilogues in ((bf16, None, (None, "residual", "silu_mul")),
                                                 (e4m3, "tensor", (None,)),
                                                 (e4m3, "row", (None,))):
                    mp = min(bucket, gemm_smallm.max_mp(bw, dtype, cols, cluster))
                    if 2 * mp >= bucket and mp >= 8 * cluster:
                        out |= {(mp, bw, dtype, scales, cols, cluster, e) for e in epilogues}
    return sorted(out, key=str)


@pytest.mark.skipif(not DEEP, reason="seconds of ptxas: PTXDSL_DEEP=1 (CI) runs it")
@pytest.mark.parametrize("mp, bw, dtype, scales, cols, cluster, epilogue",
                         wide_builds() if DEEP else [])
def test_wide_builds_assemble_without_spills(mp, bw, dtype, scales, cols, cluster, epilogue,
                                             tmp_path):
    """Side by side and in pairs, every tile the tuner offers fits the registers: ptxas spills
    nothing (e4m3's accumulators, temporaries and row scales at 232; the four-warpgroup bf16
    builds at 104, their slot sums one slot at a time; a pair's bf16 at 64 f32 of
    accumulators) and keeps the wgmmas pipelined."""
    kd = gemm_smallm.make_smallm(mp=mp, bw=bw, dtype=dtype, scales=scales, cols=cols,
                                 cluster=cluster, epilogue=epilogue)
    assert kd.program().kernels[0].smem_bytes <= 232448
    log = assemble(kd.ptx("sm_90a"), tmp_path)
    assert_no_spills(log)
    assert "C7514" not in log, "ptxas serialises the wgmmas"


@pytest.mark.parametrize("mp, bw, scales", [(128, 64, "row")] + (
    [(mp, bw, s) for mp in (8, 16, 32, 64, 128) for bw in (64, 128, 256)
     for s in ("tensor", "row") if mp <= gemm_smallm.max_mp(bw, e4m3)] if DEEP else []))
def test_e4m3_builds_assemble_without_spills(mp, bw, scales, tmp_path):
    """The accumulator and its two temporaries fit the consumers' registers: ptxas spills
    nothing (the first case holds the most: 3 x 64 f32 and the row scales), and keeps the
    two-level loop's wgmmas pipelined (no C7514: promoted_loop says why)."""
    kd = gemm_smallm.make_smallm(mp=mp, bw=bw, dtype=e4m3, scales=scales)
    log = assemble(kd.ptx("sm_90a"), tmp_path)
    assert_no_spills(log)
    assert "C7514" not in log, "ptxas serialises the wgmmas"
