"""ptxdsl.torch: the custom ops gemm, rms_norm, scaled_mm_fp8, layer_norm and softmax.

Without a GPU (torch's CPU build is enough): the schemas, output shapes from the fake
implementations, every input check, torch.compile(fullgraph=True) tracing the ops on fake
CUDA tensors, the declared configs compiling, the backward formulas, and the row kernels'
small configs in the interpreter. Skipped where torch is not installed (CI);
ptxdsl.tools.autotune's own tests (test_autotune.py) need no torch. With a GPU
(`pytest -m gpu tests/torch_ops/test_torch_ops.py`): results against torch, compile, CUDA graphs,
streams, and the autotune cache read by a second process."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import compile_one_graph
from conftest import cuda_empty as cuda

ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- no GPU


def test_schemas(ops, torch):
    gemm = str(torch.ops.ptxdsl.gemm.default._schema)
    assert gemm == "ptxdsl::gemm(Tensor a, Tensor b, Tensor? residual=None) -> Tensor"
    assert str(torch.ops.ptxdsl.rms_norm.default._schema).startswith(
        "ptxdsl::rms_norm(Tensor x, Tensor weight, float eps=1")


def test_import_registers_without_touching_a_gpu():
    pytest.importorskip("torch")
    code = ("import ptxdsl.torch, torch, sys; torch.ops.ptxdsl.gemm; "
            "assert 'cuda.bindings.driver' not in sys.modules")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr


def test_fake_outputs(ops, torch, fake):
    c = torch.ops.ptxdsl.gemm(cuda(torch, 100, 64), cuda(torch, 48, 64))
    assert (c.shape, c.dtype, c.device.type) == ((100, 48), torch.bfloat16, "cuda")
    x = cuda(torch, 3, 5, 1024, dtype=torch.float32)
    y = torch.ops.ptxdsl.rms_norm(x, cuda(torch, 1024, dtype=torch.float32), 1e-6)
    assert (y.shape, y.dtype) == ((3, 5, 1024), torch.float32)


def test_gemm_accepts_a_row_pitch_wider_than_k(ops, torch, fake):
    a = cuda(torch, 100, 128)[:, :64]  # rows of 256 bytes: a TMA map takes the stride
    assert torch.ops.ptxdsl.gemm(a, cuda(torch, 48, 64)).shape == (100, 48)


@pytest.mark.parametrize("m, n, k", [(1, 8, 8), (3, 24, 40), (1000, 1528, 1000),
                                     (4097, 14336, 4104)])
def test_gemm_takes_every_shape_tma_addresses(ops, torch, fake, m, n, k):
    """Sizes that no tile divides: the maps clip and zero-fill the tails."""
    assert torch.ops.ptxdsl.gemm(cuda(torch, m, k), cuda(torch, n, k)).shape == (m, n)


GEMM_ERRORS = [
    (lambda t: (cuda(t, 8, 64), cuda(t, 8, 64, dtype=t.float32)), TypeError,
     "gemm: b must be bf16, got torch.float32"),
    (lambda t: (cuda(t, 8, 64, dtype=t.float16), cuda(t, 8, 64)), TypeError,
     "gemm: a must be bf16, got torch.float16"),
    (lambda t: (cuda(t, 2, 8, 64), cuda(t, 8, 64)), ValueError,
     r"gemm: a must have 2 dimensions, got 3 \(shape \(2, 8, 64\)\)"),
    (lambda t: (cuda(t, 8, 64), cuda(t, 8, 32)), ValueError,
     r"gemm: a \(M x K\) and b \(N x K\) must have the same K, got a \(8, 64\) and b \(8, 32\)"),
    (lambda t: (cuda(t, 8, 60), cuda(t, 8, 60)), ValueError,
     r"gemm: K=60 breaks TMA's 16-byte rule: a and b are read by rows of K x 2 = 120 bytes"),
    (lambda t: (cuda(t, 8, 64), cuda(t, 12, 64)), ValueError,
     r"gemm: N=12 breaks TMA's 16-byte rule: C is written by rows of N x 2 = 24 bytes"),
    (lambda t: (cuda(t, 0, 64), cuda(t, 8, 64)), ValueError,
     "gemm: M, N and K must be at least 1, got M=0, N=8, K=64"),
    (lambda t: (cuda(t, 64, 8).T, cuda(t, 8, 64)), ValueError,
     r"gemm: a must have unit stride in its last dimension \(TMA\), got strides \(1, 8\)"),
    (lambda t: (cuda(t, 8, 68)[:, :64], cuda(t, 8, 64)), ValueError,
     "gemm: a's stride in dimension 0 must be a multiple of 16 bytes \\(TMA\\), got 136 bytes"),
]


@pytest.mark.parametrize("make, exc, message", GEMM_ERRORS)
def test_gemm_rejects(ops, torch, fake, make, exc, message):
    with pytest.raises(exc, match=f"^{message}"):
        torch.ops.ptxdsl.gemm(*make(torch))


NORM_ERRORS = [
    (lambda t: (cuda(t, 4, 1024, dtype=t.float16), cuda(t, 1024, dtype=t.float16)), TypeError,
     "rms_norm: x must be bf16 or f32, got torch.float16"),
    (lambda t: (cuda(t, 4, 1024), cuda(t, 1024, dtype=t.float32)), ValueError,
     r"rms_norm: weight must have x's dtype \(bf16\), got torch.float32"),
    (lambda t: (cuda(t, 4, 1024), cuda(t, 2048)), ValueError,
     r"rms_norm: weight must have shape \(1024,\) \(x's last dimension\), got \(2048,\)"),
    (lambda t: (cuda(t, 4, 1024), cuda(t, 1, 1024)), ValueError,
     r"rms_norm: weight must have 1 dimensions, got 2"),
    (lambda t: (cuda(t, 1024, 4).T, cuda(t, 1024)), ValueError,
     r"rms_norm: x must be contiguous \(row-major\), got strides \(1, 4\) for shape \(4, 1024\)"),
    (lambda t: (cuda(t, 2**22, 1024), cuda(t, 1024)), ValueError,
     r"rms_norm: x must have fewer than 2\*\*32 elements, got 4294967296"),
]


@pytest.mark.parametrize("make, exc, message", NORM_ERRORS)
def test_rms_norm_rejects(ops, torch, fake, make, exc, message):
    with pytest.raises(exc, match=f"^{message}"):
        torch.ops.ptxdsl.rms_norm(*make(torch))


def test_rms_norm_rejects_a_negative_eps(ops, torch, fake):
    with pytest.raises(ValueError, match=r"^rms_norm: eps must be >= 0, got -1.0$"):
        torch.ops.ptxdsl.rms_norm(cuda(torch, 4, 1024), cuda(torch, 1024), -1.0)


def test_cpu_tensors_are_named(ops, torch):
    a = torch.zeros(8, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^gemm: a must be on a CUDA device, got cpu$"):
        torch.ops.ptxdsl.gemm(a, a)
    with pytest.raises(ValueError, match="^rms_norm: x must be on a CUDA device, got cpu$"):
        torch.ops.ptxdsl.rms_norm(torch.zeros(2, 1024), torch.zeros(1024))


@pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")  # dynamo's own imports
def test_compile_traces_both_ops_without_a_graph_break(ops, torch, fake):
    def f(a, b, w):
        return torch.ops.ptxdsl.rms_norm(torch.ops.ptxdsl.gemm(a, b) * 2, w, 1e-6)

    out, targets = compile_one_graph(
        torch, f, cuda(torch, 64, 128), cuda(torch, 1024, 128), cuda(torch, 1024))
    assert out.shape == (64, 1024)
    assert targets >= {"ptxdsl.gemm", "ptxdsl.rms_norm"}


def test_every_gemm_config_compiles(ops):
    from ptxdsl.torch.kernels import GEMM_CONFIGS, gemm_kernel

    assert GEMM_CONFIGS[0] == {"bn": 256, "stages": 3, "cluster": 1}  # the benchmarked one
    assert GEMM_CONFIGS[-1] == {"bn": 256, "stages": 3, "cluster": 1, "streamk": 1}
    for c in GEMM_CONFIGS:
        info = gemm_kernel(c["bn"], c["stages"], c["cluster"],
                           c.get("streamk", 0)).program().kernels[0]
        assert info.smem_bytes <= 232448
        assert (info.cluster or (1, 1, 1))[0] == c["cluster"]


@pytest.mark.parametrize("n, dtype, warps", [(1024, "bf16", (4, 2)), (8192, "bf16", (8, 4, 16)),
                                             (32768, "bf16", (16,)), (512, "f32", (4, 2)),
                                             (1000, "bf16", (4, 2)), (7, "f32", (2,)),
                                             (128256, "bf16", (16, 32, 8))])
def test_norm_configs(ops, n, dtype, warps):
    import ptxdsl
    from ptxdsl.torch.kernels import norm_configs, norm_kernel, norm_width

    elem = ptxdsl.types.SCALARS[dtype]
    configs = norm_configs(n, elem)
    assert tuple(c["warps"] for c in configs) == warps
    config = tuple(sorted(configs[-1].items()))
    info = norm_kernel("rmsnorm", n, elem, 1e-5, norm_width(n, elem), config).program().kernels[0]
    assert info.threads[0] == 32 * warps[-1]


def test_rms_norm_backward_matches_autograd(ops, torch):
    from ptxdsl.torch.norms import rms_norm_backward

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 64, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(64, dtype=torch.float64, generator=g, requires_grad=True)
    grad = torch.randn(3, 4, 64, dtype=torch.float64, generator=g)
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-5) * w
    want_dx, want_dw = torch.autograd.grad(y, (x, w), grad)
    dx, dw = rms_norm_backward(x.detach(), w.detach(), 1e-5, grad)
    torch.testing.assert_close(dx.double(), want_dx, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dw.double(), want_dw, rtol=1e-5, atol=1e-5)


def fp8(torch, *shape):
    return cuda(torch, *shape, dtype=torch.float8_e4m3fn)


def scale(torch, *shape):
    return torch.empty(shape, device="cuda", dtype=torch.float32)


def test_schemas_of_the_other_ops(ops, torch):
    assert str(torch.ops.ptxdsl.scaled_mm_fp8.default._schema) == (
        "ptxdsl::scaled_mm_fp8(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b) -> Tensor")
    assert str(torch.ops.ptxdsl.layer_norm.default._schema).startswith(
        "ptxdsl::layer_norm(Tensor x, Tensor weight, Tensor bias, float eps=1")
    assert str(torch.ops.ptxdsl.softmax.default._schema) == "ptxdsl::softmax(Tensor x) -> Tensor"


def test_fake_outputs_of_the_other_ops(ops, torch, fake):
    # scales as torch._scaled_mm takes them: 0-dimensional or of shape (1,); N = 40 is not a
    # multiple of 16 (cuBLASLt's rule) but gives C 80-byte rows, enough for TMA
    c = torch.ops.ptxdsl.scaled_mm_fp8(fp8(torch, 100, 64), fp8(torch, 40, 64), scale(torch),
                                       scale(torch, 1))
    assert (c.shape, c.dtype, c.device.type) == ((100, 40), torch.bfloat16, "cuda")
    x = cuda(torch, 3, 5, 1024, dtype=torch.float32)
    w = cuda(torch, 1024, dtype=torch.float32)
    y = torch.ops.ptxdsl.layer_norm(x, w, w, 1e-6)
    assert (y.shape, y.dtype) == ((3, 5, 1024), torch.float32)
    p = torch.ops.ptxdsl.softmax(cuda(torch, 7, 512))
    assert (p.shape, p.dtype) == ((7, 512), torch.bfloat16)


FP8_ERRORS = [
    (lambda t: (fp8(t, 8, 64), cuda(t, 8, 64), scale(t), scale(t)), TypeError,
     "scaled_mm_fp8: b must be torch.float8_e4m3fn, got torch.bfloat16"),
    (lambda t: (fp8(t, 8, 64), fp8(t, 8, 64), scale(t, 2), scale(t)), ValueError,
     r"scaled_mm_fp8: scale_a must have 1 element, got 2 \(shape \(2,\)\)"),
    (lambda t: (fp8(t, 8, 64), fp8(t, 8, 64), scale(t), cuda(t, 1)), TypeError,
     "scaled_mm_fp8: scale_b must be f32, got torch.bfloat16"),
    (lambda t: (fp8(t, 8, 64), fp8(t, 8, 64), scale(t), t.ones(1)), ValueError,
     "scaled_mm_fp8: scale_b must be on a CUDA device, got cpu"),
    (lambda t: (fp8(t, 8, 64), fp8(t, 8, 32), scale(t), scale(t)), ValueError,
     r"scaled_mm_fp8: a \(M x K\) and b \(N x K\) must have the same K, got a \(8, 64\) "
     r"and b \(8, 32\)"),
    (lambda t: (fp8(t, 8, 56), fp8(t, 8, 56), scale(t), scale(t)), ValueError,
     r"scaled_mm_fp8: K=56 breaks TMA's 16-byte rule: a and b are read by rows of K x 1 = 56 "
     r"bytes, and a row pitch must be a multiple of 16 bytes \(K a multiple of 16\)"),
    (lambda t: (fp8(t, 8, 64), fp8(t, 12, 64), scale(t), scale(t)), ValueError,
     r"scaled_mm_fp8: N=12 breaks TMA's 16-byte rule: C is written by rows of N x 2 = 24 bytes"),
    (lambda t: (fp8(t, 64, 16).T, fp8(t, 8, 64), scale(t), scale(t)), ValueError,
     r"scaled_mm_fp8: a must have unit stride in its last dimension \(TMA\), got strides "
     r"\(1, 16\)"),
    (lambda t: (fp8(t, 8, 72)[:, :64], fp8(t, 8, 64), scale(t), scale(t)), ValueError,
     r"scaled_mm_fp8: a's stride in dimension 0 must be a multiple of 16 bytes \(TMA\), got "
     r"72 bytes"),
]


@pytest.mark.parametrize("make, exc, message", FP8_ERRORS)
def test_scaled_mm_fp8_rejects(ops, torch, fake, make, exc, message):
    with pytest.raises(exc, match=f"^{message}"):
        torch.ops.ptxdsl.scaled_mm_fp8(*make(torch))


ROW_ERRORS = [
    ("layer_norm", lambda t: (cuda(t, 4, 1024), cuda(t, 1024), cuda(t, 1024, dtype=t.float32)),
     ValueError,
     r"layer_norm: bias must have x's dtype \(bf16\), got torch.float32"),
    ("layer_norm", lambda t: (cuda(t, 4, 1024), cuda(t, 1024), cuda(t, 512)), ValueError,
     r"layer_norm: bias must have shape \(1024,\) \(x's last dimension\), got \(512,\)"),
    ("layer_norm", lambda t: (cuda(t, 4, 1024), cuda(t, 1024), cuda(t, 1024), -1.0), ValueError,
     r"layer_norm: eps must be >= 0, got -1.0$"),
    ("softmax", lambda t: (cuda(t, 4, 1024, dtype=t.float16),), TypeError,
     "softmax: x must be bf16 or f32, got torch.float16"),
    ("softmax", lambda t: (cuda(t, 1024, 4).T,), ValueError,
     r"softmax: x must be contiguous \(row-major\), got strides \(1, 4\) for shape "
     r"\(4, 1024\)"),
]


@pytest.mark.parametrize("op, make, exc, message", ROW_ERRORS)
def test_row_ops_reject(ops, torch, fake, op, make, exc, message):
    with pytest.raises(exc, match=f"^{message}"):
        getattr(torch.ops.ptxdsl, op)(*make(torch))


def test_cpu_tensors_are_named_by_the_other_ops(ops, torch):
    a = torch.zeros(8, 64, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="^scaled_mm_fp8: a must be on a CUDA device, got cpu$"):
        torch.ops.ptxdsl.scaled_mm_fp8(a, a, torch.ones(()), torch.ones(()))
    x = torch.zeros(2, 1024)
    with pytest.raises(ValueError, match="^layer_norm: x must be on a CUDA device, got cpu$"):
        torch.ops.ptxdsl.layer_norm(x, x[0], x[0])
    with pytest.raises(ValueError, match="^softmax: x must be on a CUDA device, got cpu$"):
        torch.ops.ptxdsl.softmax(x)


@pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")  # dynamo's own imports
def test_compile_traces_the_other_ops_without_a_graph_break(ops, torch, fake):
    def f(a, b, sa, sb, w, bias):
        c = torch.ops.ptxdsl.scaled_mm_fp8(a, b, sa, sb)
        return torch.ops.ptxdsl.softmax(torch.ops.ptxdsl.layer_norm(c, w, bias, 1e-6) * 2)

    out, targets = compile_one_graph(
        torch, f, fp8(torch, 64, 128), fp8(torch, 1024, 128), scale(torch), scale(torch),
        cuda(torch, 1024), cuda(torch, 1024))
    assert out.shape == (64, 1024) and out.dtype == torch.bfloat16
    assert targets >= {"ptxdsl.scaled_mm_fp8", "ptxdsl.layer_norm", "ptxdsl.softmax"}


def test_every_fp8_config_compiles(ops):
    from ptxdsl.torch.kernels import FP8_CONFIGS, fp8_kernel

    assert FP8_CONFIGS[0] == {"bn": 256, "stages": 3, "cluster": 1}  # the benchmarked one
    assert len(FP8_CONFIGS) == 4
    for c in FP8_CONFIGS:
        info = fp8_kernel(c["bn"], c["stages"], c["cluster"]).program().kernels[0]
        assert info.smem_bytes <= 232448
        assert (info.cluster or (1, 1, 1))[0] == c["cluster"]


def test_layer_norm_backward_matches_autograd(ops, torch):
    from ptxdsl.torch.norms import layer_norm_backward

    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 4, 64, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(64, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(64, dtype=torch.float64, generator=g, requires_grad=True)
    grad = torch.randn(3, 4, 64, dtype=torch.float64, generator=g)
    y = torch.nn.functional.layer_norm(x, (64,), w, b, 1e-5)
    want = torch.autograd.grad(y, (x, w, b), grad)
    got = layer_norm_backward(x.detach(), w.detach(), 1e-5, grad)
    for have, expected in zip(got, want, strict=True):
        torch.testing.assert_close(have.double(), expected, rtol=1e-5, atol=1e-5)


def test_softmax_backward_matches_autograd(ops, torch):
    from ptxdsl.torch.norms import softmax_backward

    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 2, 48, dtype=torch.float64, generator=g, requires_grad=True)
    grad = torch.randn(5, 2, 48, dtype=torch.float64, generator=g)
    y = torch.softmax(x, -1)
    (want,) = torch.autograd.grad(y, (x,), grad)
    torch.testing.assert_close(softmax_backward(y.detach(), grad).double(), want, rtol=1e-5,
                               atol=1e-5)


# ----------------------------------------------------------------------------- GPU


def rand(torch, *shape, dtype=None, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=g).to(dtype or torch.bfloat16)


def check_gemm(torch, c, a, b):
    ref = a.float() @ b.float().T
    k = a.shape[1]
    torch.testing.assert_close(c.float(), ref, rtol=2**-7, atol=2**-7 * math.sqrt(k) * 4)


def ref_rms_norm(torch, x, w, eps):
    xf = x.float()
    return xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * w.float()


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(128, 256, 64), (1000, 1528, 1000), (257, 136, 72),
                                     (8, 8, 8), (2048, 1024, 512), (1, 8, 8), (3, 24, 40),
                                     (129, 264, 8)])
def test_gemm_matches_torch(ops, torch, gpu_cache, m, n, k):
    a, b = rand(torch, m, k, seed=m), rand(torch, n, k, seed=n + 1)
    c = torch.ops.ptxdsl.gemm(a, b)
    torch.cuda.synchronize()
    check_gemm(torch, c, a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(2432, 1792, 1024), (300, 520, 136)])
def test_gemm_stream_k_config_matches_torch(ops, torch, gpu_cache, m, n, k):
    """The tuner's stream-K config run directly, on the current stream and on a side stream
    made current (results only: the stream its workspace is allocated on is not observable
    here)."""
    from ptxdsl.torch.gemm import GEMM_CONFIGS, _runner

    config = GEMM_CONFIGS[-1]
    assert config.get("streamk")
    a, b = rand(torch, m, k, seed=m), rand(torch, n, k, seed=k)
    for side in (False, True):
        s = torch.cuda.Stream() if side else torch.cuda.current_stream()
        c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # a run launches on torch's current stream
            _runner(config, a, b, c)((a, b), c, s.cuda_stream)
        s.synchronize()
        check_gemm(torch, c, a, b)


@pytest.mark.gpu
def test_gemm_on_strided_views_and_a_side_stream(ops, torch, gpu_cache):
    a = rand(torch, 300, 256, seed=3)[:, :192]
    b = rand(torch, 264, 192, seed=4)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        c = torch.ops.ptxdsl.gemm(a, b)
    s.synchronize()
    check_gemm(torch, c, a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("shape, dtype", [((4, 4096), "bfloat16"), ((3, 5, 2048), "float32"),
                                          ((7, 512), "bfloat16"), ((33, 8192), "bfloat16"),
                                          ((2, 1536), "float32")])
def test_rms_norm_matches_torch(ops, torch, gpu_cache, shape, dtype):
    dt = getattr(torch, dtype)
    x = rand(torch, *shape, dtype=dt, seed=1) * 2
    w = 1 + 0.1 * rand(torch, shape[-1], dtype=dt, seed=2)
    y = torch.ops.ptxdsl.rms_norm(x, w, 1e-6)
    torch.cuda.synchronize()
    tol = {"rtol": 1.6e-2, "atol": 2e-2} if dt == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(y.float(), ref_rms_norm(torch, x, w, 1e-6), **tol)


@pytest.mark.gpu
def test_rms_norm_backward_on_the_gpu(ops, torch, gpu_cache):
    x = rand(torch, 6, 2048, dtype=torch.float32, seed=5).requires_grad_()
    w = (1 + 0.1 * rand(torch, 2048, dtype=torch.float32, seed=6)).requires_grad_()
    grad = rand(torch, 6, 2048, dtype=torch.float32, seed=7)
    dx, dw = torch.autograd.grad(torch.ops.ptxdsl.rms_norm(x, w), (x, w), grad)
    want = torch.autograd.grad(ref_rms_norm(torch, x, w, 1e-5), (x, w), grad)
    torch.testing.assert_close(dx, want[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dw, want[1], rtol=1e-4, atol=1e-4)


def block(torch, a, b, w):
    return torch.ops.ptxdsl.rms_norm(torch.ops.ptxdsl.gemm(a, b), w, 1e-5)


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:TensorFloat32 tensor cores")  # inductor's advice
@pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")  # inductor's own imports
def test_compiled_equals_eager_without_a_graph_break(ops, torch, gpu_cache):
    from torch._dynamo.utils import counters

    a, b = rand(torch, 256, 512, seed=8), rand(torch, 2048, 512, seed=9)
    w = 1 + 0.1 * rand(torch, 2048, seed=10)
    torch._dynamo.reset()
    counters.clear()
    explained = torch._dynamo.explain(lambda a, b, w: block(torch, a, b, w))(a, b, w)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    compiled = torch.compile(lambda a, b, w: block(torch, a, b, w), fullgraph=True)
    got = compiled(a, b, w)
    torch.testing.assert_close(got, block(torch, a, b, w), rtol=0, atol=0)
    assert dict(counters["graph_break"]) == {}


@pytest.mark.gpu
def test_cuda_graph_replay_equals_eager(ops, torch, gpu_cache):
    a, b = rand(torch, 512, 256, seed=11), rand(torch, 1024, 256, seed=12)
    w = 1 + 0.1 * rand(torch, 1024, seed=13)
    block(torch, a, b, w)  # tune and load before capturing
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = block(torch, a, b, w)
    a.copy_(rand(torch, 512, 256, seed=14))
    b.copy_(rand(torch, 1024, 256, seed=15))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, block(torch, a, b, w), rtol=0, atol=0)


@pytest.mark.gpu
def test_autotune_cache_is_read_by_a_second_process(ops, torch, gpu_cache):
    script = textwrap.dedent("""
        import torch, ptxdsl.torch
        a = torch.randn(384, 256, device="cuda").bfloat16()
        b = torch.randn(512, 256, device="cuda").bfloat16()
        torch.ops.ptxdsl.gemm(a, b)
        torch.cuda.synchronize()
    """)
    env = {**os.environ, "PTXDSL_CACHE_DIR": str(gpu_cache), "PTXDSL_AUTOTUNE_LOG": "1"}
    env.pop("PTXDSL_AUTOTUNE", None)
    logs = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        logs.append(r.stderr)
    from ptxdsl.torch.gemm import wave_fill

    key = f"(512, 512, 256, {wave_fill(384, 512, 0)})"  # M rounded up; the last wave's fill
    assert f"ptxdsl autotune ptxdsl::gemm {key}: tuned " in logs[0]
    assert "tuned" not in logs[1]
    assert f"{key}: " in logs[1] and "ptxdsl.gemm.json" in logs[1]


@pytest.mark.gpu
def test_autotune_off_runs_the_default(ops, torch, gpu_cache, monkeypatch, capsys):
    monkeypatch.setenv("PTXDSL_AUTOTUNE", "0")
    monkeypatch.setenv("PTXDSL_AUTOTUNE_LOG", "1")
    a, b = rand(torch, 640, 128, seed=16), rand(torch, 384, 128, seed=17)
    check_gemm(torch, torch.ops.ptxdsl.gemm(a, b), a, b)
    assert "ptxdsl autotune" not in capsys.readouterr().err


@pytest.mark.gpu
def test_bad_inputs_raise_before_a_launch(ops, torch, gpu_cache):
    a = rand(torch, 64 * 64 + 8).view(-1)[8:].view(64, 64)  # 16-byte aligned
    torch.ops.ptxdsl.gemm(a, a)
    # 2 bytes off, with the shape and strides just checked: the per-call address check
    bad = rand(torch, 64 * 64 + 1).view(-1)[1:].view(64, 64)
    with pytest.raises(ValueError, match="^gemm: a's address must be 16-byte aligned"):
        torch.ops.ptxdsl.gemm(bad, a)
    with pytest.raises(TypeError, match="^rms_norm: x must be bf16 or f32, got torch.float16$"):
        torch.ops.ptxdsl.rms_norm(a.half(), a[0].half())
    with pytest.raises(ValueError, match="^gemm: b must be on a CUDA device, got cpu$"):
        torch.ops.ptxdsl.gemm(a, a.cpu())
    torch.cuda.synchronize()  # nothing faulted


def fp8_operands(torch, m, n, k, seed):
    """e4m3 A and B from standard normals, per-tensor scales in [0.5, 2), and the f32 product
    of the dequantised inputs."""
    a = rand(torch, m, k, dtype=torch.float32, seed=seed).to(torch.float8_e4m3fn)
    b = rand(torch, n, k, dtype=torch.float32, seed=seed + 1).to(torch.float8_e4m3fn)
    g = torch.Generator(device="cuda").manual_seed(seed + 2)
    scales = 0.5 + 1.5 * torch.rand(2, device="cuda", generator=g)
    sa, sb = scales[0].clone(), scales[1:].clone()  # 0-dimensional and (1,), as torch takes
    ref = (a.float() @ b.float().T) * (sa * sb)
    return a, b, sa, sb, ref


def check_fp8(torch, c, ref, k, sa, sb):
    atol = 2**-6 * math.sqrt(k) * float(sa) * float(sb)  # the tensor cores' fp8 sums
    torch.testing.assert_close(c.float(), ref, rtol=2**-7, atol=atol)


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(128, 256, 128), (1000, 1528, 1024), (257, 136, 80),
                                     (8, 8, 16), (2048, 1024, 512)])
def test_scaled_mm_fp8_matches_torch(ops, torch, gpu_cache, m, n, k):
    a, b, sa, sb, ref = fp8_operands(torch, m, n, k, seed=m + n)
    c = torch.ops.ptxdsl.scaled_mm_fp8(a, b, sa, sb)
    torch.cuda.synchronize()
    assert (c.shape, c.dtype) == ((m, n), torch.bfloat16)
    check_fp8(torch, c, ref, k, sa, sb)
    if n % 16 == 0:  # cuBLASLt's own rule; the same result within the same tolerance
        want = torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                use_fast_accum=True)
        check_fp8(torch, c, want.float(), k, sa, sb)


@pytest.mark.gpu
def test_scaled_mm_fp8_on_a_strided_view_and_a_side_stream(ops, torch, gpu_cache):
    a, b, sa, sb, _ = fp8_operands(torch, 300, 264, 256, seed=20)
    a = a[:, :192]  # rows of 256 bytes, 192 used
    b = b[:, :192].contiguous()
    ref = (a.float() @ b.float().T) * (sa * sb)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        c = torch.ops.ptxdsl.scaled_mm_fp8(a, b, sa, sb)
    s.synchronize()
    check_fp8(torch, c, ref, 192, sa, sb)


ROW_SHAPES = [((4, 4096), "bfloat16"), ((3, 5, 2048), "float32"), ((7, 512), "bfloat16"),
              ((33, 8192), "bfloat16"), ((37, 1536), "float32"), ((1, 1024), "bfloat16")]


def row_tol(torch, dt, f32_tol):
    if dt == torch.bfloat16:
        return {"rtol": 1.6e-2, "atol": 2e-2}
    return {"rtol": f32_tol, "atol": f32_tol}


@pytest.mark.gpu
@pytest.mark.parametrize("shape, dtype", ROW_SHAPES)
def test_layer_norm_matches_torch(ops, torch, gpu_cache, shape, dtype):
    dt = getattr(torch, dtype)
    n = shape[-1]
    x = rand(torch, *shape, dtype=dt, seed=21) * 2 + 0.5
    w = 1 + 0.1 * rand(torch, n, dtype=dt, seed=22)
    b = 0.1 * rand(torch, n, dtype=dt, seed=23)
    y = torch.ops.ptxdsl.layer_norm(x, w, b, 1e-6)
    torch.cuda.synchronize()
    want = torch.nn.functional.layer_norm(x.float(), (n,), w.float(), b.float(), 1e-6)
    assert y.dtype == dt
    torch.testing.assert_close(y.float(), want, **row_tol(torch, dt, 1e-4))


@pytest.mark.gpu
@pytest.mark.parametrize("shape, dtype", ROW_SHAPES)
def test_softmax_matches_torch(ops, torch, gpu_cache, shape, dtype):
    dt = getattr(torch, dtype)
    x = rand(torch, *shape, dtype=dt, seed=24) * 4
    y = torch.ops.ptxdsl.softmax(x)
    torch.cuda.synchronize()
    want = torch.softmax(x.float(), -1)
    assert y.dtype == dt
    tol = {"rtol": 1.6e-2, "atol": 1e-5} if dt == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-6}
    torch.testing.assert_close(y.float(), want, **tol)


@pytest.mark.gpu
def test_layer_norm_and_softmax_backward_on_the_gpu(ops, torch, gpu_cache):
    x = rand(torch, 6, 2048, dtype=torch.float32, seed=25).requires_grad_()
    w = (1 + 0.1 * rand(torch, 2048, dtype=torch.float32, seed=26)).requires_grad_()
    b = (0.1 * rand(torch, 2048, dtype=torch.float32, seed=27)).requires_grad_()
    grad = rand(torch, 6, 2048, dtype=torch.float32, seed=28)
    got = torch.autograd.grad(torch.ops.ptxdsl.layer_norm(x, w, b), (x, w, b), grad)
    want = torch.autograd.grad(torch.nn.functional.layer_norm(x, (2048,), w, b, 1e-5),
                               (x, w, b), grad)
    for have, expected in zip(got, want, strict=True):
        torch.testing.assert_close(have, expected, rtol=1e-4, atol=1e-4)
    (dx,) = torch.autograd.grad(torch.ops.ptxdsl.softmax(x * 4), (x,), grad)
    (want_dx,) = torch.autograd.grad(torch.softmax(x * 4, -1), (x,), grad)
    torch.testing.assert_close(dx, want_dx, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:TensorFloat32 tensor cores")  # inductor's advice
@pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")  # inductor's own imports
def test_the_other_ops_compiled_equal_eager(ops, torch, gpu_cache):
    from torch._dynamo.utils import counters

    a, b, sa, sb, _ = fp8_operands(torch, 256, 1024, 256, seed=29)
    w = 1 + 0.1 * rand(torch, 1024, seed=30)
    bias = 0.1 * rand(torch, 1024, seed=31)

    def f(a, b, sa, sb, w, bias):
        c = torch.ops.ptxdsl.scaled_mm_fp8(a, b, sa, sb)
        return torch.ops.ptxdsl.softmax(torch.ops.ptxdsl.layer_norm(c, w, bias, 1e-5))

    torch._dynamo.reset()
    counters.clear()
    got = torch.compile(f, fullgraph=True)(a, b, sa, sb, w, bias)
    torch.testing.assert_close(got, f(a, b, sa, sb, w, bias), rtol=0, atol=0)
    assert dict(counters["graph_break"]) == {}


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm", "softmax"])
@pytest.mark.parametrize("n, dtype", [(1024, "bf16"), (512, "f32"), (33, "bf16"), (1000, "f32")])
def test_small_norm_configs_run_in_the_interpreter(ops, kind, n, dtype):
    """The warp counts below the benchmarked ones (2 and 4), and masked rows (33, 1000),
    compute each row operation on the CPU model of the GPU, against the family's float64
    reference (the GPU tests run them too)."""
    import numpy as np

    import ptxdsl
    from ptxdsl.interp.run import run
    from ptxdsl.kernels.norms import reference
    from ptxdsl.torch.kernels import norm_configs, norm_kernel, norm_width

    elem = ptxdsl.types.SCALARS[dtype]
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, n)) * 2).astype(ptxdsl.types.numpy_dtype(elem))
    w = (1 + 0.1 * rng.standard_normal(n)).astype(x.dtype)
    b = (0.1 * rng.standard_normal(n)).astype(x.dtype)
    want = reference(kind, x.astype(np.float64), w.astype(np.float64), b.astype(np.float64),
                     1e-5)
    params = {"rmsnorm": {"w": w}, "layernorm": {"w": w, "b": b}, "softmax": {}}[kind]
    for config in norm_configs(n, elem):
        y = np.zeros_like(x)
        kd = norm_kernel(kind, n, elem, 1e-5, norm_width(n, elem), tuple(sorted(config.items())))
        run(kd, 2, {"x": x, **params, "y": y, "rows": 3})
        tol = 2e-2 if dtype == "bf16" else 1e-5
        assert np.abs(y.astype(np.float64) - want).max() <= tol, config
