"""The small-M (decode) GEMM (ptxdsl/kernels/gemm_smallm.py) on the GPU, through the gemm
op's launcher, against torch's f32 reference on fresh random bf16 data: every config the op
tunes over at M's bucket (weight tiles; two warpgroups side by side over the activation
tile; two waves of split-K ranges), odd M, N off the tile, K off the 64-wide step, split and
whole tiles; C is the same bit for bit over repeated launches, and the semaphores are left
at zero. The e4m3 form likewise, per-tensor and per-row scales, every config, launched as
scaled_mm_fp8 launches it (bench/decode_gemm_fp8.py: fp8_runner), against the dequantised
f32 product and torch._scaled_mm (the op itself: tests/torch_ops/test_torch_fp8.py)."""

import pytest
from conftest import same_bits_thrice

from bench.common import gemm_error
from bench.decode_gemm_fp8 import config_name
from ptxdsl.kernels.gemm_smallm import pad_m

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda")]

SHAPES = [(1, 4096, 4096), (7, 4104, 4096), (64, 1000, 1048), (33, 28672, 4096),
          (256, 4096, 14336), (129, 136, 72), (200, 7168, 8192), (3, 8, 8)]


def _inputs(torch, m, n, k, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g)
    return a, w


def _seed(m, n, k, config):
    return m + n + k + config["bw"] + 7 * config.get("cols", 1) + 13 * config.get("waves", 1)


def each_config(m, dtype, check) -> None:
    """check(config) for every config the op tunes over at M's bucket (ptxdsl.torch.kernels
    imports torch, so they are looped over here, not collected), every failure named."""
    from ptxdsl.torch.kernels import smallm_configs

    failures = []
    for config in smallm_configs(pad_m(m), dtype):
        try:
            check(config)
        except AssertionError as e:
            failures.append(f"{config_name(config)}: {e}")
    assert not failures, "; ".join(failures)


@pytest.mark.parametrize("m, n, k", SHAPES)
def test_smallm_matches_torch_and_repeats_bit_for_bit(torch, ops, m, n, k):
    from ptxdsl import bf16
    from ptxdsl.torch.gemm import _SEMAPHORES, smallm_runner

    stream = torch.cuda.current_stream().cuda_stream

    def check(config):
        a, w = _inputs(torch, m, n, k, seed=_seed(m, n, k, config))
        same_bits_thrice(torch, smallm_runner(config, pad_m(m), a, w), (a, w), stream, m, n)
        sem = _SEMAPHORES[(a.device.index, stream)]
        assert int(sem.count_nonzero()) == 0, "semaphores not left at zero"

    each_config(m, bf16, check)


def test_op_at_small_m_in_a_cuda_graph(torch, ops):
    """The op at M = 16 (the decode kernel) captured in a CUDA graph after tuning, replayed on
    new inputs."""
    a, w = _inputs(torch, 16, 6144, 4096, seed=5)
    torch.ops.ptxdsl.gemm(a, w)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.ptxdsl.gemm(a, w)
    fresh, _ = _inputs(torch, 16, 6144, 4096, seed=6)
    a.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    assert gemm_error(out, a, w) <= 1.0


# e4m3: (M, N, K) with N and K multiples of 16 (torch._scaled_mm's rule too), K off the
# 128-wide step where it can be; 129 rows and more in two activation tiles of 128, or in one
# of 256 over two warpgroups side by side
FP8_SHAPES = [(1, 4096, 4096), (7, 4112, 4096), (64, 1008, 1040), (33, 28672, 4096),
              (256, 4096, 14336), (129, 144, 80), (200, 7168, 8192), (3, 16, 16),
              (255, 4096, 4096)]


@pytest.mark.parametrize("scales", ["tensor", "row"])
@pytest.mark.parametrize("m, n, k", FP8_SHAPES)
def test_smallm_fp8_matches_scaled_mm_and_repeats_bit_for_bit(torch, m, n, k, scales):
    """The e4m3 decode kernel (launched as scaled_mm_fp8 launches it) against the f32
    product of the dequantised inputs, and within twice that tolerance of torch._scaled_mm in
    the same scale mode; rows of A and W of magnitudes 2^-4 .. 2^4, so that a row scale
    applied to the wrong row shows."""
    from bench.decode_gemm_fp8 import fp8_error, fp8_reference, fp8_runner, quantize
    from ptxdsl import e4m3
    from ptxdsl.torch.gemm import _SEMAPHORES

    def check(config):
        g = torch.Generator(device="cuda").manual_seed(_seed(m, n, k, config))
        mags = [torch.exp2(torch.randint(-4, 5, (r, 1), device="cuda", generator=g).float())
                for r in (m, n)]
        x8, sa = quantize(torch, torch.randn(m, k, device="cuda", generator=g) * mags[0],
                          scales == "row")
        w8, sb = quantize(torch, torch.randn(n, k, device="cuda", generator=g) * mags[1],
                          scales == "row")
        run = fp8_runner(x8, w8, sa, sb, scales, config)
        results = []
        for _ in range(3):
            c = run()
            torch.cuda.synchronize()
            err = fp8_error(c, x8, sa, w8, sb)
            assert err <= 1.0, f"error {err:.2f} x the tolerance"
            results.append(c.view(torch.int16).clone())
        assert all(torch.equal(r, results[0]) for r in results[1:]), "repeats differ"
        theirs = torch._scaled_mm(x8, w8.T, scale_a=sa, out_dtype=torch.bfloat16,
                                  scale_b=sb.reshape(1, -1) if scales == "row" else sb)
        _, tol = fp8_reference(x8, sa, w8, sb)
        assert bool(((c.float() - theirs.float()).abs() <= 2 * tol).all()), \
            "past twice the tolerance from torch._scaled_mm"
        sem = _SEMAPHORES[(x8.device.index, torch.cuda.current_stream().cuda_stream)]
        assert int(sem.count_nonzero()) == 0, "semaphores not left at zero"

    each_config(m, e4m3, check)


def test_smallm_fp8_in_a_cuda_graph(torch):
    """The e4m3 kernel captured in a CUDA graph and replayed on new inputs (per-row scales
    updated in place too)."""
    from bench.decode_gemm_fp8 import fp8_error, fp8_runner, quantize

    g = torch.Generator(device="cuda").manual_seed(7)
    x8, sa = quantize(torch, torch.randn(16, 4096, device="cuda", generator=g), True)
    w8, sb = quantize(torch, torch.randn(6144, 4096, device="cuda", generator=g), True)
    run = fp8_runner(x8, w8, sa, sb, "row", {"bw": 128})
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    fresh, fresh_s = quantize(torch, torch.randn(16, 4096, device="cuda", generator=g) * 8, True)
    x8.copy_(fresh)
    sa.copy_(fresh_s)
    graph.replay()
    torch.cuda.synchronize()
    assert fp8_error(out, x8, sa, w8, sb) <= 1.0
