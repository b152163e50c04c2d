"""The grouped GEMM (ptxdsl/kernels/grouped_gemm.*) on the GPU against each expert's f32 product on
fresh random bf16 data: ragged and empty experts, tiles that run past an expert's last row,
the masked (fixed-capacity) layout with counts over and under the capacity, and rows no
expert owns left untouched."""

from pathlib import Path

import pytest
from conftest import LIBRARY

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.gpu
BENCH = "grouped"  # the conftest fixture `bench`: bench/grouped.py


def _data(e, total, n, k, seed):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(max(total, 1), k, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16, generator=g)
    c = torch.full((max(total, 1), n), float("nan"), device="cuda", dtype=torch.bfloat16)
    return a, b, c


@pytest.mark.parametrize("rows, n, k", [
    ([300, 0, 129, 1, 64], 1032, 520),      # ragged, an empty expert, a 1-row expert
    ([4096, 4096], 1024, 1024),             # whole tiles only
    ([0, 0, 77], 256, 64),                  # leading empty experts, one K step
    ([128] * 16, 2048, 4096),               # many experts, whole tiles
    ([17, 250, 3, 0, 511, 1000, 128, 129], 4104, 200),  # ragged N and K too
])
def test_contiguous_matches_torch(bench, rows, n, k):
    import torch

    total = sum(rows)
    a, b, c = _data(len(rows), total, n, k, seed=total + n + k)
    starts = [sum(rows[:g]) for g in range(len(rows))]
    ref = bench.reference(a, b, starts, rows)
    run = bench.Grouped(a, b, c, rows)
    run()
    torch.cuda.synchronize()
    if total:
        assert bench.error(c, ref, k) <= 1.0


@pytest.mark.parametrize("counts, cap, n, k", [
    ([3, 0, 40, 64, 17, 1], 64, 512, 1024),   # decode: a few tokens per expert
    ([200, 5, 129], 130, 264, 520),           # counts over the capacity are cut to it
])
@pytest.mark.parametrize("variant", ["tma", "registers"])
def test_masked_matches_torch_and_leaves_other_rows(bench, counts, cap, n, k, variant):
    import torch

    e = len(counts)
    a, b, c = _data(e, e * cap, n, k, seed=cap + n)
    used = [min(x, cap) for x in counts]
    starts = [g * cap for g in range(e)]
    ref = bench.reference(a, b, starts, used)
    kdef = None
    if variant == "registers":  # decoding's variant: 4 stages, every tile from registers
        from bench.common import twin

        kdef = twin("grouped_gemm").make_grouped(masked=True, stages=4, tma_epilogue=False)
    bench.Grouped(a, b, c, counts, masked=True, cap=cap, kdef=kdef)()
    torch.cuda.synchronize()
    owned = torch.zeros(e * cap, dtype=torch.bool, device="cuda")
    for s0, u in zip(starts, used, strict=True):
        owned[s0:s0 + u] = True
    assert bench.error(c, ref, k, owned) <= 1.0
    assert c[~owned].isnan().all(), "a row no expert owns was written"


def test_grouped_sample_text_runs(bench):
    from ptxdsl.tools.runner import run_sample

    for _, results in run_sample(LIBRARY / "grouped_gemm.ptxdsl", seed=0):
        assert all(r.ok for r in results), [r.detail for r in results]
