"""The fused tensor-parallel layers (ptxdsl/kernels/ag_gemm.ptxdsl, gemm_rs.ptxdsl) with
2, 4 and 8 ranks at once in the CPU interpreter (`ptxdsl.interp.run_ranks`): every rank's
result against numpy, the counters each protocol leaves behind, and a rank that never
launches ending in a located deadlock on the ranks that wait for it. Two ranks at a small
size by default; 4 and 8 ranks, the ordered mode and other seeds under PTXDSL_DEEP=1 (as CI
runs). The two-GPU runs are in test_multigpu.py."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import LIBRARY, sample_module
from fuzzing import DEEP

import ptxdsl
from ptxdsl.interp import InterpError, TensorMapModel, run_ranks

tp = sample_module("tp_linear")
SMALL = dict(m_local=80, n=136)  # a ragged row panel per rank, a ragged column tile


def assert_product(got: np.ndarray, want: np.ndarray, k: int, scale: np.ndarray = None,
                   roundings: int = 2) -> None:
    """C rounded to bf16 `roundings` times (a sum of bf16 partials: once a partial, once an
    add): within half a bf16 ulp (2^-8) of `scale` (|C|, or the sum of the partials'
    magnitudes) a rounding, plus a little for sums near zero."""
    tol = 2.0 ** -8 * roundings * np.abs(want if scale is None else scale) + 1e-3 * np.sqrt(k)
    assert np.all(np.abs(got - want) <= tol), float(np.max(np.abs(got - want) - tol))


@pytest.mark.parametrize("world, seed, ck, epochs, pace, kblocks, pullers, staging, bn", [
    (2, 0, 1, 1, 1, 5, 1, (4, 1), 224)] + (
    [(2, 0, 4, 1, 0, 5, 1, (3, 4), 256), (3, 3, 1, 2, 1, 5, 1, (4, 1), 256),
     (2, 2, [1, 4], 3, 1, 5, 0, (3, 4), 256),
     (4, 1, 4, 2, 0, 5, 1, (3, 4), 256), (8, 0, 1, 1, 1, 5, 0, (4, 1), 256),
     (8, 1, 1, 1, 1, 5, 1, (3, 4), 256), (2, 4, 1, 1, 1, 33, 1, (4, 1), 256),
     (2, 5, 4, 1, 0, 5, 7, (3, 2), 256), (2, 6, 1, 2, 1, 5, 1, (4, 1), 224),
     (4, 7, 4, 1, 0, 5, 0, (3, 7), 224)] if DEEP else []))
def test_all_gather_gemm_ranks(world, seed, ck, epochs, pace, kblocks, pullers, staging, bn):
    """`pace`: local tiles wait for their remote partners' units as they go, and the units
    go k-block by k-block across the remote panels. 5 k-blocks: two gather units of 4 per
    panel, the second ragged; 33 in units of 1: two flag words a panel. `pullers` 1: one of
    the two CTAs pulls every unit (0: both; 7, more than the grid: both). `staging` (4, 1):
    the decoding build (4 stages, C out a chunk at a time); `bn` 224: C in 32-column chunks
    (136 columns: one ragged tile, chunks wholly past n; 264: a full tile and a ragged
    one)."""
    k = 64 * kblocks
    r = tp.interp_ag(world, k=k, seed=seed, ck=ck, epochs=epochs, pace=pace, pullers=pullers,
                     staging=staging, bn=bn,
                     **(SMALL | ({"n": 264} if bn == 224 and seed else {})))
    for rank in range(world):
        np.testing.assert_array_equal(r["gathered"][rank], r["want_gathered"])
        assert_product(r["c"][rank], r["want_c"][rank], k)
    # every rank saw every peer start this launch, and reset its pulled count
    ready = r["sig"][:, :world]
    assert np.all(ready + epochs * np.eye(world, dtype=np.uint32) == epochs)
    assert np.all(r["sig"][:, world] == 0)
    # every unit (ceil(kblocks / ck) a remote panel) flipped its bit once a launch
    for rank, flags in enumerate(r["flags"]):
        units = -(-kblocks // (ck[rank] if isinstance(ck, list) else ck))
        words = -(-units // 32)
        bits = [min(max(units - 32 * i, 0), 32) for i in range(words)]
        want = np.array([(1 << b) - 1 for b in bits] * (world - 1), np.uint32) * (epochs % 2)
        np.testing.assert_array_equal(flags, want)


@pytest.mark.parametrize("world, ordered, splits, seed, epochs, zeroed, bn, kb, grid", [
    (2, False, 2, 0, 1, 1, 128, 2, 2)] + (
    [(2, False, 2, 0, 1, 0, 256, 2, 2), (2, True, 1, 3, 2, 0, 256, 2, 2),
     (4, False, 1, 1, 2, 0, 256, 2, 2), (4, True, 2, 0, 2, 0, 256, 2, 2),
     (8, True, 1, 2, 1, 0, 256, 2, 2), (4, False, 2, 3, 2, 1, 256, 2, 2),
     (8, False, 1, 4, 1, 1, 256, 2, 2), (2, False, 1, 5, 2, 1, 128, 7, 4),
     (4, True, 1, 6, 1, 0, 128, 2, 2), (8, False, 1, 7, 1, 1, 128, 2, 2),
     (3, True, 2, 8, 2, 1, 64, 2, 2), (2, False, 1, 9, 1, 0, 192, 5, 2)] if DEEP else []))
def test_gemm_reduce_scatter_ranks(world, ordered, splits, seed, epochs, zeroed, bn, kb, grid):
    """`zeroed`: the owners zero their tiles as the launch starts and every contribution adds
    (with two launches, the second's counts continue from the first's); with `ordered` too,
    after the zeros in order. `bn` 128: the decoding tiling (136 columns: a full tile and a
    ragged one), built as the host builds it (`rs_stages`); 7 k-blocks wrap its 6-stage
    ring, and a grid of 4 gives each CTA one item as when decoding."""
    k = 64 * kb
    r = tp.interp_rs(world, k_local=k, ordered=ordered, epochs=epochs, seed=seed,
                     splits=splits, zeroed=zeroed, bn=bn, stages=tp.rs_stages(bn), grid=grid,
                     **SMALL)
    assert_product(r["c"], r["want"], k * world, r["scale"], 2 * world * splits + zeroed)
    # every half-tile counter holds world x splits contributions (and the zeros) a launch,
    # never reset
    assert np.all(r["sig"] == epochs * (world * splits + zeroed))


@pytest.mark.skipif(not DEEP, reason="three multi-rank runs: PTXDSL_DEEP=1")
def test_ordered_reduce_scatter_is_the_same_whatever_the_interleaving():
    runs = [tp.interp_rs(3, k_local=128, ordered=True, epochs=1, seed=s, splits=2,
                         rng=np.random.default_rng(5), **SMALL)["c"] for s in (0, 1, 2)]
    for other in runs[1:]:
        np.testing.assert_array_equal(runs[0], other)


@pytest.mark.skipif(not DEEP, reason="a deadlocked multi-rank run: PTXDSL_DEEP=1")
def test_a_rank_that_never_launches_is_a_located_deadlock():
    world, m_local, k, n = 3, 64, 128, 64
    rng = np.random.default_rng(0)
    buf = rng.integers(0, 1 << 14, size=(world, world, m_local, k), dtype=np.uint16)
    sig = np.zeros((world, world + 1), np.uint32)
    pull = TensorMapModel(buf, (1, 1, 64, 64), swizzle="128B", dtype="bf16")
    panels = (world - 1) * (-(-m_local // 128))
    args = [dict(a=TensorMapModel(buf[r], (1, 128, 64), swizzle="128B", dtype="bf16"),
                 a_pull=pull,
                 a_st=TensorMapModel(buf[r], (1, 64, 64), swizzle="128B", dtype="bf16"),
                 b=TensorMapModel(np.zeros((n, k), np.uint16), (256, 64), swizzle="128B",
                                  dtype="bf16"),
                 c=TensorMapModel(np.zeros((world, m_local, n), np.uint16), (1, 64, 64),
                                  swizzle="128B", dtype="bf16"),
                 flags=np.zeros(panels, np.uint32), sig=sig.reshape(-1), sig_stride=world + 1,
                 rank=r, world=world, m_local=m_local, n=n, kdim=k, epoch=1, ck=4, pace=1,
                 pullers=1)
            for r in range(world - 1)]  # rank 2 never launches
    with pytest.raises(InterpError) as e:
        run_ranks(ptxdsl.parse_file(LIBRARY / "ag_gemm.ptxdsl"), 1, args)
    text = str(e.value)
    assert "deadlock" in text and "rank 0: " in text and "rank 1: " in text, text
    assert "rank 2: " not in text
    assert "ag_gemm.ptxdsl" in text and "ld_acquire(sig[" in text, text



def test_plans_agree_on_their_shapes_or_fail_on_every_rank():
    """A plan is a collective: ranks that pass different shapes get an error naming every
    rank's values (on every rank, so none waits in a kernel for peers that never come)."""
    from ptxdsl.errors import LaunchError

    class Dist:
        def __init__(self, seen):
            self.seen = seen

        def get_world_size(self, group=None):
            return len(self.seen)

        def all_gather_object(self, out, value, group=None):
            out[:] = self.seen

    tp._agree(Dist([(256, 8192)] * 4), None, "shapes (m_local, k)", (256, 8192))
    with pytest.raises(LaunchError) as e:
        tp._agree(Dist([(256, 8192), (256, 8192), (128, 8192), (256, 8192)]), None,
                  "all-gather GEMM shapes (m_local, k)", (256, 8192))
    assert ("all-gather GEMM shapes (m_local, k) differ across ranks (rank 0: (256, 8192), "
            "rank 1: (256, 8192), rank 2: (128, 8192), rank 3: (256, 8192))") in str(e.value)


@pytest.mark.parametrize("bn, stages", [(128, 6), (192, 4)])
def test_gemm_rs_text_and_twin_agree_at_other_widths(bn, stages):
    """The default build is compared in test_twins; these are the -D BN / STAGES forms."""
    (k,) = ptxdsl.parse_file(LIBRARY / "gemm_rs.ptxdsl",
                             defines={"BN": bn, "STAGES": stages}).kernels
    assert k == sample_module("gemm_rs").make_gemm_rs(bn, stages).ir


@pytest.mark.parametrize("stages, cch, bn", [(4, 1, 256), (3, 2, 256), (4, 1, 224),
                                             (3, 7, 224)])
def test_ag_gemm_text_and_twin_agree_on_other_builds(stages, cch, bn):
    (k,) = ptxdsl.parse_file(LIBRARY / "ag_gemm.ptxdsl",
                             defines={"STAGES": stages, "CCH": cch, "BN": bn}).kernels
    assert k == sample_module("ag_gemm").make_ag_gemm(stages, cch, bn).ir


@pytest.mark.parametrize("bn", [256, 224])
def test_the_decoding_all_gather_builds_fit(bn):
    ptxdsl.compile(LIBRARY / "ag_gemm.ptxdsl",
                   defines={"STAGES": 4, "CCH": 1, "BN": bn})


def test_ag_staging_and_width():
    assert tp.ag_staging(1) == (4, 1) and tp.ag_staging(0) == (3, 4)
    assert tp.ag_staging(0, 224) == (3, 7)  # a plan without a peer may take 224-wide tiles
    assert tp.ag_width(2, 128, 14336, 132) == 224  # 2 x 64 tiles fill 128 SMs, not 112
    assert tp.ag_width(2, 4096, 14336, 132) == 256  # many waves
    assert tp.ag_width(2, 200, 520, 132) == 256  # 224-wide adds no tiles


@pytest.mark.parametrize("bn", [64, 128, 192, 256])
def test_every_rs_width_builds_with_its_stages(bn):
    """What the host builds fits a CTA's shared memory, and where the stage count is not
    capped one more stage would not."""
    stages = tp.rs_stages(bn)
    ptxdsl.compile(LIBRARY / "gemm_rs.ptxdsl", defines={"BN": bn, "STAGES": stages})
    if stages < 6:
        with pytest.raises(ptxdsl.CompileError, match="shared memory"):
            ptxdsl.compile(LIBRARY / "gemm_rs.ptxdsl", defines={"BN": bn, "STAGES": stages + 1})


@pytest.mark.parametrize("world, m_local, n, k_local, sms, want", [
    (2, 128, 8192, 14336, 132, (128, 6, 1)),  # decode: 128-wide tiles fill a wave alone
    (2, 4096, 8192, 14336, 132, (256, 3, 1)),  # 8192 tokens: many waves
    (2, 128, 4096, 14336, 132, (128, 6, 2)),  # 64 narrow tiles: K ranges still fill the GPU
    (8, 128, 8192, 1792, 132, (256, 3, 1)),  # 256 wide tiles already fill 2 waves
    (2, 128, 16384, 14336, 132, (256, 3, 1)),  # 128 wide tiles would need two waves
])
def test_rs_tiling(world, m_local, n, k_local, sms, want):
    assert tp.rs_tiling(world, m_local, n, k_local, sms) == want


def test_rs_tiling_takes_what_the_caller_asks():
    assert tp.rs_tiling(2, 128, 8192, 14336, 132, splits=1) == (128, 6, 1)  # one range: narrow
    assert tp.rs_tiling(2, 128, 8192, 14336, 132, splits=2) == (256, 3, 2)
    assert tp.rs_tiling(2, 4096, 8192, 14336, 132, bn=192) == (192, 4, 1)
    with pytest.raises(ptxdsl.LaunchError, match="not 96"):
        tp.rs_tiling(2, 128, 8192, 14336, 132, bn=96)
