"""The decode GEMM's tuning candidates per bucket of M (ptxdsl/torch/kernels.py): the plain
weight tiles everywhere; from 64 rows on, two warpgroups side by side over the activation
tile, cluster pairs and two waves of split-K ranges too; a config whose registers hold half
the bucket takes two activation tiles, one that holds less is no candidate. No GPU: which
configs, which tiles."""

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
