"""GEMM + all-reduce in one launch (ptxdsl/kernels/gemm_allreduce.py) at 2, 3, 4 and 8 ranks
at once in the CPU interpreter, on both paths: every rank's C is bit for bit numpy's sum of
the partial tiles found in the workspaces (mp 8: rank-major in f32 from zero, rounded once;
the owner path: each rank's K ranges in order, rounded to bf16, then those sums in rank
order), the same on every rank; each rank's partials add up to its A_r W_r^T, and C is
close to the sum of the products; over two launches (the flags' epochs carrying over), with
ranks' CTAs started out of order. A rank that never launches is a located deadlock. Two
cases by default; the rest under PTXDSL_DEEP=1 (as CI runs). On GPUs (marked gpu, two or
more), every GPU of the host under torchrun (samples/gemm_allreduce_dist.py) against NCCL's
all_reduce of torch.mm's partials, and the watchdog's named error."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assemble, assert_no_spills
from fuzzing import DEEP
from test_multigpu import gpu_count, needs_two, torchrun

from ptxdsl.errors import LaunchError
from ptxdsl.interp import InterpError
from ptxdsl.kernels import gemm_allreduce as ga
from ptxdsl.runtime.dtypes import bf16_to_f32

# (world, m, n, k, mp, bw, splits, grid, seed); mp 8 pushes to every rank, mp 16 and more
# takes the owner path
CASES = [
    (2, 3, 64, 128, 8, 64, 2, 2, 0),  # 2 K steps in 2 ranges of one tile
    (3, 13, 72, 128, 16, 64, 2, 2, 7),  # owner path: 2 vectors a thread's tile, 3 owners
] + ([
    (3, 5, 136, 320, 8, 64, 3, 3, 1),  # N ragged over 3 tiles; 5 K steps in ranges 2, 2, 1
    (4, 13, 72, 256, 16, 128, 2, 2, 2),  # two consumer warpgroups; N past their 64 rows
    (4, 20, 200, 128, 8, 256, 1, 3, 3),  # M over three tiles; two m64 blocks a warpgroup
    (8, 2, 64, 192, 8, 64, 4, 2, 4),  # 4 ranges asked of 3 K steps: 3 slots a rank
    (2, 40, 64, 448, 64, 64, 5, 4, 5),  # 7 K steps in 5 ranges; mp 64
    (4, 40, 200, 320, 16, 64, 3, 5, 8),  # 12 tiles; 5 K steps in 3 ranges
    (3, 20, 136, 192, 16, 256, 2, 3, 9),  # two m64 blocks a warpgroup: 4 vectors, 3 owners
    (2, 50, 136, 256, 32, 128, 1, 3, 10),  # one K range; M over two tiles
    (8, 20, 64, 128, 16, 64, 2, 2, 11),  # 2 vectors a thread's tile at 8 owners; 2 tiles
] if DEEP else [])


def check(r: dict, world: int, m: int, n: int, bw: int, mp: int) -> None:
    """C against the reference of the partials in the workspaces (see the module's doc)."""
    per = r["ranges"]
    if ga.owners(mp):  # each rank's K ranges, in its own region
        by_rank = [ga.fragments(r["ws"][q], m, n, bw, mp, per) for q in range(world)]
        wants = [ga.reference_owned(by_rank)] * world
    else:  # every rank's, in each rank's region
        parts = [ga.fragments(r["ws"][q], m, n, bw, mp, world * per, r["half"])
                 for q in range(world)]
        by_rank = [parts[0][p * per:(p + 1) * per] for p in range(world)]
        wants = [ga.reference(p) for p in parts]
        for q in range(1, world):
            np.testing.assert_array_equal(parts[q], parts[0], err_msg=f"rank {q}'s slots")
    for q in range(world):
        np.testing.assert_array_equal(r["c"][q], wants[q], err_msg=f"rank {q}")
        np.testing.assert_array_equal(r["c"][q], r["c"][0])
    for p in range(world):  # rank p's K ranges add up to its product
        want = bf16_to_f32(r["a"][p]) @ bf16_to_f32(r["w"][p]).T
        np.testing.assert_allclose(by_rank[p].sum(0), want, rtol=1e-4, atol=1e-3,
                                   err_msg=f"rank {p}'s partials")
    # one rounding, but on the owner path also each rank's sum's (half an ulp of bf16 of it)
    slack = 2 ** -8 * sum(np.abs(p.sum(0)) for p in by_rank) if ga.owners(mp) else 0
    err = np.abs(bf16_to_f32(r["c"][0]) - r["want"])
    assert (err <= 2 ** -7 * np.abs(r["want"]) + slack + 1e-2).all(), err.max()


@pytest.mark.parametrize("world, m, n, k, mp, bw, splits, grid, seed", CASES)
def test_every_rank_gets_the_rank_order_sum(world, m, n, k, mp, bw, splits, grid, seed):
    r = ga.interp(world, m, n, k, mp=mp, bw=bw, splits=splits, grid=grid, seed=seed)
    check(r, world, m, n, bw, mp)
    np.testing.assert_array_equal(r["sig"], np.full_like(r["sig"], 2))  # the last epoch


@pytest.mark.skipif(not DEEP, reason="PTXDSL_DEEP=1")
@pytest.mark.parametrize("mp", [8, 16])
def test_epochs_wrap_at_two_to_the_32(mp):
    """Launches 2^32 - 1 and 0: the second still waits for its peers (a signed difference)
    and, at mp 8, pushes into the other half (2^32 is even)."""
    r = ga.interp(3, 3, 64, 128, mp=mp, splits=2, seed=6, first=(1 << 32) - 1)
    check(r, 3, 3, 64, 64, mp)
    assert r["half"] == 0


@pytest.mark.parametrize("mp", [8, 16])
def test_a_rank_that_never_launches_is_a_located_deadlock(mp):
    with pytest.raises(InterpError) as e:
        ga.interp(2, 3, 64, 128, mp=mp, splits=2, launch=[0], epochs=1)
    text = str(e.value)
    assert "deadlock" in text and "rank 0: " in text and "rank 1: " not in text, text
    assert "gemm_allreduce.py" in text and "ld_acquire(sig[" in text, text


def test_rank_order_changes_the_bits():
    """The reference adds slots in order: with values whose f32 sum depends on the order it
    differs from a reversed sum (so the checks above would see a kernel adding in another
    order)."""
    p = np.array([1e8, 1.0, -1e8, 1.0], np.float32).reshape(4, 1, 1)
    assert ga.reference(p)[0, 0] != ga.reference(p[::-1])[0, 0]
    # the owner path's: ranks' sums first (1e8 + 1 = 1e8 on rank 0), unlike one flat sum
    assert ga.reference_owned([p[:2], p[2:]])[0, 0] != ga.reference(p)[0, 0]


def test_arguments_are_the_kernels_parameters_in_order():
    """The host launches with `arguments(...).values()`, the interpreter with the dict by
    name: one order for both."""
    args = ga.arguments("w", "x", "c", "ws", 4096, "sig", 64, 1, 2, 3, 64, 128, 2,
                        (1 << 32) + 3)
    assert list(args) == [p.name for p in ga.make_gemm_allreduce().ir.params]
    assert args["epoch"] == 3 and args["kdim"] == 128
    owned = ga.arguments("w", "x", "c", "ws", 4096, "sig", 64, 1, 2, 3, 64, 128, 2, 5,
                         res="res", res_stride=512)
    assert list(owned) == [p.name for p in ga.make_gemm_allreduce(16).ir.params]
    assert owned["res_stride"] == 512 and owned["ws_stride"] == 4096


def test_plan_arithmetic():
    # Llama-70B-like decode shard: N 4096, K 7168 at two ranks, M 1 in 8-row tiles: 32 tiles
    # of 128 rows fill the SMs four ranges deep; so do 64 and 256 rows on the owner path
    # (only a rank's sum crosses the link)
    assert ga.pick_splits(1, 4096, 7168, 128, 8) == 4
    assert ga.pick_splits(64, 4096, 7168, 128, 64) == 4
    assert ga.pick_splits(256, 4096, 7168, 128, 256) == 4
    # mp 8: 4 tiles would fill the SMs 28 ranges deep; every range crosses: at most 16
    assert ga.pick_splits(1, 256, 7168, 64, 8) == 16
    assert ga.ranges(192, 4) == 3 and ga.ranges(64, 4) == 1
    assert not ga.owners(8) and ga.owners(16)
    # two halves x 2 ranks x 3 ranges x 2 tiles of 64 x 8
    assert ga.region_elems(3, 72, 192, 64, 8, 4, 2) == 2 * 2 * 3 * 2 * 64 * 8
    # owner path, 8 tiles of 64 x 16 at 3 ranks: 3 ranges of each; bf16: the results and a
    # slot a rank
    assert ga.region_elems(20, 200, 192, 64, 16, 4, 3) == 3 * 8 * 64 * 16
    assert ga.result_elems(20, 200, 64, 16, 3) == (1 + 3) * 8 * 64 * 16
    # a word per warpgroup (two of bw 128) and slot; owner path: per K range, and per K
    # range's share of the tile a word per rank's sum and per owner's result
    assert ga.flag_words(3, 200, 192, 128, 8, 4, 2) == 2 * 2 * 2 * 3
    assert ga.flag_words(20, 200, 192, 128, 16, 4, 3) == 2 * 4 * 3 * (1 + 3 + 3)
    with pytest.raises(ValueError, match="mp up to 128, got mp 256"):
        ga.make_gemm_allreduce(256, 256)
    with pytest.raises(ValueError, match="bw is 64, 128 or 256, got 96"):
        ga.make_gemm_allreduce(8, 96)


def test_the_plan_refuses_arrays_the_kernel_cannot_take():
    """GemmAllReduce's checks (no GPU: a plan's fields set by hand, arrays described by their
    ArrayDesc): shapes, bf16, the plan's GPU, row-major; a second stream; and shapes refused
    before any collective."""
    from ptxdsl import bf16, f32
    from ptxdsl.runtime.distributed import one_stream
    from ptxdsl.runtime.gemm_allreduce import GemmAllReduce
    from ptxdsl.runtime.interop import ArrayDesc

    class Array:
        def __init__(self, shape=(3, 64), strides=(128, 2), elem=bf16, device=0):
            self.__ptxdsl_array__ = ArrayDesc(0x10000, shape, strides, elem)
            self.device = device

    plan = object.__new__(GemmAllReduce)
    plan.m, plan.n, plan.k, plan.device, plan._maps = 3, 72, 64, 0, {}
    for bad, words in ((Array(shape=(4, 64), strides=(128, 2)), r"shape \(3, 64\), got bf16 "
                        r"\(4, 64\)"),
                       (Array(strides=(256, 4), elem=f32), "must be a bf16 array"),
                       (Array(strides=(256, 2)), "must be row-major"),
                       (Array(device=1), "is on GPU 1; this plan runs on GPU 0")):
        with pytest.raises(LaunchError, match=words):
            plan._map(bad, 3, 8, "a")
    assert one_stream(None, 7, "gemm_allreduce") == 7
    with pytest.raises(LaunchError, match="gemm_allreduce plans run on one stream: this one "
                                          "first ran on stream 0x7, now 0x8"):
        one_stream(7, 8, "gemm_allreduce")
    for kw, words in (({"m": 0}, "1 <= m <= 256"), ({"k_local": 100}, "multiple of 8"),
                      ({"m": 200, "bw": 256}, r"1 <= m <= 128 \(with bw 256\)"),
                      ({"bw": 32}, "bw is 64, 128 or 256")):
        with pytest.raises(LaunchError, match=words):
            GemmAllReduce(**{"m": 3, "n": 72, "k_local": 64, **kw})


@pytest.mark.ptxas
@pytest.mark.parametrize("mp, bw", [(8, 128), (16, 128), (256, 128), (256, 64), (128, 256)]
                         if DEEP else [(64, 128)])
def test_builds_assemble_without_spills(mp, bw, tmp_path):
    assert_no_spills(assemble(ga.make_gemm_allreduce(mp, bw).ptx("sm_90a"), tmp_path))


# ----------------------------------------------------------------------------- GPUs


@pytest.mark.gpu
@needs_two
def test_every_gpu_gets_the_same_sum_and_agrees_with_nccl():
    """Every GPU of the host, one process each: decode shapes at M 1 to 256, three calls a
    plan on fresh data: the same bits on every rank, close to NCCL's all_reduce of torch.mm's
    partials and to the f32 product."""
    pytest.importorskip("torch")
    from conftest import sample_module

    world = gpu_count()
    out = torchrun(sample="gemm_allreduce_dist.py", ranks=world)
    assert "MISMATCH" not in out and "FAR" not in out, out[-4000:]
    calls = len(sample_module("gemm_allreduce_dist").SHAPES) * 3
    for rank in range(world):
        assert out.count(f"rank {rank}: gemm_allreduce") == calls, out[-4000:]
    assert "all ok" in out


@pytest.mark.gpu
@needs_two
def test_a_rank_that_never_launches_is_a_named_error_on_the_gpu():
    """Rank 1 builds the plan and never launches: rank 0's kernel (with the watchdog) ends
    in a DeviceError naming the spin on rank 1's flag and its line."""
    pytest.importorskip("torch")
    out = torchrun("--hang", timeout=180, sample="gemm_allreduce_dist.py")
    assert "rank 1: not launching" in out, out[-4000:]
    assert "rank 0: named error: error: watchdog: kernel 'gemm_allreduce_m8_w128" in out, \
        out[-4000:]
    assert "spun more than 2000 ms in spin loop `while (ld_acquire(sig[" in out, out[-4000:]
    assert "ptxdsl/kernels/gemm_allreduce.py:" in out, out[-4000:]


def test_the_bench_rows_from_a_run():
    """bench/tp.py's rows of GEMM + all-reduce from a worker's JSON (no GPU): a row against
    torch.mm + NCCL with its target, the other lines in the note, and a wrong or differing
    result refused."""
    import argparse

    from bench import tp
    from bench.common import BenchError

    def res(ours=20.0, errors=None, same=True):
        return {"layer": "gar", "name": "decode M 16", "m": 16, "k": 14336, "n": 4096,
                "us": {"ours": ours, "bw64": 22.0, "a": 30.0, "ptx_ar": 25.0, "gemm": 18.0,
                       "comm": 12.0},
                "errors": errors or {"ours": 0.2, "bw64": 0.2, "a": 0.3, "ptx_ar": 0.3},
                "same_bits": same, "splits": {"ours": 4, "bw64": 2}}

    a = argparse.Namespace(gpus=2, quick=False)
    s = tp.section({"world": 2, "results": [res(), res(ours=40.0)]}, a)
    assert [(r.case, r.unit, r.target) for r in s.rows] == \
        [("GEMM + all-reduce, decode M 16 (K 14336, N 4096)", "us", 1.2)] * 2
    assert s.rows[0].ratio == pytest.approx(1.5) and not s.rows[0].missed and s.rows[1].missed
    assert "4 K ranges a tile; 64-row tiles, 2 ranges: 22.0); torch.mm + NCCL all_reduce " \
        "30.0, torch.mm + ptxdsl all_reduce 25.0; torch.mm alone 18.0" in s.notes[0]
    for bad, words in ((res(errors={"ours": 2.0}), "wrong results {'ours': 2.0}"),
                       (res(same=False), "C differs across ranks")):
        with pytest.raises(BenchError, match=words):
            tp.section({"world": 2, "results": [bad]}, a)
