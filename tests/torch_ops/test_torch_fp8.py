"""`torch.ops.ptxdsl.scaled_mm_fp8` at decode sizes: up to 256 rows of A its plan is the e4m3
decode kernel (gemm_smallm, each 128 of K summed apart and added in f32), past them the dense
fp8 GEMM. Without a GPU: which plan a shape gets and which kernels its tuner holds. With one:
the op against the f32 product of the dequantised inputs (bench/decode_gemm_fp8.py's
fp8_error, the tolerance the tensor cores' whole-range fp8 sums failed at K = 14336) and
torch._scaled_mm, and replayed from a CUDA graph."""

from __future__ import annotations

import re

import pytest

# (M, its bucket): 129 to 256 rows in two activation tiles of 128, or in one of 256 over two
# warpgroups side by side
ROUTES = [(1, 8), (7, 8), (64, 64), (128, 128), (200, 256), (256, 256)]


@pytest.mark.parametrize("m, mp", ROUTES)
def test_small_m_plans_on_the_e4m3_decode_kernel(ops, torch, monkeypatch, m, mp):
    """_plan hands M <= 256 to the decode plan with the tuner of M's bucket, whose candidates
    (the first is what runs untuned) are all e4m3 decode kernels with per-tensor scales, none
    of the dense kernel, each over the activation tile its registers hold (smallm_tile); in
    the 256-row bucket the 64-row weight tiles' two warpgroups side by side hold it in one."""
    from ptxdsl import e4m3
    from ptxdsl.torch import fp8
    from ptxdsl.torch.kernels import smallm_configs, smallm_tile

    seen = []
    monkeypatch.setattr(fp8, "smallm_plan", lambda *a, **kw: seen.append((a, kw)) or "decode")
    monkeypatch.setattr(fp8, "_runner", lambda *a: pytest.fail("the dense kernel's runner"))
    a = torch.empty(m, 256, dtype=torch.float8_e4m3fn)
    b = torch.empty(1040, 256, dtype=torch.float8_e4m3fn)
    s = torch.ones(())
    args = {"a": a, "b": b, "scale_a": s, "scale_b": s}
    assert fp8._plan(args, torch.empty(m, 1040, dtype=torch.bfloat16), 0) == "decode"
    ((tensors, _, got_mp, tuner), kw), = seen
    assert got_mp == mp and kw == {"scales": "tensor"} and tensors[0] is a
    assert tuner is fp8.smallm_tuner(mp)
    assert tuner.configs == smallm_configs(mp, e4m3) and tuner.default == {"bw": 128}
    tiles = set()
    for c in tuner.configs:
        tile = smallm_tile(mp, c, e4m3)
        wide = ("_c2" if c.get("cols") == 2 else "") + ("_x2" if c.get("cluster") == 2 else "")
        entry = rf"\.entry gemm_smallm_e4m3_tensor_m{tile}_w{c['bw']}_s\d+{wide}\("
        assert re.search(entry, tuner._ptx(c)), entry
        tiles.add(tile)
    assert max(tiles) == mp


def test_past_256_rows_plans_on_the_dense_kernel(ops, torch, monkeypatch):
    from ptxdsl.torch import fp8
    from ptxdsl.torch.kernels import FP8_CONFIGS

    class Tuner:
        def choose(self, shape, *rest, **kw):
            self.shape = shape
            return FP8_CONFIGS[0]

    tuner = Tuner()
    monkeypatch.setattr(fp8, "TUNER", tuner)
    monkeypatch.setattr(fp8.autotune, "tuning_allowed", lambda: True)  # asks the GPU
    monkeypatch.setattr(fp8, "smallm_plan", lambda *a, **kw: pytest.fail("the decode plan"))
    monkeypatch.setattr(fp8, "_runner", lambda config, a, b, c: ("dense", config))
    a = torch.empty(257, 256, dtype=torch.float8_e4m3fn)
    b = torch.empty(1040, 256, dtype=torch.float8_e4m3fn)
    s = torch.ones(())
    args = {"a": a, "b": b, "scale_a": s, "scale_b": s}
    assert fp8._plan(args, torch.empty(257, 1040, dtype=torch.bfloat16), 0) == \
        ("dense", FP8_CONFIGS[0])
    assert tuner.shape == (512, 1040, 256)


def _operands(torch, m, n, k, seed):
    """e4m3 A and W quantised per tensor (bench's quantize: amax / 448) from normals whose
    rows have magnitudes 2^-4 .. 2^4, the scales 0-dimensional and (1,), as torch takes them."""
    from bench.decode_gemm_fp8 import quantize

    g = torch.Generator(device="cuda").manual_seed(seed)
    mags = [torch.exp2(torch.randint(-4, 5, (r, 1), device="cuda", generator=g).float())
            for r in (m, n)]
    x8, sa = quantize(torch, torch.randn(m, k, device="cuda", generator=g) * mags[0], False)
    w8, sb = quantize(torch, torch.randn(n, k, device="cuda", generator=g) * mags[1], False)
    return x8, sa.reshape(()), w8, sb


@pytest.mark.gpu
@pytest.mark.parametrize("n, k", [(4096, 14336), (1040, 1168)])
@pytest.mark.parametrize("m", [1, 7, 64, 200])
def test_scaled_mm_fp8_at_small_m_matches_the_dequantised_product(ops, torch, gpu_cache, m,
                                                                  n, k):
    """The op (tuned on its first call) against the f32 product of the dequantised inputs
    within fp8_error's tolerance, and within twice it of torch._scaled_mm; a second call
    (the plan) gives the same bits."""
    from bench.decode_gemm_fp8 import fp8_error, fp8_reference

    x8, sa, w8, sb = _operands(torch, m, n, k, seed=m + n + k)
    c = torch.ops.ptxdsl.scaled_mm_fp8(x8, w8, sa, sb)
    torch.cuda.synchronize()
    assert (c.shape, c.dtype) == ((m, n), torch.bfloat16)
    assert fp8_error(c, x8, sa, w8, sb) <= 1.0
    again = torch.ops.ptxdsl.scaled_mm_fp8(x8, w8, sa, sb)
    torch.cuda.synchronize()
    assert torch.equal(again.view(torch.int16), c.view(torch.int16))
    theirs = torch._scaled_mm(x8, w8.T, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    _, tol = fp8_reference(x8, sa, w8, sb)
    assert bool(((c.float() - theirs.float()).abs() <= 2 * tol).all())


@pytest.mark.gpu
def test_scaled_mm_fp8_at_small_m_in_a_cuda_graph(ops, torch, gpu_cache):
    """The op at M = 16 captured after tuning, replayed on new activations and scale."""
    from bench.decode_gemm_fp8 import fp8_error

    x8, sa, w8, sb = _operands(torch, 16, 6144, 4096, seed=3)
    torch.ops.ptxdsl.scaled_mm_fp8(x8, w8, sa, sb)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.ptxdsl.scaled_mm_fp8(x8, w8, sa, sb)
    fresh, fresh_s, _, _ = _operands(torch, 16, 6144, 4096, seed=4)
    x8.copy_(fresh)
    sa.copy_(fresh_s)
    graph.replay()
    torch.cuda.synchronize()
    assert fp8_error(out, x8, sa, w8, sb) <= 1.0
