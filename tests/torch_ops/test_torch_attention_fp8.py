"""torch.ops.ptxdsl.attention_fp8: its schema, fake outputs and input errors (no GPU: fake
tensors), and on the GPU its results against torch's math-backend SDPA in f32 on the
dequantised tensors (head dims 64 and 128, causal, GQA, odd lengths), within P's e4m3
rounding at its worst (the interpreter tests' tolerance), and replayed from a CUDA graph."""

import pytest
from conftest import compile_one_graph
from conftest import cuda_empty as cuda

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")


def e4m3(torch, *shape):
    return cuda(torch, *shape, dtype=torch.float8_e4m3fn)


def one(torch, n=1):
    return cuda(torch, n, dtype=torch.float32)


def test_schema(ops, torch):
    assert str(torch.ops.ptxdsl.attention_fp8.default._schema) == (
        "ptxdsl::attention_fp8(Tensor q, Tensor k, Tensor v, Tensor q_descale, "
        "Tensor k_descale, Tensor v_descale, bool causal=False, float? scale=None) -> Tensor")


def test_fake_outputs(ops, torch, fake):
    s = one(torch)
    o = torch.ops.ptxdsl.attention_fp8(e4m3(torch, 2, 8, 100, 128), e4m3(torch, 2, 2, 130, 128),
                                       e4m3(torch, 2, 2, 130, 128), s, s, s, causal=True)
    assert (o.shape, o.dtype, o.device.type) == ((2, 8, 100, 128), torch.bfloat16, "cuda")
    assert o.is_contiguous()


def bad_inputs(torch):
    q, kv, s = e4m3(torch, 2, 4, 64, 128), e4m3(torch, 2, 2, 64, 128), one(torch)
    return [
        ((q.to(torch.bfloat16), kv, kv, s, s, s), {}, TypeError,
         "^attention_fp8: q must be torch.float8_e4m3fn, got torch.bfloat16$"),
        ((q, kv, kv, one(torch, 2), s, s), {}, ValueError,
         r"^attention_fp8: q_descale must have 1 element, got 2 \(shape \(2,\)\)$"),
        ((q, kv, kv, s, s, s.to(torch.bfloat16)), {}, TypeError,
         "^attention_fp8: v_descale must be f32, got torch.bfloat16$"),
        ((q[0], kv, kv, s, s, s), {}, ValueError, "q must have 4 dimensions, got 3"),
        ((q, kv, kv[:, :, :32], s, s, s), {}, ValueError, "v must have k's shape"),
        ((e4m3(torch, 2, 4, 64, 96),) + (e4m3(torch, 2, 2, 64, 96),) * 2 + (s, s, s), {},
         ValueError, "head dim .* must be 64 or 128, got 96"),
        ((q, e4m3(torch, 2, 3, 64, 128), e4m3(torch, 2, 3, 64, 128), s, s, s), {}, ValueError,
         r"k's heads must divide q's \(4\), got 3"),
        ((q, kv[:, :, :10], kv[:, :, :10], s, s, s), {"causal": True}, ValueError,
         "causal attention needs at least as many keys as queries"),
        ((q, kv, kv, s, s, s), {"scale": 0.0}, ValueError, "scale must be positive and finite"),
        ((q, kv[:, :, :0], kv[:, :, :0], s, s, s), {}, ValueError,
         "k and v must hold at least one key"),
        ((e4m3(torch, 2, 4, 64, 136)[..., :128], kv, kv, s, s, s), {}, ValueError,
         "q's stride in dimension 2 must be a multiple of 16 bytes"),
    ]


BAD = 11  # the cases of bad_inputs


def test_every_bad_input_case_runs(ops, torch, fake):
    assert len(bad_inputs(torch)) == BAD


@pytest.mark.parametrize("case", range(BAD))
def test_bad_inputs_are_named(ops, torch, fake, case):
    args, kwargs, exc, message = bad_inputs(torch)[case]
    with pytest.raises(exc, match=message):
        torch.ops.ptxdsl.attention_fp8(*args, **kwargs)


def test_compile_traces_without_a_graph_break(ops, torch, fake):
    def f(q, k, v, s):
        return torch.ops.ptxdsl.attention_fp8(q, k, v, s, s * 2, s, causal=True).sum(1)

    out, targets = compile_one_graph(torch, f, e4m3(torch, 1, 4, 256, 64),
                                     e4m3(torch, 1, 1, 256, 64), e4m3(torch, 1, 1, 256, 64),
                                     one(torch))
    assert out.shape == (1, 256, 64)
    assert "ptxdsl.attention_fp8" in targets


# ----------------------------------------------------------------------------- GPU


@pytest.fixture(scope="module")
def gpu(cuda, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("PTXDSL_CACHE_DIR", str(tmp_path_factory.mktemp("ptxdsl-cache")))
    yield
    mp.undo()


def quantized(torch, shape, mag, seed):
    """e4m3 data quantised per tensor (amax to 448) from normals of magnitude `mag`, and its
    f32 descale (a one-element tensor)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(*shape, device="cuda", generator=g) * mag
    descale = x.abs().amax().reshape(1) / 448.0
    return (x / descale).to(torch.float8_e4m3fn), descale


def sdpa(torch, q, k, v, causal, scale=None):
    """The math backend in f32 on f32 tensors; causal aligned to the end."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    s, skv = q.shape[2], k.shape[2]
    mask = None
    if causal:
        mask = torch.ones(s, skv, dtype=torch.bool, device=q.device).tril(skv - s)
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                              enable_gqa=True)


def check(torch, o, q8, k8, v8, qd, kd, vd, causal, scale=None):
    """O against SDPA of the dequantised tensors: within 2^-4 of the attention of |V| (P's
    e4m3 rounding at its worst) plus 2^-7 relative (O's bf16) and 2^-10 of it for the
    tensor cores' fp8 sums, which run over one key block (the kernel promotes each block's
    P V into f32)."""
    q, k, v = (x.float() * d for x, d in ((q8, qd), (k8, kd), (v8, vd)))
    ref = sdpa(torch, q, k, v, causal, scale)
    bound = sdpa(torch, q, k, v.abs(), causal, scale)
    assert o.dtype == torch.bfloat16 and bool(torch.isfinite(o).all())
    err = (o.float() - ref).abs()
    assert bool((err <= (2**-4 + 2**-10) * bound + 2**-7 * ref.abs()).all()), \
        float((err / bound).max())


@pytest.mark.gpu
@pytest.mark.parametrize("b, h, kvh, s, skv, d, causal", [
    (2, 8, 8, 1000, 1000, 128, False), (1, 8, 2, 4097, 4097, 128, True),
    (3, 4, 1, 333, 350, 64, True), (2, 16, 4, 2048, 2048, 64, False),
    (1, 2, 1, 1, 777, 128, True)])
def test_matches_the_math_backend_on_dequantised_inputs(ops, torch, gpu, b, h, kvh, s, skv, d,
                                                        causal):
    q8, qd = quantized(torch, (b, h, s, d), 2.0, seed=s)
    k8, kd = quantized(torch, (b, kvh, skv, d), 0.5, seed=s + 1)
    v8, vd = quantized(torch, (b, kvh, skv, d), 3.0, seed=s + 2)
    o = torch.ops.ptxdsl.attention_fp8(q8, k8, v8, qd, kd, vd, causal)
    assert o.shape == (b, h, s, d)
    check(torch, o, q8, k8, v8, qd, kd, vd, causal)


@pytest.mark.gpu
def test_scale_and_graph_replay_with_new_descales(ops, torch, gpu):
    """An explicit scale; the op captured in a CUDA graph, replayed after new data and new
    descales are copied in (the descales are read on the GPU)."""
    q8, qd = quantized(torch, (2, 4, 500, 128), 1.0, seed=1)
    k8, kd = quantized(torch, (2, 4, 500, 128), 1.0, seed=2)
    v8, vd = quantized(torch, (2, 4, 500, 128), 1.0, seed=3)
    o = torch.ops.ptxdsl.attention_fp8(q8, k8, v8, qd, kd, vd, True, scale=0.05)
    check(torch, o, q8, k8, v8, qd, kd, vd, True, scale=0.05)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.ptxdsl.attention_fp8(q8, k8, v8, qd, kd, vd, True, scale=0.05)
    for (t, d), seed in (((q8, qd), 4), ((k8, kd), 5), ((v8, vd), 6)):
        fresh, fresh_d = quantized(torch, tuple(t.shape), 0.3 * seed, seed=seed)
        t.copy_(fresh)
        d.copy_(fresh_d)
    graph.replay()
    torch.cuda.synchronize()
    check(torch, out, q8, k8, v8, qd, kd, vd, True, scale=0.05)
