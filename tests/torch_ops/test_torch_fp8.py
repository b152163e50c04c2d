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


# --------------------------------------------------------------------- block-scaled op


def _block_args(torch, m=256, n=296, k=512):
    """Fake e4m3 operands and block scales of the layouts the op takes."""
    from conftest import cuda_empty

    a, b = (cuda_empty(torch, r, k, dtype=torch.float8_e4m3fn) for r in (m, n))
    sa = cuda_empty(torch, k // 128, m, dtype=torch.float32).t()  # (M, K / 128), strides (1, M)
    sb = cuda_empty(torch, -(-n // 128), k // 128, dtype=torch.float32)
    return a, b, sa, sb


def test_block_op_schema_and_fake_output(ops, torch, fake):
    assert str(torch.ops.ptxdsl.scaled_mm_fp8_block.default._schema) == (
        "ptxdsl::scaled_mm_fp8_block(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b) -> "
        "Tensor")
    c = torch.ops.ptxdsl.scaled_mm_fp8_block(*_block_args(torch))
    assert (c.shape, c.dtype, c.device.type) == ((256, 296), torch.bfloat16, "cuda")


BLOCK_ERRORS = [
    (lambda t, a, b, sa, sb: (a, b, sa.contiguous(), sb),
     r"scaled_mm_fp8_block: scale_a must be column-major with a 16-byte column pitch \(strides "
     r"\(1, n\), n x 4 bytes a multiple of 16\), got strides \(4, 1\) for shape \(256, 4\); "
     r"pass s.t\(\).contiguous\(\).t\(\)"),
    (lambda t, a, b, sa, sb: (a, b, sa, sb[:2]),
     r"scaled_mm_fp8_block: scale_b must have shape \(3, 4\), got \(2, 4\)"),
    (lambda t, a, b, sa, sb: (a, b, sa[:255], sb),
     r"scaled_mm_fp8_block: scale_a must have shape \(256, 4\), got \(255, 4\)"),
    (lambda t, a, b, sa, sb: (a[:, :448], b[:, :448], sa, sb),
     r"scaled_mm_fp8_block: K must be a multiple of 128 and M of 4, got M = 256, K = 448"),
    (lambda t, a, b, sa, sb: (a[:254], b, sa, sb),
     r"scaled_mm_fp8_block: K must be a multiple of 128 and M of 4, got M = 254, K = 512"),
]


@pytest.mark.parametrize("make, message", BLOCK_ERRORS)
def test_block_op_rejects(ops, torch, fake, make, message):
    with pytest.raises(ValueError, match=f"^{message}"):
        torch.ops.ptxdsl.scaled_mm_fp8_block(*make(torch, *_block_args(torch)))


def block_operands(torch, m, n, k, seed):
    """x (M x K) and w (N x K) f32 with rows of magnitudes 2^-8 .. 2^8, quantised in blocks
    (1 x 128 of x, 128 x 128 of w: amax / 448), the scales in the op's layouts, and the f32
    product of the dequantised operands."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    mags = [torch.exp2(torch.randint(-8, 9, (r, 1), device="cuda", generator=g).float())
            for r in (m, n)]
    x = torch.randn(m, k, device="cuda", generator=g) * mags[0]
    w = torch.randn(n, k, device="cuda", generator=g) * mags[1]
    xb = x.view(m, k // 128, 128)
    sa = (xb.abs().amax(2) / 448).clamp_min(1e-30)  # (M, K / 128)
    a8 = (xb / sa[:, :, None]).to(torch.float8_e4m3fn).view(m, k)
    npad = -(-n // 128) * 128
    wp = torch.zeros(npad, k, device="cuda")
    wp[:n] = w
    wb = wp.view(npad // 128, 128, k // 128, 128)
    sb = (wb.abs().amax((1, 3)) / 448).clamp_min(1e-30)
    b8 = (wb / sb[:, None, :, None]).to(torch.float8_e4m3fn).view(npad, k)[:n].contiguous()
    deq_a = a8.float() * sa.repeat_interleave(128, 1)
    deq_b = b8.float() * sb.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)
    return a8, b8, sa.t().contiguous().t(), sb.contiguous(), deq_a, deq_b


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(256, 296, 512), (1000, 1528, 1024), (4, 4096, 4096)])
def test_block_op_matches_the_dequantised_product(ops, torch, gpu_cache, monkeypatch, m, n,
                                                  k):
    """Each element within bf16 rounding plus fp8 sums' rounding scaled by its row and
    column norms (bench/fp8.py's tolerance), a second call (the plan) bit-identical."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    a8, b8, sa, sb, deq_a, deq_b = block_operands(torch, m, n, k, seed=m + n)
    c = torch.ops.ptxdsl.scaled_mm_fp8_block(a8, b8, sa, sb)
    torch.cuda.synchronize()
    ref = deq_a @ deq_b.T
    tol = 2 ** -7 * ref.abs() + 2 ** -6 * torch.outer(deq_a.norm(dim=1), deq_b.norm(dim=1)) \
        / k ** 0.5
    assert bool(((c.float() - ref).abs() <= tol).all())
    again = torch.ops.ptxdsl.scaled_mm_fp8_block(a8, b8, sa, sb)
    torch.cuda.synchronize()
    assert torch.equal(again.view(torch.int16), c.view(torch.int16))
