"""The small-M (decode) GEMM (ptxdsl/kernels/gemm_smallm.py) on the GPU, through the gemm
op's launcher, against torch's f32 reference on fresh random bf16 data: every weight-tile
config, odd M, N off the tile, K off the 64-wide step, split and whole tiles; C is the same
bit for bit over repeated launches, and the semaphores are left at zero. The e4m3 form
likewise, per-tensor and per-row scales, every weight tile its registers allow, launched as
scaled_mm_fp8 launches it (bench/decode_gemm_fp8.py: fp8_runner), against the dequantised
f32 product and torch._scaled_mm (the op itself: tests/torch_ops/test_torch_fp8.py)."""

import pytest

from bench.common import gemm_error

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda")]

SHAPES = [(1, 4096, 4096), (7, 4104, 4096), (64, 1000, 1048), (33, 28672, 4096),
          (256, 4096, 14336), (129, 136, 72), (200, 7168, 8192), (3, 8, 8)]


def _inputs(torch, m, n, k, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g)
    return a, w


@pytest.mark.parametrize("m, n, k, bw", [(*s, bw) for s in SHAPES for bw in (128, 64, 256)
                                         if bw < 256 or s[0] <= 128])
def test_smallm_matches_torch_and_repeats_bit_for_bit(torch, ops, m, n, k, bw):
    from ptxdsl.kernels import gemm_smallm
    from ptxdsl.torch.gemm import _SEMAPHORES, smallm_runner

    a, w = _inputs(torch, m, n, k, seed=m + n + k + bw)
    stream = torch.cuda.current_stream().cuda_stream
    run = smallm_runner({"bw": bw}, gemm_smallm.pad_m(m), a, w)
    results = []
    for _ in range(3):
        c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        run((a, w), c, stream)
        torch.cuda.synchronize()
        assert gemm_error(c, a, w) <= 1.0
        results.append(c.view(torch.int16).clone())
    assert all(torch.equal(r, results[0]) for r in results[1:])
    sem = _SEMAPHORES[(a.device.index, stream)]
    assert int(sem.count_nonzero()) == 0, "semaphores not left at zero"


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
# 128-wide step where it can be; 129 rows and more in two activation tiles of 128
FP8_SHAPES = [(1, 4096, 4096), (7, 4112, 4096), (64, 1008, 1040), (33, 28672, 4096),
              (256, 4096, 14336), (129, 144, 80), (200, 7168, 8192), (3, 16, 16)]


def _fits(m, bw):
    """The e4m3 kernel holds M's activation tile with bw-row weight tiles."""
    from ptxdsl import e4m3
    from ptxdsl.kernels.gemm_smallm import max_mp, pad_m

    return pad_m(m, max_mp(64, e4m3)) <= max_mp(bw, e4m3)


@pytest.mark.parametrize("scales", ["tensor", "row"])
@pytest.mark.parametrize("m, n, k, bw", [(*s, bw) for s in FP8_SHAPES for bw in (128, 64, 256)
                                         if _fits(s[0], bw)])
def test_smallm_fp8_matches_scaled_mm_and_repeats_bit_for_bit(torch, m, n, k, bw, scales):
    """The e4m3 decode kernel (launched as scaled_mm_fp8 launches it) against the f32
    product of the dequantised inputs, and within twice that tolerance of torch._scaled_mm in
    the same scale mode; rows of A and W of magnitudes 2^-4 .. 2^4, so that a row scale
    applied to the wrong row shows."""
    from bench.decode_gemm_fp8 import fp8_error, fp8_reference, fp8_runner, quantize
    from ptxdsl.torch.gemm import _SEMAPHORES

    g = torch.Generator(device="cuda").manual_seed(m + n + k + bw)
    mags = [torch.exp2(torch.randint(-4, 5, (r, 1), device="cuda", generator=g).float())
            for r in (m, n)]
    x8, sa = quantize(torch, torch.randn(m, k, device="cuda", generator=g) * mags[0],
                      scales == "row")
    w8, sb = quantize(torch, torch.randn(n, k, device="cuda", generator=g) * mags[1],
                      scales == "row")
    run = fp8_runner(x8, w8, sa, sb, scales, bw)
    results = []
    for _ in range(3):
        c = run()
        torch.cuda.synchronize()
        assert fp8_error(c, x8, sa, w8, sb) <= 1.0
        results.append(c.view(torch.int16).clone())
    assert all(torch.equal(r, results[0]) for r in results[1:])
    theirs = torch._scaled_mm(x8, w8.T, scale_a=sa, scale_b=sb.reshape(1, -1) if scales == "row"
                              else sb, out_dtype=torch.bfloat16)
    _, tol = fp8_reference(x8, sa, w8, sb)
    assert bool(((c.float() - theirs.float()).abs() <= 2 * tol).all())
    sem = _SEMAPHORES[(x8.device.index, torch.cuda.current_stream().cuda_stream)]
    assert int(sem.count_nonzero()) == 0, "semaphores not left at zero"


def test_smallm_fp8_in_a_cuda_graph(torch):
    """The e4m3 kernel captured in a CUDA graph and replayed on new inputs (per-row scales
    updated in place too)."""
    from bench.decode_gemm_fp8 import fp8_error, fp8_runner, quantize

    g = torch.Generator(device="cuda").manual_seed(7)
    x8, sa = quantize(torch, torch.randn(16, 4096, device="cuda", generator=g), True)
    w8, sb = quantize(torch, torch.randn(6144, 4096, device="cuda", generator=g), True)
    run = fp8_runner(x8, w8, sa, sb, "row", 128)
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
