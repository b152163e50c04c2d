"""The attention op's backward: a call that needs a gradient runs
torch.ops.ptxdsl.attention_lse (O and the LSE kept) and its backward
torch.ops.ptxdsl.attention_backward, while a call that needs none runs the plain op. Without a
GPU: the schemas, fake outputs and input errors, what autograd records and calls (fake
tensors; this host's autograd engine cannot run a backward on fake CUDA tensors, so the
backward node is applied directly), and a torch.compile(fullgraph=True) trace. On the GPU:
gradients against autograd through the math-backend SDPA in f32 on fresh random bf16 data
(head dim 64 and 128, causal or not, GQA 2:1, lengths no multiple of 128, transposed
views), the deterministic mode, and the same under torch.compile."""

import pytest
from conftest import compile_one_graph
from conftest import cuda_empty as cuda

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")


# ----------------------------------------------------------------------------- no GPU


def test_schemas(ops, torch):
    assert str(torch.ops.ptxdsl.attention_lse.default._schema) == (
        "ptxdsl::attention_lse(Tensor q, Tensor k, Tensor v, bool causal=False, "
        "float? scale=None, int window_left=-1, int window_right=-1, float softcap=0.) -> "
        "(Tensor, Tensor)")
    assert str(torch.ops.ptxdsl.attention_backward.default._schema) == (
        "ptxdsl::attention_backward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, "
        "Tensor do, bool causal=False, float? scale=None, bool deterministic=False, "
        "int window_left=-1, int window_right=-1, float softcap=0.) -> "
        "(Tensor, Tensor, Tensor)")


def test_fake_outputs(ops, torch, fake):
    q, k = cuda(torch, 2, 8, 100, 128), cuda(torch, 2, 4, 300, 128)
    o, lse = torch.ops.ptxdsl.attention_lse(q, k, k, causal=False)
    assert (o.shape, o.dtype) == ((2, 8, 100, 128), torch.bfloat16)
    assert (lse.shape, lse.dtype, lse.device.type) == ((2, 8, 100), torch.float32, "cuda")
    dq, dk, dv = torch.ops.ptxdsl.attention_backward(q, k, k, o, lse, o, deterministic=True)
    assert (dq.shape, dk.shape, dv.shape) == ((2, 8, 100, 128), (2, 4, 300, 128),
                                              (2, 4, 300, 128))
    assert {t.dtype for t in (dq, dk, dv)} == {torch.bfloat16}


def bad_backward_inputs(torch):
    q, kv = cuda(torch, 2, 4, 64, 128), cuda(torch, 2, 2, 64, 128)
    lse = cuda(torch, 2, 4, 64, dtype=torch.float32)
    return [
        ((q, kv, kv, q, lse.bfloat16(), q), TypeError, "^attention_backward: lse must be f32"),
        ((q, kv, kv, q[:, :, :32], lse, q), ValueError, "o and do must have q's shape"),
        ((q, kv, kv, q, lse[:, :2], q), ValueError, r"lse must be \(B, H, S\) = \(2, 4, 64\)"),
        ((q, kv, kv, q, lse, cuda(torch, 2, 4, 64, 256)[..., :128]), ValueError,
         "do must be contiguous"),
        ((q, kv[:, :, :10], kv[:, :, :10], q, lse, q, True), ValueError,
         "causal or a window, as many keys as queries"),
        ((q, kv, kv, q, lse, q, False, 0.0), ValueError, "scale must be positive"),
        ((cuda(torch, 64, 1024, 512, 128),) + (cuda(torch, 64, 1024, 512, 128),) * 2
         + (cuda(torch, 64, 1024, 512, 128), cuda(torch, 64, 1024, 512, dtype=torch.float32),
            cuda(torch, 64, 1024, 512, 128)), ValueError,
         r"B \* H \* max\(S, S_kv\) \* D must be below 2\*\*32"),
    ]


@pytest.mark.parametrize("case", range(7))
def test_bad_backward_inputs_are_named(ops, torch, fake, case):
    args, exc, message = bad_backward_inputs(torch)[case]
    with pytest.raises(exc, match=message):
        torch.ops.ptxdsl.attention_backward(*args)


def test_every_bad_backward_case_runs(ops, torch, fake):
    assert len(bad_backward_inputs(torch)) == 7


class Calls:
    """The ops that reach the dispatcher below autograd (a TorchDispatchMode)."""

    def __init__(self, torch):
        from torch.utils._python_dispatch import TorchDispatchMode

        calls = self.calls = []

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                calls.append((str(func), args))
                return func(*args, **(kwargs or {}))

        self.mode = Mode()

    def named(self, prefix):
        return [(name, args) for name, args in self.calls if name.startswith(prefix)]


def inputs(torch, grad, b=1, h=4, kvh=2, s=200, skv=200, d=64):
    q = cuda(torch, b, h, s, d).requires_grad_(grad)
    k, v = (cuda(torch, b, kvh, skv, d).requires_grad_(grad) for _ in "kv")
    return q, k, v


def test_a_call_without_gradients_runs_the_plain_op(ops, torch, fake):
    q, k, v = inputs(torch, False)
    calls = Calls(torch)
    with calls.mode:
        torch.ops.ptxdsl.attention(q, k, v, True)
    assert [n for n, _ in calls.named("ptxdsl")] == ["ptxdsl.attention.default"]


@pytest.mark.parametrize("deterministic", [False, True])
def test_autograd_keeps_o_and_the_lse_for_the_backward_kernels(ops, torch, fake,
                                                               deterministic):
    q, k, v = inputs(torch, True)
    calls = Calls(torch)
    with calls.mode:
        o = torch.ops.ptxdsl.attention(q, k, v, True, 0.2)
    assert [n for n, _ in calls.named("ptxdsl")] == ["ptxdsl.attention_lse.default"]
    saved = [(tuple(t.shape), t.dtype) for t in o.grad_fn.saved_tensors]
    assert saved[3:] == [((1, 4, 200, 64), torch.bfloat16), ((1, 4, 200), torch.float32)]
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        with calls.mode:  # the backward node, applied without the autograd engine
            grads = o.grad_fn.apply(torch.ones_like(o).transpose(1, 2).contiguous()
                                    .transpose(1, 2))
    finally:
        torch.use_deterministic_algorithms(was)
    (_, args), = calls.named("ptxdsl.attention_backward")
    assert (args[4].shape, args[4].dtype) == ((1, 4, 200), torch.float32)  # the LSE
    assert args[5].is_contiguous() and args[6:8] == (True, 0.2)
    assert (args[8] if len(args) > 8 else False) == deterministic  # a default is dropped
    assert [tuple(g.shape) for g in grads[1:4]] == [(1, 4, 200, 64), (1, 2, 200, 64),
                                                    (1, 2, 200, 64)]


def test_sizes_the_kernels_do_not_take(ops):
    from ptxdsl.torch.attention_bwd import takes

    assert takes(2, 8, 1000, 1000, 128)
    assert not takes(2, 8, 0, 1000, 128)  # no query rows: torch differentiates
    assert not takes(64, 1024, 512, 512, 128)  # 2**32 elements


def test_compile_with_a_backward_traces_without_a_graph_break(ops, torch, fake):
    """Dynamo takes the op with inputs that need gradients in one graph; its output carries
    the op's backward node (AOTAutograd's trace of that backward needs the autograd engine
    on CUDA tensors: the GPU test below)."""
    def f(q, k, v):
        return torch.ops.ptxdsl.attention(q * 2, k, v, causal=True).float().sum()

    out, targets = compile_one_graph(torch, f, *inputs(torch, True, s=256, skv=256))
    assert out.requires_grad and "ptxdsl.attention" in targets


# ----------------------------------------------------------------------------- GPU


def rand(torch, *shape, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=g).to(torch.bfloat16)


def reference(torch, q, k, v, causal):
    """The math backend in f32, causal aligned to the end."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    s, skv = q.shape[2], k.shape[2]
    mask = torch.ones(s, skv, dtype=torch.bool, device=q.device).tril(skv - s) if causal \
        else None
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def leaves(torch, b, h, kvh, s, skv, d, seed):
    q = rand(torch, b, h, s, d, seed=seed).requires_grad_()
    k, v = (rand(torch, b, kvh, skv, d, seed=seed + i).requires_grad_() for i in (1, 2))
    return q, k, v


def assert_grads_close(torch, fn, q, k, v, causal, seed):
    """fn(q, k, v)'s gradients of sum(out * w), w random, against the math backend's in
    f32: each within 2**-5 of its reference's largest magnitude (the backward kernels' test
    bound: bf16 P and dS feed their wgmmas)."""
    w = rand(torch, *q.shape, seed=seed + 3).float()
    (fn(q, k, v).float() * w).sum().backward()
    exact = [t.detach().float().requires_grad_() for t in (q, k, v)]
    (reference(torch, *exact, causal) * w).sum().backward()
    for name, got, want in zip("qkv", (q.grad, k.grad, v.grad), exact, strict=True):
        assert got.dtype == torch.bfloat16 and got.shape == want.shape
        err = float((got.float() - want.grad).abs().max() / want.grad.abs().max())
        assert err < 2 ** -5, f"d{name}: {err:.4f} of the largest magnitude"


CASES = [  # b, h, kvh, s, skv, causal
    (2, 8, 4, 1000, 1000, False), (2, 8, 4, 1000, 1000, True), (1, 4, 4, 777, 777, True),
    (2, 4, 2, 40, 260, True), (2, 4, 2, 200, 130, False),
    (2, 8, 2, 40, 300, False)]  # GQA 4:1 packed into one row tile: the LSE over the packed view


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("b, h, kvh, s, skv, causal", CASES)
def test_gradients_match_the_math_backend(ops, torch, cuda, gpu_cache, d, b, h, kvh, s, skv,
                                          causal):
    q, k, v = leaves(torch, b, h, kvh, s, skv, d, seed=d + s)

    def op(q, k, v):
        return torch.ops.ptxdsl.attention(q, k, v, causal)

    assert_grads_close(torch, op, q, k, v, causal, seed=d + s)


@pytest.mark.gpu
def test_gradients_of_transposed_views(ops, torch, cuda, gpu_cache):
    """q, k and v as slices of one (B, S, heads, D) projection, transposed: the backward
    kernels read them through tensor maps, in place; the gradient reaches the projection."""
    qkv = rand(torch, 2, 555, 12, 128, seed=7).requires_grad_()

    def op(qkv):
        q, k, v = (qkv[:, :, a:b].transpose(1, 2) for a, b in ((0, 8), (8, 10), (10, 12)))
        return torch.ops.ptxdsl.attention(q, k, v, True)

    def exact(qkv):
        q, k, v = (qkv[:, :, a:b].transpose(1, 2) for a, b in ((0, 8), (8, 10), (10, 12)))
        return reference(torch, q, k, v, True)

    w = rand(torch, 2, 8, 555, 128, seed=8).float()
    (op(qkv).float() * w).sum().backward()
    x = qkv.detach().float().requires_grad_()
    (exact(x) * w).sum().backward()
    err = float((qkv.grad.float() - x.grad).abs().max() / x.grad.abs().max())
    assert err < 2 ** -5, err


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
def test_deterministic_algorithms_give_the_same_bits(ops, torch, cuda, gpu_cache, d):
    """Under torch.use_deterministic_algorithms the backward adds dQ in key-block order:
    two backward passes give the same bits, and the right gradients."""
    q, k, v = leaves(torch, 2, 8, 4, 1500, 1500, d, seed=50)
    do = rand(torch, *q.shape, seed=53)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        o = torch.ops.ptxdsl.attention(q, k, v, True)
        first = torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
        second = torch.autograd.grad(o, (q, k, v), do)
    finally:
        torch.use_deterministic_algorithms(was)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    assert_grads_close(torch, lambda q, k, v: torch.ops.ptxdsl.attention(q, k, v, True), q, k,
                       v, True, seed=50)


@pytest.mark.gpu
def test_compiled_training_step_matches_the_math_backend(ops, torch, cuda, gpu_cache):
    """torch.compile(fullgraph=True) of a loss through the op: no graph break, the compiled
    step runs attention_lse and attention_backward (each makes the launch plan of this
    shape, met nowhere else in the module), and the gradients are right."""
    from torch._dynamo.utils import counters

    from ptxdsl.torch.attention import attention_lse
    from ptxdsl.torch.attention_bwd import attention_backward

    before = attention_lse.plans, attention_backward.plans
    q, k, v = leaves(torch, 2, 8, 4, 700, 700, 128, seed=60)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(lambda q, k, v: torch.ops.ptxdsl.attention(q * 1.0, k, v, True),
                             fullgraph=True)
    assert_grads_close(torch, compiled, q, k, v, True, seed=60)
    assert dict(counters["graph_break"]) == {}
    assert (attention_lse.plans, attention_backward.plans) == (before[0] + 1, before[1] + 1)
