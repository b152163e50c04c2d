"""The wgmma GEMM sample on the GPU against an f32 reference of torch, on random bf16 data,
including shapes that are not tile multiples (TMA zero-fills and clips the ragged edges)."""

from pathlib import Path

import pytest
from conftest import LIBRARY

from bench.common import twin as sample_twin

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.gpu
BENCH = "gemm"  # the conftest fixture `bench`: bench/gemm.py

SHAPES = [(256, 256, 256), (128, 256, 64), (1000, 1528, 1000), (4096, 4096, 4096),
          (333, 520, 72), (2048, 2048, 8200), (8, 8, 8), (3000, 256, 4096), (130, 4104, 136)]


@pytest.mark.parametrize("m, n, k", SHAPES)
def test_gemm_matches_torch(bench, m, n, k):
    twin = sample_twin("gemm")
    assert bench.check(twin.gemm, m, n, k) <= 1.0


@pytest.mark.parametrize("cfg", [dict(bn=128, stages=6), dict(group=1), dict(dtype="f16"),
                                 dict(bm=256, bn=128), dict(stages=2), dict(bn=128, stages=4),
                                 dict(bn=224)])
def test_gemm_variants(bench, cfg):
    import torch

    import ptxdsl

    twin = sample_twin("gemm")
    if cfg.get("dtype") == "f16":
        kdef = twin.make_gemm(dtype=ptxdsl.f16)
        m, n, k = 520, 776, 264
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(n, k, device="cuda", dtype=torch.float16)
        c = torch.empty(m, n, device="cuda", dtype=torch.float16)
        bench.gemm_launcher(kdef, a, b, c)()
        torch.cuda.synchronize()
        ref = a.float() @ b.float().T
        assert ((c.float() - ref).abs() <= 2 ** -9 * ref.abs() + 1e-3 * k ** 0.5).all()
        return
    kdef = twin.make_gemm(**cfg)
    assert bench.check(kdef, 1000, 1528, 1000, bm=cfg.get("bm", 128), bn=cfg.get("bn", 256)) <= 1.0


@pytest.mark.parametrize("m, n, k", [(1000, 1528, 1000), (4096, 4096, 4096), (333, 520, 72),
                                     (130, 4104, 136), (8, 8, 8)])
def test_gemm_cluster_pair_multicasts_b(bench, m, n, k):
    """2 x 1 clusters: each CTA loads its A tile and half of the pair's B tile, multicast to
    both; odd tile-row counts leave the second CTA of the last pair off the matrix."""
    kdef = sample_twin("gemm").make_gemm(cluster=(2, 1, 1))
    assert bench.check(kdef, m, n, k, cluster=2) <= 1.0


@pytest.mark.parametrize("m, n, k", [(1000, 1528, 1000), (2432, 1792, 8192), (8192, 8192, 1024),
                                     (333, 520, 72), (130, 4104, 136), (8, 8, 8),
                                     (2816, 3840, 4096), (50816, 256, 512)])
def test_gemm_stream_k_matches_torch_and_repeats(bench, m, n, k):
    _stream_k_repeats(bench, m, n, k)


@pytest.mark.parametrize("m, n, k", [(256, 14336, 1024), (333, 520, 200)])
def test_gemm_stream_k_with_128_rows_a_consumer(bench, m, n, k):
    _stream_k_repeats(bench, m, n, k, bm=256, bn=128)


@pytest.mark.parametrize("m, n, k", [(256, 14336, 1024), (1000, 1528, 1000)])
def test_gemm_with_224_wide_tiles(bench, m, n, k):
    """32-column C chunks; dense and on a 2 x 1 cluster (112 rows of B each), and stream-K."""
    twin = sample_twin("gemm")
    assert bench.check(twin.make_gemm(bn=224), m, n, k, bn=224) <= 1.0
    assert bench.check(twin.make_gemm(bn=224, cluster=(2, 1, 1)), m, n, k, bn=224,
                       cluster=2) <= 1.0
    _stream_k_repeats(bench, m, n, k, bn=224)


def _stream_k_repeats(bench, m, n, k, bm=128, bn=256):
    """make_gemm(streamk=True) over every SM: shared tiles cut into parts that meet in
    workspace slots; three launches on fresh outputs, each right and each leaving the
    semaphores zero for the next."""
    import torch

    from bench.common import gemm_error

    kdef = sample_twin("gemm").make_gemm(bm=bm, bn=bn, streamk=True)
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g)
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    run = bench.gemm_launcher(kdef, a, b, c, bm, bn, streamk=True)
    for _ in range(3):
        c.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
        assert gemm_error(c, a, b) <= 1.0
        assert not run.sem.view(torch.int32).any()


def test_gemm_sample_text_runs(bench):
    from ptxdsl.tools.runner import run_sample

    for _, results in run_sample(LIBRARY / "gemm.ptxdsl", seed=0):
        assert all(r.ok for r in results), [r.detail for r in results]


def test_gemm_simple_sample_runs(bench):
    from ptxdsl.tools.runner import run_sample

    for _, results in run_sample(ROOT / "samples" / "gemm_simple.ptxdsl", seed=1):
        assert all(r.ok for r in results), [r.detail for r in results]


def _forms():
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from wgmma_cases import FORMS

    return FORMS


@pytest.mark.parametrize("form", _forms(), ids=str)
def test_every_wgmma_form_on_the_gpu(bench, form):
    """Each form (N, swizzle, input type, A in registers, negation) against numpy: the
    interpreter tests check the same kernels against the same reference."""
    import numpy as np
    from wgmma_cases import boxes, inputs, make_mma, operands, reference, types_of

    import ptxdsl

    n, swizzle, dtype, a_regs, neg_a, neg_b = form[:6]
    box_a, box_b, bk = boxes(form)
    kdim = 4 * bk
    a, b, af, bf = inputs(np.random.default_rng(2), n, kdim, dtype)
    a, b = operands(a, b, form)
    ta, tb = types_of(dtype)  # tf32 data is f32; fp8 data ml_dtypes arrays
    da, db = ptxdsl.to_device(a, dtype=ta), ptxdsl.to_device(b, dtype=tb)
    c = ptxdsl.to_device(np.full(64 * n, np.nan, np.float32))
    sw = "none" if swizzle == 16 else f"{swizzle}B"
    make_mma(*form)[1](ptxdsl.TensorMap(da, box=box_a, swizzle=sw),
                       ptxdsl.TensorMap(db, box=box_b, swizzle=sw), c, kdim)
    ptxdsl.synchronize()
    got = c.copy_to_host().reshape(64, n)
    ref = reference(af, bf, neg_a, neg_b)
    # fp8 products are summed with fewer than f32's mantissa bits inside the tensor cores
    atol = (4e-3 if ta.is_fp8 else 1e-3) * kdim ** 0.5
    assert np.allclose(got, ref, rtol=1e-4, atol=atol), np.abs(got - ref).max()


def test_launch_rejects_a_tensor_map_whose_swizzle_disagrees_with_the_buffer(bench):
    import torch

    import ptxdsl

    twin = sample_twin("gemm")
    a = torch.zeros(256, 256, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(256, 256, device="cuda", dtype=torch.bfloat16)
    ta = ptxdsl.TensorMap(a, box=(128, 64), swizzle="none")
    tb = ptxdsl.TensorMap(a, box=(256, 64), swizzle="128B")
    tc = ptxdsl.TensorMap(c, box=(64, 64), swizzle="128B")
    with pytest.raises(ptxdsl.LaunchError, match="declares swizzle 128"):
        twin.gemm[2](ta, tb, tc, 256, 256, 256)
