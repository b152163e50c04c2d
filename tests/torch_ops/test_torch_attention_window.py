"""torch.ops.ptxdsl.attention with a sliding window (window_left, window_right, as
FlashAttention's window_size, -1 unbounded, aligned to the end as the causal mask): which
window a call means, fake outputs, what autograd runs (the backward kernels' window build), a
torch.compile trace; on the GPU the forward and the gradients against the math backend with an
explicit mask on fresh random data."""

import pytest
from conftest import compile_one_graph
from conftest import cuda_empty as cuda

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")


# ----------------------------------------------------------------------------- no GPU


def test_the_mask_of_a_call(ops):
    from ptxdsl.torch.attention import mask_of

    assert mask_of(False, -1, -1) == (False, None)
    assert mask_of(True, -1, -1) == (True, None)  # the causal mask alone
    assert mask_of(True, -1, 7) == (True, None)  # causal makes the right bound 0
    assert mask_of(False, -1, 0) == (True, None)  # causal spelled as a window: the causal build
    assert mask_of(True, 100, -1) == (False, (100, 0))
    assert mask_of(False, 3, 5) == (False, (3, 5))
    assert mask_of(False, -1, 5) == (False, (-1, 5))


def test_window_mask_matches_the_twins(ops, torch):
    """The op's mask (torch, for the recomputed backward) and the kernel twin's reference
    mask (numpy) are one band."""
    from ptxdsl.kernels.attention import window_mask as twin_mask
    from ptxdsl.torch.attention import window_mask

    for s, skv, window in ((5, 9, (2, 1)), (7, 7, (-1, 0)), (3, 40, (10, -1)), (1, 6, (0, 0))):
        got = window_mask(s, skv, window, "cpu").numpy()
        assert (got == twin_mask(s, skv, window=window)).all(), (s, skv, window)


def test_fake_outputs_with_a_window(ops, torch, fake):
    q, kv = cuda(torch, 2, 8, 100, 64), cuda(torch, 2, 2, 300, 64)
    o = torch.ops.ptxdsl.attention(q, kv, kv, window_left=64, window_right=0)
    assert (o.shape, o.dtype) == ((2, 8, 100, 64), torch.bfloat16)
    o, lse = torch.ops.ptxdsl.attention_lse(q, kv, kv, True, None, 32)
    assert (o.shape, lse.shape, lse.dtype) == ((2, 8, 100, 64), (2, 8, 100), torch.float32)


def test_a_windowed_backward_runs_the_backward_kernels(ops, torch, fake):
    """A windowed call that needs gradients runs attention_lse with its window; its backward
    node hands the window (and the softcap) to attention_backward, the kernels' op (the node
    applied directly: this host's autograd engine runs no backward on fake CUDA tensors)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    calls = []

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            calls.append((str(func), args))
            return func(*args, **(kwargs or {}))

    q = cuda(torch, 1, 4, 200, 64).requires_grad_()
    k, v = (cuda(torch, 1, 2, 260, 64).requires_grad_() for _ in "kv")
    with Mode():
        o = torch.ops.ptxdsl.attention(q, k, v, True, 0.1, 50, 10, 30.0)
        grads = o.grad_fn.apply(torch.ones_like(o))
    ours = [(name, args) for name, args in calls if name.startswith("ptxdsl")]
    assert [name for name, _ in ours] == ["ptxdsl.attention_lse.default",
                                          "ptxdsl.attention_backward.default"]
    assert ours[1][1][6:] == (True, 0.1, False, 50, 10, 30.0)
    assert [tuple(g.shape) for g in grads[1:4]] == [(1, 4, 200, 64), (1, 2, 260, 64),
                                                    (1, 2, 260, 64)]


def test_compile_with_a_window_traces_without_a_graph_break(ops, torch, fake):
    def f(q, k, v):
        return torch.ops.ptxdsl.attention(q, k, v, causal=True, window_left=128).sum(1)

    out, targets = compile_one_graph(torch, f, cuda(torch, 1, 4, 256, 128),
                                     cuda(torch, 1, 1, 300, 128), cuda(torch, 1, 1, 300, 128))
    assert out.shape == (1, 256, 128)
    assert "ptxdsl.attention" in targets


def test_window_builds_assemble_without_spills(ops, tmp_path):
    """Every config the op tunes over, in its window build, through ptxas: no spill."""
    from conftest import assemble, assert_no_spills

    from ptxdsl.torch.kernels import attention_configs, attention_kernel

    for d in (64, 128):
        for config in attention_configs(d):
            kd = attention_kernel(d, False, config["pingpong"], config["hold"], config["nwg"],
                                  True)
            assert_no_spills(assemble(kd.ptx("sm_90a"), tmp_path))


# ----------------------------------------------------------------------------- GPU


def rand(torch, *shape, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=g).to(torch.bfloat16)


def reference(torch, q, k, v, causal, left, right):
    """The math backend in f32 with the window's mask written out: row r sees keys
    r + off - left .. r + off + right, off = S_kv - S (-1 unbounded; causal: right 0)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    s, skv = q.shape[2], k.shape[2]
    rows = torch.arange(s, device=q.device)[:, None] + (skv - s)
    keys = torch.arange(skv, device=q.device)[None, :]
    right = 0 if causal else right
    mask = torch.ones(s, skv, dtype=torch.bool, device=q.device)
    if left >= 0:
        mask &= keys >= rows - left
    if right >= 0:
        mask &= keys <= rows + right
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                              enable_gqa=True)


WINDOWS = [  # b, h, kvh, s, skv, d, causal, left, right
    (2, 8, 2, 1000, 1000, 128, True, 256, -1),   # causal local attention (Mistral-style)
    (2, 4, 4, 777, 777, 64, False, 100, 100),    # a symmetric band, odd length
    (1, 8, 1, 300, 2000, 128, False, 5, 3),      # a band narrower than a block, a KV cache
    (3, 8, 2, 1, 4097, 64, True, 1000, -1),      # decode over the last 1001 keys
    (1, 4, 2, 4097, 4097, 64, False, -1, 0),     # causal spelled as a window
    (2, 4, 2, 500, 600, 128, False, 0, -1),      # a row sees its key and every later one
]


@pytest.mark.gpu
@pytest.mark.parametrize("b, h, kvh, s, skv, d, causal, left, right", WINDOWS)
def test_window_matches_the_math_backend(ops, torch, cuda, gpu_cache, b, h, kvh, s, skv, d,
                                         causal, left, right):
    q = rand(torch, b, h, s, d, seed=s + d)
    k, v = (rand(torch, b, kvh, skv, d, seed=s + d + i) for i in (1, 2))
    o = torch.ops.ptxdsl.attention(q, k, v, causal, window_left=left, window_right=right)
    ref = reference(torch, q, k, v, causal, left, right)
    assert o.dtype == torch.bfloat16 and torch.isfinite(o).all()
    err = (o.float() - ref).abs()
    assert (err <= 2**-7 * ref.abs() + 2**-7).all(), float(err.max())


@pytest.mark.gpu
def test_window_gradients_match_the_math_backend(ops, torch, cuda, gpu_cache):
    """The windowed forward's O, and gradients by the backward kernels' window build,
    against the math backend in f32."""
    q = rand(torch, 2, 8, 600, 128, seed=70).requires_grad_()
    k, v = (rand(torch, 2, 4, 700, 128, seed=70 + i).requires_grad_() for i in (1, 2))
    w = rand(torch, *q.shape, seed=73).float()
    o = torch.ops.ptxdsl.attention(q, k, v, True, None, 200)
    (o.float() * w).sum().backward()
    exact = [t.detach().float().requires_grad_() for t in (q, k, v)]
    (reference(torch, *exact, True, 200, -1) * w).sum().backward()
    for name, got, want in zip("qkv", (q.grad, k.grad, v.grad), exact, strict=True):
        err = float((got.float() - want.grad).abs().max() / want.grad.abs().max())
        assert err < 2 ** -5, f"d{name}: {err:.4f} of the largest magnitude"
