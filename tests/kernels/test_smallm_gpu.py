"""The small-M (decode) GEMM (ptxdsl/kernels/gemm_smallm.py) on the GPU, through the gemm
op's launcher, against torch's f32 reference on fresh random bf16 data: every weight-tile
config, odd M, N off the tile, K off the 64-wide step, split and whole tiles; C is the same
bit for bit over repeated launches, and the semaphores are left at zero."""

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
    from ptxdsl.torch.gemm import _SEMAPHORES, _smallm_runner

    a, w = _inputs(torch, m, n, k, seed=m + n + k + bw)
    stream = torch.cuda.current_stream().cuda_stream
    run = _smallm_runner({"bw": bw}, gemm_smallm.pad_m(m), a, w)
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
