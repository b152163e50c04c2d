"""The GEMM ops with a decoder block's next step fused: `gemm(a, b, residual)` and
`gemm_silu_mul(a, w)` (ptxdsl/torch/gemm.py, gemm_silu.py). Without a GPU: their checks and
shapes on fake tensors, the plan each M gets (up to 256 rows the decode kernel with the fused
epilogue and its own tuner, past them the dense kernel with the epilogue in PyTorch, checked
on the CPU with a stand-in GEMM), and the residual refused where it overlaps C. With one:
both against torch's f32 reference on fresh random data, decode and dense paths, N ragged
over the weight tiles, split and whole tiles."""

from __future__ import annotations

import importlib

import pytest
from conftest import cuda_empty


def test_fused_ops_shapes_and_checks(ops, torch, fake):
    a, w, r = cuda_empty(torch, 5, 256), cuda_empty(torch, 96, 256), cuda_empty(torch, 5, 96)
    assert torch.ops.ptxdsl.gemm(a, w, r).shape == (5, 96)
    assert torch.ops.ptxdsl.gemm_silu_mul(a, w).shape == (5, 48)
    bad = [(lambda: torch.ops.ptxdsl.gemm(a, w, r[:, :88]), ValueError,
            r"gemm: residual must be C's shape \(M x N\) = \(5, 96\), got \(5, 88\)"),
           (lambda: torch.ops.ptxdsl.gemm(a, w, r.float()), TypeError,
            "gemm: residual must be bf16"),
           (lambda: torch.ops.ptxdsl.gemm(a, w, cuda_empty(torch, 96, 5).t()), ValueError,
            "residual must be contiguous"),
           (lambda: torch.ops.ptxdsl.gemm_silu_mul(a, w[:88]), ValueError,
            r"gemm_silu_mul: w .* must have a multiple of 16 rows, got \(88, 256\)"),
           (lambda: torch.ops.ptxdsl.gemm_silu_mul(a, cuda_empty(torch, 96, 128)), ValueError,
            "must have the same K")]
    for call, error, words in bad:
        with pytest.raises(error, match=words):
            call()


@pytest.mark.parametrize("op, epilogue", [("gemm", "residual"), ("gemm_silu", "silu_mul")])
def test_small_m_plans_on_the_fused_decode_kernel(ops, torch, monkeypatch, op, epilogue):
    """Up to 256 rows the plan is the decode kernel's with the epilogue, under a tuner of its
    own whose candidates are the fused builds."""
    gemm = importlib.import_module("ptxdsl.torch.gemm")  # ptxdsl.torch.gemm is the op
    module = importlib.import_module(f"ptxdsl.torch.{op}")
    seen = []
    monkeypatch.setattr(gemm, "smallm_plan", lambda *a, **kw: seen.append((a, kw)) or "decode")
    a, b = torch.empty(7, 256, dtype=torch.bfloat16), torch.empty(96, 256, dtype=torch.bfloat16)
    args = {"a": a, "b": b, "residual": torch.empty(7, 96, dtype=torch.bfloat16)} \
        if epilogue == "residual" else {"a": a, "w": b}
    assert module._plan(args, None, 0) == "decode"
    ((tensors, _, mp, tuner, _), kw), = seen
    assert mp == 8 and kw == {"epilogue": epilogue} and tensors[:2] == (a, b)
    assert len(tensors) == (3 if epilogue == "residual" else 2)
    assert tuner is gemm.smallm_tuner(8, epilogue) and tuner is not gemm.smallm_tuner(8)
    assert f".entry gemm_smallm_{epilogue}_m8_w128_" in tuner._ptx(tuner.default)


@pytest.mark.parametrize("epilogue", ["residual", "silu_mul"])
def test_past_256_rows_the_epilogue_follows_the_dense_gemm(ops, torch, monkeypatch, epilogue):
    """Past 256 rows: the dense kernel's config and run (a stand-in computing A B^T on the
    CPU), then the epilogue in PyTorch, against the same math done directly."""
    gemm = importlib.import_module("ptxdsl.torch.gemm")

    def stand_in(config, a, b, c):
        def run(tensors, out, stream):
            out.copy_(tensors[0].float() @ tensors[1].float().T)
        return run

    monkeypatch.setattr(gemm, "dense_config", lambda a, b, stream: "config")
    monkeypatch.setattr(gemm, "_runner", stand_in)
    monkeypatch.setattr(gemm, "smallm_plan", lambda *a, **kw: pytest.fail("the decode plan"))
    g = torch.Generator().manual_seed(0)
    a = torch.randn(300, 64, generator=g).to(torch.bfloat16)
    w = torch.randn(48, 64, generator=g).to(torch.bfloat16)
    c = (a.float() @ w.float().T).to(torch.bfloat16)
    if epilogue == "residual":
        r = torch.randn(300, 48, generator=g).to(torch.bfloat16)
        args, tensors, want = {"a": a, "b": w, "residual": r}, (a, w, r), c + r
        out = torch.empty(300, 48, dtype=torch.bfloat16)
    else:
        args, tensors = {"a": a, "b": w}, (a, w)
        gate = torch.cat([c[:, :8], c[:, 16:24], c[:, 32:40]], 1).float()
        up = torch.cat([c[:, 8:16], c[:, 24:32], c[:, 40:48]], 1).float()
        want = (torch.nn.functional.silu(gate) * up).to(torch.bfloat16)
        out = torch.empty(300, 24, dtype=torch.bfloat16)
    gemm.fused_plan(args, out, 0, epilogue)(tensors, out, 0)
    assert torch.equal(out, want)


def test_a_residual_overlapping_c_is_refused(ops, torch):
    from ptxdsl.torch.gemm import overlap_error

    buf = torch.empty(4 * 96, dtype=torch.bfloat16)
    c = buf[:2 * 96].view(2, 96)
    assert "must not overlap C" in overlap_error(c, c)
    assert "must not overlap C" in overlap_error(buf[95:95 + 2 * 96].view(2, 96), c)
    assert overlap_error(buf[2 * 96:].view(2, 96), c) is None  # just after C
    assert overlap_error(torch.empty(2, 96, dtype=torch.bfloat16), c) is None


# ----------------------------------------------------------------------------- GPU


def _operands(torch, m, n, k, seed):
    """A (m x k) and W (n x k) of unit normals, W over sqrt(k) (products of unit size)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).to(torch.bfloat16)
    return a, w, g


# (M, N, K): decode sizes (Llama-3-8B's o_proj and down_proj), N ragged over the weight
# tiles, 129 to 256 rows (the dense candidates in the tuning), and past 256 (the dense path)
RESIDUAL = [(1, 4096, 4096), (7, 1000, 1048), (64, 4096, 14336), (200, 4104, 4096),
            (300, 1000, 1048)]
# (M, F, K): the output is M x F of the 2 F x K interleaved weight
SILU = [(1, 14336, 4096), (7, 1000, 1048), (64, 1408, 4096), (200, 2048, 1024),
        (300, 1000, 1048)]


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", RESIDUAL)
def test_gemm_with_residual_matches_torch(ops, torch, cuda, gpu_cache, m, n, k):
    from bench.common import ref_error

    a, w, g = _operands(torch, m, n, k, seed=m + n + k)
    r = torch.randn(m, n, device="cuda", generator=g).to(torch.bfloat16)
    got = torch.ops.ptxdsl.gemm(a, w, r)
    want = a.float() @ w.float().T + r.float()
    assert ref_error(got, want, k) <= 1.0
    # the decode kernel's slot sum is in slot order: the same bits every call (from 128 rows
    # the dense kernels are candidates too, and a stream-K walk's fix-up is not ordered)
    if m < 128:
        assert torch.ops.ptxdsl.gemm(a, w, r).view(torch.int16).equal(got.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("m, f, k", SILU)
def test_gemm_silu_mul_matches_torch(ops, torch, cuda, gpu_cache, m, f, k):
    a, w, _ = _operands(torch, m, 2 * f, k, seed=m + f + k)
    got = torch.ops.ptxdsl.gemm_silu_mul(a, ops.interleave_gate_up(w))
    gate, up = (a.float() @ w.float().T).split(f, 1)
    want = torch.nn.functional.silu(gate) * up
    # C's rounding (the dense path rounds gate and up to bf16 first) grows with both
    tol = 2 ** -7 * (gate.abs() + 1) * (up.abs() + 1)
    assert float(((got.float() - want).abs() / tol).max()) <= 1.0


@pytest.mark.gpu
def test_the_runner_refuses_a_residual_overlapping_c(ops, torch, cuda):
    from ptxdsl.kernels import gemm_smallm
    from ptxdsl.torch.gemm import smallm_runner

    a, w, _ = _operands(torch, 3, 256, 128, seed=1)
    run = smallm_runner({"bw": 128}, gemm_smallm.pad_m(3), a, w, epilogue="residual")
    c = torch.zeros(3, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="must not overlap C"):
        run((a, w, c), c, torch.cuda.current_stream().cuda_stream)
