"""The attention backward (torch.ops.ptxdsl.attention_backward, the kernels of
ptxdsl/kernels/attention_bwd.py) on the GPU against torch autograd through the math-backend
SDPA in f32, on fresh random bf16 data: head dims 64 and 128, causal and not, GQA 2:1,
lengths that are no multiple of the blocks, a KV longer than the queries, and the
deterministic mode bit-identical across runs. The forward's O and LSE come from the library's
forward kernel (test_attention_gpu.run)."""

import pytest
from test_attention_gpu import run as forward

# torch's autograd worker thread warns the first time it makes a cuBLAS handle with no
# current context (the reference's first backward in the process): torch's own thread, not ours
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda"),
              pytest.mark.filterwarnings("ignore:Attempting to run cuBLAS")]


def reference(torch, q, k, v, do, causal):
    """(dQ, dK, dV) in f32 by autograd through torch's math SDPA (causal aligned to the end,
    as the forward's mask)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qf, kf, vf = (t.float().requires_grad_() for t in (q, k, v))
    s, skv = q.shape[2], k.shape[2]
    mask = torch.ones(s, skv, dtype=torch.bool, device=q.device).tril(skv - s) if causal \
        else None
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask, enable_gqa=True)
    return torch.autograd.grad(out, (qf, kf, vf), do.float())


def backward(torch, d, s, causal, *, skv=None, b=2, h=4, kvh=4, seed=0, deterministic=False):
    """(got, want, inputs): the kernels' gradients and the reference's on fresh inputs."""
    from ptxdsl.torch.attention_bwd import attention_backward

    o, lse, q, k, v = forward(torch, d, s, causal, b=b, h=h, kvh=kvh, seed=seed, skv=skv)
    g = torch.Generator(device="cuda").manual_seed(seed + 7)
    do = torch.randn(q.shape, device="cuda", dtype=torch.bfloat16, generator=g)
    got = attention_backward(q, k, v, o, lse, do, causal, None, deterministic)
    torch.cuda.synchronize()
    return got, reference(torch, q, k, v, do, causal), (q, k, v, o, lse, do)


def assert_close(got, want, tol=2 ** -5):
    """Each gradient within `tol` of the largest magnitude of its reference (bf16 P and dS
    feed the wgmmas; the reference is f32 throughout)."""
    for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert g.shape == w.shape, f"{name}: {tuple(g.shape)}, expected {tuple(w.shape)}"
        err = ((g.float() - w).abs().max() / w.abs().max()).item()
        assert err < tol, f"{name}: max error {err:.4f} of the largest magnitude"


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("s", [1000, 2048])
def test_backward_against_autograd(torch, d, causal, s):
    got, want, _ = backward(torch, d, s, causal)
    assert_close(got, want)


@pytest.mark.parametrize("d, causal", [(64, False), (128, True)])
def test_backward_gqa(torch, d, causal):
    """Two query heads per KV head: dK and dV summed over them."""
    got, want, _ = backward(torch, d, 777, causal, h=8, kvh=4)
    assert_close(got, want)


@pytest.mark.parametrize("s, skv, causal", [(17, 4097, True), (300, 1000, False)])
def test_backward_longer_kv(torch, s, skv, causal):
    """Keys outnumbering queries: the causal mask aligned to the end, key blocks whose first
    query block is past zero."""
    got, want, _ = backward(torch, 64, s, causal, skv=skv, b=1)
    assert_close(got, want)


@pytest.mark.parametrize("d", [64, 128])
def test_deterministic_backward_is_bit_identical(torch, d):
    """dQ's adds in key-block order: two runs on the same inputs give the same bits (the
    default mode need not), and the gradients are right."""
    from ptxdsl.torch.attention_bwd import attention_backward

    got, want, inputs = backward(torch, d, 2048, True, h=8, kvh=4, deterministic=True)
    assert_close(got, want)
    again = attention_backward(*inputs, True, None, True)
    for a, b in zip(got, again, strict=True):
        assert torch.equal(a, b)


def test_main_kernel_does_not_spill(torch):
    """The main kernel loaded through the driver JIT keeps its consumers' 240 registers:
    no local memory (ptxas -v reports none either, but the JIT's budget is what runs)."""
    import ptxdsl
    from ptxdsl.runtime.driver import check, driver
    from ptxdsl.torch.kernels import attention_bwd_kernel

    m = ptxdsl.runtime.load(attention_bwd_kernel(128, True).program().ptx_module)
    drv = driver()
    attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES
    assert check(drv.cuFuncGetAttribute(attr, m.kernel().function.handle),
                 "cuFuncGetAttribute") == 0
    assert "serialized" not in m.info_log and "C7504" not in m.info_log, m.info_log
