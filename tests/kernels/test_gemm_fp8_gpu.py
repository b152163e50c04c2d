"""The fp8 GEMMs (ptxdsl/kernels/gemm_fp8) on the GPU against f32 numpy references on fresh random
data, including shapes that are not tile multiples, every variant the benchmark sweeps, and
torch._scaled_mm on the same torch float8 tensors; and fp8 arrays through the runtime."""

import numpy as np
import pytest
from conftest import LIBRARY, assert_ok, sample_module

import ptxdsl
from ptxdsl import fp8
from ptxdsl import types as T
from ptxdsl.tools.runner import run_example, run_sample

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def twin():
    return sample_module("gemm_fp8")


PER_TENSOR_SHAPES = [(256, 256, 256), (1000, 1528, 1024), (4096, 4096, 4096), (333, 528, 144),
                     (8, 16, 32), (130, 4112, 272), (2048, 2048, 8192), (3000, 256, 4096)]
BLOCK_SHAPES = [(256, 256, 256), (1000, 1528, 1024), (4096, 4096, 4096), (332, 520, 384),
                (132, 4104, 128), (2048, 1024, 8192)]


@pytest.mark.parametrize("m, n, k", PER_TENSOR_SHAPES)
def test_per_tensor_scaled_gemm(twin, m, n, k):
    ex = twin.example(np.random.default_rng(m + n + k), m, n, k)
    assert_ok(run_example(twin.gemm_fp8, ex))


@pytest.mark.parametrize("m, n, k", BLOCK_SHAPES)
def test_block_scaled_gemm(twin, m, n, k):
    ex = twin.example(np.random.default_rng(m + n + k), m, n, k, kernel="gemm_fp8_block")
    assert_ok(run_example(twin.gemm_fp8_block, ex))


@pytest.mark.parametrize("cfg", [
    dict(bn=128, stages=6), dict(bn=192, stages=4), dict(bm=256, bn=128), dict(group=1),
    dict(cluster=(2, 1, 1)), dict(bn=128, stages=6, cluster=(2, 1, 1)), dict(scales="scalar"),
    dict(b_type=T.e5m2), dict(a_type=T.e5m2, b_type=T.e5m2),
], ids=str)
def test_per_tensor_variants(twin, cfg):
    kd = twin.make_gemm_fp8(**cfg)
    cl = cfg.get("cluster", (1, 1, 1))[0]
    ex = twin.example(np.random.default_rng(7), 1000, 1528, 1024, kernel=kd.name,
                      bm=cfg.get("bm", 128), bn=cfg.get("bn", 256), cluster=cl,
                      scales=cfg.get("scales", "ptr"),
                      types=(cfg.get("a_type", T.e4m3), cfg.get("b_type", T.e4m3)))
    assert_ok(run_example(kd, ex))


@pytest.mark.parametrize("cfg", [dict(stages=4), dict(bn=64, stages=8),
                                 dict(cluster=(2, 1, 1)), dict(b_type=T.e5m2)], ids=str)
def test_block_scaled_variants(twin, cfg):
    kd = twin.make_gemm_fp8(block=True, **{"bn": 128, "stages": 5, **cfg})
    cl = cfg.get("cluster", (1, 1, 1))[0]
    ex = twin.example(np.random.default_rng(8), 1000, 1528, 1024, kernel=kd.name,
                      bn=cfg.get("bn", 128), cluster=cl,
                      types=(T.e4m3, cfg.get("b_type", T.e4m3)))
    assert_ok(run_example(kd, ex))


def test_sample_text_runs():
    for _, results in run_sample(LIBRARY / "gemm_fp8.ptxdsl", seed=3):
        assert_ok(results)


@pytest.mark.parametrize("m, n, k", [(1024, 1024, 1024), (1008, 1520, 2048)])
def test_torch_float8_tensors_against_scaled_mm(twin, m, n, k):
    """torch float8 tensors zero-copy, tensor maps over them, and the benchmark's checks:
    both kernels within tolerance of the f32 reference, the per-tensor one as close to it
    as cuBLASLt's torch._scaled_mm."""
    torch = pytest.importorskip("torch")
    from bench import fp8 as bench

    torch.backends.cuda.matmul.allow_tf32 = False
    p = bench.Problem(m, n, k, seed=11)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    bench.launcher(twin.gemm_fp8, p.a8, p.b8, out, p.sa, p.sb, bm=128, bn=256)()
    torch.cuda.synchronize()
    worst, rel, _ = bench.errors(out, p, False)
    ref = p.scaled_mm(fast=False)
    _, cub_rel, _ = bench.errors(ref, p, False)
    assert worst <= 1.0 and rel <= 2 * cub_rel + 1e-4, (worst, rel, cub_rel)
    out.fill_(float("nan"))
    bench.launcher(twin.gemm_fp8_block, p.a8b, p.b8b, out, p.sfa_t, p.sfb, bm=128, bn=128)()
    torch.cuda.synchronize()
    worst, rel, _ = bench.errors(out, p, True)
    assert worst <= 1.0, (worst, rel)


@pytest.mark.parametrize("elem", [T.e4m3, T.e5m2])
def test_fp8_arrays_round_trip_and_convert_on_the_gpu(elem):
    """ml_dtypes arrays to the device and back bit for bit; the GPU's conversions to fp8
    (cvt.rn.satfinite) and back agree with the interpreter's, special values included."""
    rng = np.random.default_rng(4)
    host = fp8.quantize(rng.standard_normal(4096) * 100, elem)
    dev = ptxdsl.to_device(host)
    assert dev.dtype == T.numpy_dtype(elem)
    assert (dev.copy_to_host().view(np.uint8) == host.view(np.uint8)).all()
    name = elem.name
    prog = ptxdsl.compile(f"""
    kernel conv(x: ptr<f32>, q: ptr<{name}>, back: ptr<f32>, h: ptr<f16>) threads(128) {{
        let t = %ctaid.x * 128 + %tid.x;
        q[t] = x[t] as {name};
        back[t] = q[t] as f32;
        h[t] = q[t] as f16;
    }}""")
    x = (rng.standard_normal(4096) * np.exp2(rng.integers(-20, 20, 4096))).astype(np.float32)
    x[:6] = [np.inf, -np.inf, np.nan, 1e9, 464.0, 61440.0]
    q, back = ptxdsl.empty(4096, name), ptxdsl.empty(4096, "f32")
    h = ptxdsl.empty(4096, "f16")
    prog[32](ptxdsl.to_device(x), q, back, h)
    ptxdsl.synchronize()
    want = fp8.quantize(x, elem)
    got = q.copy_to_host()
    nan = np.isnan(want.astype(np.float32))  # NaN payloads may differ; NaN stays NaN
    assert (np.isnan(got.astype(np.float32)) == nan).all()
    assert (got.view(np.uint8)[~nan] == want.view(np.uint8)[~nan]).all()
    assert np.array_equal(back.copy_to_host(), want.astype(np.float32), equal_nan=True)
    assert np.array_equal(h.copy_to_host(), want.astype(np.float16), equal_nan=True)
