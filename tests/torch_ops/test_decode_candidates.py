"""The decode GEMM's tuning candidates per bucket of M (ptxdsl/torch/kernels.py): the plain
weight tiles everywhere; from 64 rows on, two warpgroups side by side over the activation
tile, cluster pairs and two waves of split-K ranges too; a config whose registers hold half
the bucket takes two activation tiles, one that holds less is no candidate; from 128 rows on
the dense GEMM's configs and its deterministic split-K (the two-kernel form) as well, fused
epilogues' tunings too. No GPU: which configs, which tiles, which builds, how many ranges."""

import pytest


@pytest.mark.parametrize("mp", [8, 16, 32])
def test_below_64_rows_only_the_plain_weight_tiles(torch, mp):
    from ptxdsl import bf16, e4m3
    from ptxdsl.torch.kernels import smallm_configs

    for dtype in (bf16, e4m3):
        assert smallm_configs(mp, dtype) == ({"bw": 128}, {"bw": 64}, {"bw": 256})


def test_bf16_at_256_rows(torch):
    """Every config is a candidate; bw 256's registers hold 128 rows (two tiles), with four
    warpgroups as with two, and so do a pair's of bw 128 with one warpgroup a 64 rows."""
    from ptxdsl.torch.kernels import SMALLM_CONFIGS, smallm_configs, smallm_tile

    assert smallm_configs(256) == SMALLM_CONFIGS
    tiles = {tuple(sorted(c.items())): smallm_tile(256, c) for c in SMALLM_CONFIGS}
    halves = {(("bw", 256),), (("bw", 256), ("cols", 2)), (("bw", 128), ("cluster", 2))}
    assert {c for c, t in tiles.items() if t == 128} == halves
    assert all(t == 256 for c, t in tiles.items() if c not in halves)


def test_e4m3_at_256_rows_one_tile_side_by_side(torch):
    """e4m3: one warpgroup holds 128 rows, so the plain 64- and 128-row weight tiles take two
    activation tiles and bw 64 with two warpgroups side by side one; bw 256 (64 rows) and
    four warpgroups (no registers for the temporaries) are no candidates."""
    from ptxdsl import e4m3
    from ptxdsl.torch.kernels import smallm_configs, smallm_tile

    got = {tuple(sorted(c.items())): smallm_tile(256, c, e4m3) for c in smallm_configs(256, e4m3)}
    assert got == {(("bw", 128),): 128, (("bw", 64),): 128, (("bw", 64), ("cols", 2)): 256,
                   (("bw", 128), ("waves", 2)): 128, (("bw", 64), ("waves", 2)): 128,
                   (("bw", 64), ("cols", 2), ("waves", 2)): 256,
                   (("bw", 128), ("cluster", 2)): 128,
                   (("bw", 64), ("cluster", 2), ("cols", 2)): 256}
    assert {"bw": 256} in smallm_configs(128, e4m3)  # 64 rows: two tiles of 128's bucket


@pytest.mark.parametrize("mp", [8, 64, 128, 256])
def test_dense_and_split_k_candidates_from_128_rows(torch, ops, mp):
    """From 128 rows every dense config and the split-K one, after the decode kernel's (its
    default first), in the plain tuner and in the fused epilogues' (which run them
    `unfused`); below, none."""
    from ptxdsl.torch.gemm import decode_candidates, smallm_tuner
    from ptxdsl.torch.kernels import GEMM_CONFIGS, SPLITK_CONFIGS, smallm_configs

    dense = GEMM_CONFIGS + SPLITK_CONFIGS
    got = decode_candidates(mp)
    assert got[:len(smallm_configs(mp))] == smallm_configs(mp)
    assert [c for c in got if "bn" in c] == (list(dense) if mp >= 128 else [])
    for epilogue in (None, "residual", "silu_mul"):
        assert smallm_tuner(mp, epilogue).configs == got


def test_split_k_candidate_builds_the_slot_form(torch, ops):
    """The split-K candidate's recipe (what the tuner builds and hashes into its cache key)
    and kernel are gemm_splitk's slot form over its 128 x 256 tiles, whichever tuner asks."""
    from ptxdsl.kernels import gemm_splitk
    from ptxdsl.torch.gemm import _kernel, _recipe, smallm_tuner
    from ptxdsl.torch.kernels import SPLITK_CONFIGS

    config, = SPLITK_CONFIGS
    assert config["bn"] == gemm_splitk.BN and config["splitk"]
    recipe = _recipe(config)
    assert (recipe.module, recipe.factory) == ("ptxdsl.kernels.gemm_splitk", "make_splitk")
    assert dict(recipe.kwargs) == {"stages": config["stages"], "slots": True}
    assert _kernel(config) is recipe.build()
    for epilogue in (None, "residual"):
        assert ".entry gemm_splitk_slots(" in smallm_tuner(256, epilogue)._ptx(config)


@pytest.mark.parametrize("m, n, k, splits, grid", [
    (256, 4096, 4096, 4, 128),  # 32 tiles: four ranges of 16 K steps
    (200, 4096, 4104, 4, 128),  # M and K ragged: two tile-rows, 65 K steps
    (128, 4096, 4096, 8, 128),  # 16 tiles
    (256, 28672, 4096, 1, 132),  # 224 tiles: more than a wave already, whole tiles
    (256, 4096, 448, 1, 32),  # 7 K steps: no range under four
])
def test_split_k_ranges_fill_the_sms_once(torch, ops, m, n, k, splits, grid):
    from ptxdsl.kernels import gemm_splitk
    from ptxdsl.torch.gemm import splitk_plan

    assert splitk_plan(m, n, k, 132) == (splits, grid)
    tiles = gemm_splitk.tiles(m, n)
    assert splits == 1 or tiles * splits <= 132 < tiles * (splits + 1) or \
        -(-k // gemm_splitk.BK) < 4 * (splits + 1)
