"""The split-K GEMM (ptxdsl/kernels/gemm_splitk.*) on the GPU against torch.matmul's f32
reference on fresh random bf16 data, both modes, ragged shapes included, and its stream-K walk; the
deterministic mode is bit-identical across repeated runs; the workspace and semaphores are
left at zero."""

from pathlib import Path

import pytest
from conftest import LIBRARY

from bench.common import gemm_error

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.gpu
BENCH = "splitk"  # the conftest fixture `bench`: bench/splitk.py

SHAPES = [(512, 512, 8192, None), (256, 256, 4096, 3), (333, 520, 4104, 5),
          (130, 4104, 2056, 4), (1000, 200, 16384, 16), (128, 256, 128, 2), (64, 72, 1000, 7)]


def _inputs(m, n, k, seed):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    return a, b, c


def _launches(run, a, b, c, times):
    """C (as raw bits) after each of `times` launches of `run` on fresh NaNs, each checked
    against torch and with its workspace and semaphores back at zero (a later launch relies
    on the earlier leaving zeros behind)."""
    import torch

    results = []
    for _ in range(times):
        c.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
        assert gemm_error(c, a, b) <= 1.0
        assert run.clean(), "workspace or semaphores not reset"
        results.append(c.view(torch.int16).clone())
    return results


@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "deterministic"])
@pytest.mark.parametrize("m, n, k, splits", SHAPES)
def test_splitk_matches_torch(bench, m, n, k, splits, ordered):
    a, b, c = _inputs(m, n, k, seed=m + n + k)
    _launches(bench.SplitK(a, b, c, splits, ordered), a, b, c, 2)


STREAMK = [(2432, 1792, 1024), (640, 768, 4160), (128, 256, 8192), (1000, 1000, 520),
           (50816, 256, 256)]


@pytest.mark.parametrize("m, n, k, splits, streamk",
                         [(*x, False) for x in SHAPES] + [(*x, None, True) for x in STREAMK])
def test_two_kernel_form_matches_torch_and_repeats_bit_for_bit(bench, m, n, k, splits, streamk):
    """make_splitk(slots=True) + make_splitk_reduce: every range stores its own slot (on a
    stream-K walk whole tiles too, the slots a tile does not use staying zero), the second
    kernel sums the slots in order."""
    import torch

    a, b, c = _inputs(m, n, k, seed=m + n + k + 1)
    run = bench.SplitK(a, b, c, splits, ordered=True, streamk=streamk, slots=True)
    results = _launches(run, a, b, c, 3)
    assert all(torch.equal(r, results[0]) for r in results[1:])


@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "deterministic"])
@pytest.mark.parametrize("m, n, k", STREAMK)
def test_streamk_matches_torch(bench, m, n, k, ordered):
    """Stream-K over every SM: one tile more than a wave, fewer tiles than SMs (a tile split
    over many CTAs), ragged edges, and 3 x 132 + 1 tiles."""
    a, b, c = _inputs(m, n, k, seed=m + n + k)
    _launches(bench.SplitK(a, b, c, ordered=ordered, streamk=True), a, b, c, 2)


@pytest.mark.parametrize("mode", ["unordered", "deterministic", "two kernels"])
@pytest.mark.parametrize("m, n, k, splits", SHAPES + [(333, 520, 4104, 1)])
def test_two_cta_clusters_match_torch(bench, m, n, k, splits, mode):
    """make_splitk(cluster=2): a cluster's CTAs take vertically adjacent tiles and multicast
    halves of the shared B slice; odd tile-row counts (333: 3, 128 and 64: 1) leave the last
    pair's second CTA loading B for its partner with no rows of its own (with one split, too,
    where the pair's tiles are whole)."""
    import torch

    a, b, c = _inputs(m, n, k, seed=m + n + k + 2)
    run = bench.SplitK(a, b, c, splits, ordered=mode != "unordered",
                       slots=mode == "two kernels", cluster=2)
    results = _launches(run, a, b, c, 2)
    if mode != "unordered":
        assert torch.equal(results[0], results[1])


# every range in flight at once: 130 x 4104 in 4 splits would be 136 ranges, so 3
STRIPED = [x if x[:3] != (130, 4104, 2056) else (130, 4104, 2056, 3) for x in SHAPES]


@pytest.mark.parametrize("cluster", [1, 2])
@pytest.mark.parametrize("m, n, k, splits", STRIPED)
def test_striped_sum_matches_torch_and_repeats_bit_for_bit(bench, m, n, k, splits, cluster):
    """make_splitk(slots=True, stripes=True): every range stores its slot, the ranges of a
    half-tile meet at its semaphore, and each sums a stripe over all slots in slot order into
    C; the semaphores are back at zero after every launch."""
    import torch

    a, b, c = _inputs(m, n, k, seed=m + n + k + 3)
    run = bench.SplitK(a, b, c, splits, ordered=True, stripes=True, cluster=cluster)
    results = _launches(run, a, b, c, 3)
    assert all(torch.equal(r, results[0]) for r in results[1:])


def test_striped_sum_refuses_ranges_that_cannot_all_run_at_once(bench):
    import torch

    a, b, c = _inputs(1024, 1024, 8192, seed=5)  # 32 tiles x 8 splits: 256 ranges
    with pytest.raises(bench.BenchError, match="every range in flight"):
        bench.SplitK(a, b, c, 8, ordered=True, stripes=True)
    torch.cuda.synchronize()


def test_deterministic_mode_is_bit_identical(bench):
    import torch

    m, n, k = 512, 512, 65536
    a, b, c = _inputs(m, n, k, seed=7)
    run = bench.SplitK(a, b, c, 16, ordered=True)
    results = []
    for _ in range(5):
        c.zero_()
        run()
        torch.cuda.synchronize()
        results.append(c.view(torch.int16).clone())
    assert gemm_error(c, a, b) <= 1.0
    for r in results[1:]:
        assert torch.equal(r, results[0])


def test_splitk_sample_text_runs(bench):
    from ptxdsl.tools.runner import run_sample

    for _, results in run_sample(LIBRARY / "gemm_splitk.ptxdsl", seed=0):
        assert all(r.ok for r in results), [r.detail for r in results]
