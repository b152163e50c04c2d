"""torch.ops.ptxdsl.attention: its schema, fake outputs and input errors (no GPU: fake
tensors), and on the GPU its results against torch's math-backend SDPA in f32 (prefill,
GQA, a decode step over a KV cache view), under torch.compile and CUDA graph capture. The
backward: test_torch_attention_backward.py."""

import pytest
from conftest import compile_one_graph
from conftest import cuda_empty as cuda

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")


# ----------------------------------------------------------------------------- no GPU


def test_schema(ops, torch):
    assert str(torch.ops.ptxdsl.attention.default._schema) == (
        "ptxdsl::attention(Tensor q, Tensor k, Tensor v, bool causal=False, "
        "float? scale=None, int window_left=-1, int window_right=-1, float softcap=0.) -> "
        "Tensor")


def test_fake_outputs(ops, torch, fake):
    o = torch.ops.ptxdsl.attention(cuda(torch, 2, 8, 100, 128), cuda(torch, 2, 2, 100, 128),
                                   cuda(torch, 2, 2, 100, 128), causal=True)
    assert (o.shape, o.dtype, o.device.type) == ((2, 8, 100, 128), torch.bfloat16, "cuda")
    cache = cuda(torch, 4, 2, 4096, 64)  # a decode step over the first 1000 rows of a cache
    kv = cache[:, :, :1000]
    o = torch.ops.ptxdsl.attention(cuda(torch, 4, 8, 1, 64), kv, kv, scale=0.1)
    assert o.shape == (4, 8, 1, 64) and o.is_contiguous()
    q = cuda(torch, 2, 300, 8, 128).transpose(1, 2)  # (B, S, H, D) seen as (B, H, S, D)
    o = torch.ops.ptxdsl.attention(q, q[:, :2], q[:, 2:4])
    assert o.shape == (2, 8, 300, 128) and o.is_contiguous()


def bad_inputs(torch):
    q, kv = cuda(torch, 2, 4, 64, 128), cuda(torch, 2, 2, 64, 128)
    return [
        ((q.float(), kv, kv), {}, TypeError, "^attention: q must be bf16, got torch.float32$"),
        ((q[0], kv, kv), {}, ValueError, "q must have 4 dimensions, got 3"),
        ((q, kv, kv[:, :, :32]), {}, ValueError, "v must have k's shape"),
        ((q, cuda(torch, 3, 2, 64, 128), cuda(torch, 3, 2, 64, 128)), {}, ValueError,
         r"k and v must be \(B, KVH, S_kv, D\) with q's B = 2"),
        ((cuda(torch, 2, 4, 64, 96),) + (cuda(torch, 2, 2, 64, 96),) * 2, {}, ValueError,
         "head dim .* must be 64 or 128, got 96"),
        ((q, cuda(torch, 2, 3, 64, 128), cuda(torch, 2, 3, 64, 128)), {}, ValueError,
         r"k's heads must divide q's \(4\), got 3"),
        ((q, kv[:, :, :10], kv[:, :, :10]), {"causal": True}, ValueError,
         "causal attention needs at least as many keys as queries"),
        ((q, kv, kv), {"scale": -1.0}, ValueError, "scale must be positive and finite"),
        ((cuda(torch, 2, 4, 64, 132)[..., :128], kv, kv), {}, ValueError,
         "q's stride in dimension 2 must be a multiple of 16 bytes"),
        ((q, kv[:, :, :0], kv[:, :, :0]), {}, ValueError, "k and v must hold at least one key"),
        ((q, kv, kv), {"window_left": -2}, ValueError,
         r"window_left and window_right must be -1 \(unbounded\) or at least 0, got \(-2, -1\)"),
        ((q, kv[:, :, :10], kv[:, :, :10]), {"window_right": 4}, ValueError,
         "a sliding window needs at least as many keys as queries .* S = 64 queries and "
         "S_kv = 10 keys"),
        ((q, kv[:, :, :10], kv[:, :, :10]), {"window_right": 0}, ValueError,
         "causal attention needs at least as many keys"),  # the window (-1, 0) is causal
    ]


BAD = 13  # the cases of bad_inputs


def test_every_bad_input_case_runs(ops, torch, fake):
    assert len(bad_inputs(torch)) == BAD


@pytest.mark.parametrize("case", range(BAD))
def test_bad_inputs_are_named(ops, torch, fake, case):
    args, kwargs, exc, message = bad_inputs(torch)[case]
    with pytest.raises(exc, match=message):
        torch.ops.ptxdsl.attention(*args, **kwargs)


@pytest.mark.gpu
def test_tensors_on_two_devices_are_named(ops, torch):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs (run on nvidia-h200-x2)")
    q, k = (torch.zeros(1, 2, 8, 64, device=f"cuda:{i}", dtype=torch.bfloat16) for i in (0, 1))
    with pytest.raises(ValueError, match=r"^attention: k must be on q's device \(cuda:0\), "
                                         r"got cuda:1$"):
        torch.ops.ptxdsl.attention(q, k, q)


def test_cpu_tensors_are_named(ops, torch):
    q = torch.zeros(1, 1, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^attention: q must be on a CUDA device, got cpu$"):
        torch.ops.ptxdsl.attention(q, q, q)


def test_compile_traces_without_a_graph_break(ops, torch, fake):
    def f(q, k, v):
        return torch.ops.ptxdsl.attention(q * 2, k, v, causal=True).sum(1)

    out, targets = compile_one_graph(
        torch, f, cuda(torch, 1, 4, 256, 64), cuda(torch, 1, 1, 256, 64),
        cuda(torch, 1, 1, 256, 64))
    assert out.shape == (1, 256, 64)
    assert "ptxdsl.attention" in targets


def test_every_config_assembles(ops):
    from ptxdsl.torch.kernels import attention_configs, attention_kernel

    for d in (64, 128):
        for causal in (False, True):
            for config in attention_configs(d):
                kd = attention_kernel(d, causal, config["pingpong"], config["hold"],
                                      config["nwg"])
                assert ".entry" in kd.ptx()


# ----------------------------------------------------------------------------- GPU


@pytest.fixture(scope="module")
def gpu(cuda, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("PTXDSL_CACHE_DIR", str(tmp_path_factory.mktemp("ptxdsl-cache")))
    yield
    mp.undo()


def rand(torch, *shape, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=g).to(torch.bfloat16)


def reference(torch, q, k, v, causal, scale=None):
    """The math backend in f32; causal aligned to the end."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    s, skv = q.shape[2], k.shape[2]
    mask = None
    if causal:
        mask = torch.ones(s, skv, dtype=torch.bool, device=q.device).tril(skv - s)
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                              scale=scale, enable_gqa=True)


def assert_close(torch, o, ref):
    assert o.dtype == torch.bfloat16 and torch.isfinite(o).all()
    err = (o.float() - ref).abs()
    assert (err <= 2**-7 * ref.abs() + 2**-7).all(), float(err.max())


@pytest.mark.gpu
@pytest.mark.parametrize("b, h, kvh, s, d, causal", [
    (2, 8, 8, 1000, 128, False), (1, 8, 2, 4097, 128, True), (3, 4, 1, 333, 64, True),
    (2, 16, 4, 2048, 64, False)])
def test_matches_the_math_backend(ops, torch, gpu, b, h, kvh, s, d, causal):
    q, k, v = (rand(torch, b, n, s, d, seed=i) for i, n in enumerate((h, kvh, kvh)))
    assert_close(torch, torch.ops.ptxdsl.attention(q, k, v, causal),
                 reference(torch, q, k, v, causal))


@pytest.mark.gpu
def test_transposed_views_are_read_in_place(ops, torch, gpu):
    """q, k and v as slices of one (B, S, heads, D) projection, transposed: SDPA's usual
    input."""
    qkv = rand(torch, 3, 777, 12, 128, seed=4)
    q, k, v = (qkv[:, :, a:b].transpose(1, 2) for a, b in ((0, 8), (8, 10), (10, 12)))
    for causal in (False, True):
        assert_close(torch, torch.ops.ptxdsl.attention(q, k, v, causal),
                     reference(torch, q, k, v, causal))


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
def test_decode_over_a_kv_cache_view(ops, torch, gpu, d):
    """One query per sequence against the first `length` rows of a preallocated cache."""
    cache_k, cache_v = rand(torch, 5, 2, 2048, d, seed=1), rand(torch, 5, 2, 2048, d, seed=2)
    q = rand(torch, 5, 8, 1, d, seed=3)
    for length in (1, 700, 2048):
        k, v = cache_k[:, :, :length], cache_v[:, :, :length]
        for causal in (False, True):
            assert_close(torch, torch.ops.ptxdsl.attention(q, k, v, causal),
                         reference(torch, q, k, v, causal))


def test_short_queries_stack_the_heads_of_a_kv_head(ops, torch, fake):
    from ptxdsl.torch.attention import packed

    q, out = cuda(torch, 4, 8, 3, 64), cuda(torch, 4, 8, 3, 64)
    pq, po = packed(q, out, 2, causal=False)
    assert pq.shape == po.shape == (4, 2, 12, 64)
    assert packed(q, out, 2, causal=True) is None  # rows of one head would see each other's keys
    assert packed(q, out, 8, causal=False) is None  # one query head per KV head
    assert packed(cuda(torch, 4, 8, 128, 64), cuda(torch, 4, 8, 128, 64), 2, False) is None
    one = cuda(torch, 4, 1, 8, 64).transpose(1, 2)  # decode: (B, 1, H, D) as (B, H, 1, D)
    assert packed(one, cuda(torch, 4, 8, 1, 64), 2, causal=True)[0].shape == (4, 2, 4, 64)
    odd = cuda(torch, 4, 3, 8, 64).transpose(1, 2)  # heads and rows that do not merge
    assert packed(odd, cuda(torch, 4, 8, 3, 64), 2, causal=False) is None


@pytest.mark.gpu
@pytest.mark.parametrize("s, causal", [(1, True), (5, False), (100, False), (5, True)])
def test_stacked_heads_match_the_math_backend(ops, torch, gpu, s, causal):
    """Short queries with GQA (stacked into one head's rows when the mask allows)."""
    q = rand(torch, 3, 16, s, 128, seed=s)
    k, v = rand(torch, 3, 2, 900, 128, seed=1), rand(torch, 3, 2, 900, 128, seed=2)
    assert_close(torch, torch.ops.ptxdsl.attention(q, k, v, causal),
                 reference(torch, q, k, v, causal))


@pytest.mark.gpu
def test_scale(ops, torch, gpu):
    q, k, v = (rand(torch, 1, 2, 300, 64, seed=i) for i in range(3))
    assert_close(torch, torch.ops.ptxdsl.attention(q, k, v, scale=0.05),
                 reference(torch, q, k, v, False, scale=0.05))


@pytest.mark.gpu
def test_compiled_and_graph_replay_equal_eager(ops, torch, gpu):
    q, k, v = (rand(torch, 2, 4, 500, 128, seed=10 + i) for i in range(3))

    def f(q, k, v):
        return torch.ops.ptxdsl.attention(q, k, v, True) * 2

    eager = f(q, k, v)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(q, k, v), eager, rtol=0, atol=0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = f(q, k, v)
    for t, seed in ((q, 20), (k, 21), (v, 22)):
        t.copy_(rand(torch, *t.shape, seed=seed))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, f(q, k, v), rtol=0, atol=0)
    assert_close(torch, out / 2, reference(torch, q, k, v, True))

