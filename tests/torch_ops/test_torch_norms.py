"""torch.ops.ptxdsl.rms_norm, layer_norm and softmax on rows of any length (1 to vocabulary
sizes), bf16 and f32, against torch on fresh random data: forward and backward. Without a GPU
(torch's CPU build): the ops take any row length on fake tensors and pick the kernel form;
skipped where torch is not installed. With a GPU: `pytest -m gpu tests/torch_ops -k norm`."""

from __future__ import annotations

import pytest
from conftest import cuda_empty as cuda
from test_torch_ops import rand

SIZES = (1, 1000, 1001, 2880, 4096, 128256, 151936)
OPS = ("rms_norm", "layer_norm", "softmax")
DTYPES = ("bfloat16", "float32")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op", OPS)
def test_any_row_length_is_accepted(ops, torch, fake, op, n):
    x = cuda(torch, 3, n)
    params = {"rms_norm": 1, "layer_norm": 2, "softmax": 0}[op]
    y = getattr(torch.ops.ptxdsl, op)(x, *[cuda(torch, n) for _ in range(params)])
    assert tuple(y.shape) == (3, n) and y.dtype == torch.bfloat16


# ----------------------------------------------------------------------------- GPU


def inputs(torch, op, rows, n, dt, seed):
    x = rand(torch, rows, n, dtype=dt, seed=seed) * 2 + (0.5 if op == "layer_norm" else 0.0)
    params = [1 + 0.1 * rand(torch, n, dtype=dt, seed=seed + 1)]
    params += [0.1 * rand(torch, n, dtype=dt, seed=seed + 2)] if op == "layer_norm" else []
    return x, params[:{"rms_norm": 1, "layer_norm": 2, "softmax": 0}[op]]


def reference(torch, op, x, params, eps=1e-5):
    f = torch.nn.functional
    n = x.shape[-1]
    if op == "rms_norm":
        return f.rms_norm(x, (n,), params[0], eps)
    if op == "layer_norm":
        return f.layer_norm(x, (n,), params[0], params[1], eps)
    return torch.softmax(x, -1)


def tolerance(torch, op, dt):
    if op == "softmax":
        return {"rtol": 1.6e-2, "atol": 1e-5} if dt == torch.bfloat16 else \
            {"rtol": 1e-4, "atol": 1e-6}
    return {"rtol": 1.6e-2, "atol": 2e-2} if dt == torch.bfloat16 else \
        {"rtol": 1e-4, "atol": 1e-4}


@pytest.mark.gpu
@pytest.mark.usefixtures("gpu_cache")  # a fresh autotune cache: every shape tuned here
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n", SIZES)
def test_norms_match_torch_forward_and_backward(ops, torch, n, op, dtype):
    dt = getattr(torch, dtype)
    rows = 37 if n <= 4096 else 5
    x, params = inputs(torch, op, rows, n, dt, seed=n % 1000)
    y = getattr(torch.ops.ptxdsl, op)(x, *params)
    torch.cuda.synchronize()
    want = reference(torch, op, x.float(), [p.float() for p in params])
    assert y.dtype == dt
    torch.testing.assert_close(y.float(), want, **tolerance(torch, op, dt))
    # backward (torch math over the saved inputs): against autograd through torch's op
    leaves = [t.detach().float().requires_grad_() for t in (x, *params)]
    grad = rand(torch, rows, n, dtype=torch.float32, seed=7)
    got = torch.autograd.grad(getattr(torch.ops.ptxdsl, op)(*leaves), leaves, grad)
    ref = torch.autograd.grad(reference(torch, op, leaves[0], leaves[1:]), leaves, grad)
    for g, r in zip(got, ref, strict=True):
        scale = r.abs().max().item()
        torch.testing.assert_close(g, r, rtol=1e-3, atol=1e-4 * max(scale, 1.0))


@pytest.mark.gpu
@pytest.mark.usefixtures("gpu_cache")  # a fresh autotune cache: every shape tuned here
@pytest.mark.parametrize("op", OPS)
def test_norms_of_misaligned_rows(ops, torch, op):
    """A contiguous view 2 bytes past a 16-byte boundary takes one-element loads."""
    n, rows = 1000, 9
    x, params = inputs(torch, op, rows, n, torch.bfloat16, seed=11)
    flat = torch.empty(rows * n + 1, device="cuda", dtype=torch.bfloat16)
    xv = flat[1:].view(rows, n)
    xv.copy_(x)
    assert xv.data_ptr() % 16
    y = getattr(torch.ops.ptxdsl, op)(xv, *params)
    want = reference(torch, op, x.float(), [p.float() for p in params])
    torch.testing.assert_close(y.float(), want, **tolerance(torch, op, torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.usefixtures("gpu_cache")  # a fresh autotune cache: every shape tuned here
def test_softmax_rows_from_a_causal_mask(ops, torch):
    """-inf entries (masked scores) give 0 in both forms, as torch's softmax."""
    for n in (1000, 128256):
        x = rand(torch, 4, n, dtype=torch.float32, seed=n)
        x[:, 1::2] = float("-inf")
        torch.testing.assert_close(torch.ops.ptxdsl.softmax(x), torch.softmax(x, -1),
                                   rtol=1e-4, atol=1e-6)
