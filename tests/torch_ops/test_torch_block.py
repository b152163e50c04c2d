"""samples/torch_block.py: without a GPU, the PyTorch-kernel block on the CPU decodes through a
contiguous or paged cache (prompt prefill, a chunk of new tokens, single tokens, sequences at
uneven lengths) to what a prefill of the whole sequence gives, and ptxdsl's block on fake
tensors compiles to one graph of its ops; on the GPU, the block on
ptxdsl's ops against the same block on PyTorch's kernels (eager), prefill and decode steps
over paged and contiguous caches, under torch.compile(fullgraph=True) without a graph break
and replayed from a CUDA graph."""

import pytest

from bench.common import twin

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning:torch"),
              pytest.mark.filterwarnings("ignore:TensorFloat32 tensor cores")]


@pytest.fixture(scope="module")
def tb(torch):
    return twin("torch_block")


# ----------------------------------------------------------------------------- no GPU


@pytest.fixture(scope="module")
def cpu_block(tb, torch):
    cfg = tb.Config(hidden=256, heads=8, kv_heads=2, head_dim=64, ffn=512)
    return cfg, tb.Block(cfg, tb.TORCH, device="cpu", seed=1), tb.rope_tables(cfg, 128, "cpu")


def x_on(torch, cfg, b, s, seed, device="cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(b, s, cfg.hidden, device=device, generator=g).to(torch.bfloat16)


@pytest.mark.parametrize("paged", [False, True])
def test_decoding_through_the_cache_is_the_prefill(tb, torch, cpu_block, paged):
    """20 prompt tokens (a prefill into the empty cache), 5 more at once, then one at a time:
    each output is the whole sequence's prefill output at that position."""
    cfg, block, (cos, sin) = cpu_block
    x = x_on(torch, cfg, 3, 40, seed=0, device="cpu")
    cache = tb.KVCache.empty(cfg, 3, 128, device="cpu")
    if paged:
        cache = tb.PagedKVCache.of(cache, 16)
    outs = []
    for lo, hi in [(0, 20), (20, 25), *((t, t + 1) for t in range(25, 40))]:
        cache.advance(hi - lo)
        outs.append(block(x[:, lo:hi], cos, sin, cache))
    assert cache.seqlens.tolist() == [40, 40, 40]
    assert tb.max_error(torch.cat(outs, 1), block(x, cos, sin)) < 1e-2


@pytest.mark.parametrize("paged", [False, True])
def test_sequences_at_uneven_lengths(tb, torch, cpu_block, paged):
    """Each prompt prefilled alone into its rows of a shared cache (cache.sequence(b)), then
    one decode step of the batch: each sequence's output is its own prefill's last."""
    cfg, block, (cos, sin) = cpu_block
    lengths = [7, 30, 17]
    x = x_on(torch, cfg, 3, 31, seed=1, device="cpu")
    cache = tb.PagedKVCache.empty(cfg, 3, 64, 16, device="cpu") if paged else \
        tb.KVCache.empty(cfg, 3, 64, device="cpu")
    for b, n in enumerate(lengths):
        one = cache.sequence(b)
        one.advance(n)
        block(x[b:b + 1, :n], cos, sin, one)
    cache.advance(1)
    step = torch.stack([x[b, n] for b, n in enumerate(lengths)])[:, None]
    out = block(step, cos, sin, cache)
    for b, n in enumerate(lengths):
        assert tb.max_error(out[b, 0], block(x[b:b + 1, :n + 1], cos, sin)[0, -1]) < 1e-2


def test_ptxdsl_block_traces_in_one_graph(tb, torch, fake):
    """ptxdsl's block on fake CUDA tensors through torch.compile(fullgraph=True): a decode
    step over a paged cache is one graph of gemm, rms_norm, kv_append and decode_attention;
    a prompt's prefill into the cache, of attention and kv_append."""
    from conftest import compile_one_graph

    cfg = tb.Config(hidden=256, heads=8, kv_heads=2, head_dim=64, ffn=512)
    block = tb.Block(cfg, tb.PTXDSL, device="cpu", seed=1)
    for name, p in list(block.named_parameters()):  # fake CUDA weights of the same shapes
        setattr(block, name, torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype,
                                                            device="cuda"), requires_grad=False))
    cos, sin = torch.empty(128, 64, device="cuda"), torch.empty(128, 64, device="cuda")
    pages = (torch.empty(12, 16, 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cache = tb.PagedKVCache(*pages, torch.empty(3, 4, device="cuda", dtype=torch.int32),
                            torch.empty(3, device="cuda", dtype=torch.int32))
    for s, attention in ((1, "ptxdsl.decode_attention"), (20, "ptxdsl.attention")):
        x = torch.empty(3, s, 256, device="cuda", dtype=torch.bfloat16)
        out, targets = compile_one_graph(torch, block, x, cos, sin, cache)
        assert out.shape == (3, s, 256)
        assert {t for t in targets if t.startswith("ptxdsl.")} == {
            "ptxdsl.gemm", "ptxdsl.gemm_silu_mul", "ptxdsl.rms_norm", "ptxdsl.kv_append",
            attention}


# ----------------------------------------------------------------------------- GPU


@pytest.fixture(scope="module")
def blocks(tb, cuda, gpu_cache):
    cfg = tb.Config(hidden=1024, heads=8, kv_heads=2, head_dim=128, ffn=2816)
    ours = tb.Block(cfg, seed=1)
    return cfg, ours, tb.Block(cfg, tb.TORCH).share_weights(ours), tb.rope_tables(cfg, 2048)


@pytest.mark.gpu
@pytest.mark.parametrize("b, s", [(1, 1000), (3, 257)])
def test_prefill_matches_eager_pytorch(torch, tb, blocks, b, s):
    cfg, ours, ref, (cos, sin) = blocks
    x = x_on(torch, cfg, b, s, seed=b * s)
    assert tb.max_error(ours(x, cos, sin), ref(x, cos, sin)) < 2e-2


def both_caches(tb, cfg, lengths, page, seed):
    """ptxdsl's cache (paged with pages of `page`, or contiguous) and PyTorch's (contiguous)
    with the same random history and lengths."""
    paged, ref = tb.history(cfg, list(lengths), 1024, page or 64, seed)
    if page is None:
        return tb.KVCache(ref.k.clone(), ref.v.clone(), ref.seqlens.clone()), ref
    return paged, ref


def new_keys(torch, cache, ref, s):
    """Each sequence's s newest keys and values in both caches: (ours, theirs)."""
    got, want = [], []
    for b, n in enumerate(ref.seqlens.tolist()):
        for c, out in ((cache, got), (ref, want)):
            if c.block_table is None:
                k, v = c.k[b], c.v[b]
            else:
                table = c.block_table[b].long()
                k, v = c.k[table].flatten(0, 1), c.v[table].flatten(0, 1)
            out.append(torch.cat([k[n - s:n], v[n - s:n]]))
    return torch.stack(got), torch.stack(want)


@pytest.mark.gpu
@pytest.mark.parametrize("lengths, s, page", [
    ((700, 1, 1024, 129) * 4, 1, 64),  # 16 sequences, one new token each
    ((5, 300, 17), 5, 16),  # 5 new tokens crossing a page of 16
    ((1, 2, 1000), 1, None),  # contiguous
    ((50, 64), 16, 256),
])
def test_decode_over_a_cache_matches_eager_pytorch(torch, tb, blocks, lengths, s, page):
    cfg, ours, ref, (cos, sin) = blocks
    cache, ref_cache = both_caches(tb, cfg, lengths, page, seed=len(lengths) + s)
    x = x_on(torch, cfg, len(lengths), s, seed=s)
    assert tb.max_error(ours(x, cos, sin, cache), ref(x, cos, sin, ref_cache)) < 2e-2
    got, want = new_keys(torch, cache, ref_cache, s)  # the new keys landed alike
    assert tb.max_error(got, want) < 2e-2


@pytest.mark.gpu
def test_prompt_prefill_into_the_cache_then_decode(torch, tb, blocks):
    """A 300-token prompt prefilled into empty caches (within x), then 3 decode steps."""
    cfg, ours, ref, (cos, sin) = blocks
    cache = tb.PagedKVCache.empty(cfg, 2, 512, 32)
    ref_cache = tb.KVCache.empty(cfg, 2, 512)
    x = x_on(torch, cfg, 2, 303, seed=9)
    for lo, hi in ((0, 300), (300, 301), (301, 302), (302, 303)):
        cache.advance(hi - lo)
        ref_cache.advance(hi - lo)
        got = ours(x[:, lo:hi].contiguous(), cos, sin, cache)  # the ops take rows
        assert tb.max_error(got, ref(x[:, lo:hi], cos, sin, ref_cache)) < 2e-2


@pytest.mark.gpu
def test_fullgraph_compile_without_a_graph_break(torch, tb, blocks):
    cfg, ours, ref, (cos, sin) = blocks
    x = x_on(torch, cfg, 2, 300, seed=7)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(ours)(x, cos, sin)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    torch._dynamo.reset()
    got = torch.compile(ours, fullgraph=True)(x, cos, sin)
    assert tb.max_error(got, ref(x, cos, sin)) < 2e-2
    cache, ref_cache = both_caches(tb, cfg, (40, 900), 64, seed=3)
    x = x_on(torch, cfg, 2, 1, seed=8)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(ours)(x, cos, sin, cache)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    ops = {str(n.target) for g in explained.graphs for n in g.graph.nodes
           if n.op == "call_function"}
    assert {t.split(".")[1] for t in ops if t.startswith("ptxdsl.")} >= {
        "gemm", "rms_norm", "kv_append", "decode_attention"}, ops
    torch._dynamo.reset()
    got = torch.compile(ours, fullgraph=True)(x, cos, sin, cache)
    assert tb.max_error(got, ref(x, cos, sin, ref_cache)) < 2e-2


@pytest.mark.gpu
def test_a_decode_step_replays_from_a_cuda_graph(torch, tb, blocks):
    """The step (lengths advanced, the block) captured once, replayed twice: each replay
    appends at the next position, as eager PyTorch does."""
    cfg, ours, ref, (cos, sin) = blocks
    cache, ref_cache = both_caches(tb, cfg, (100, 513, 7), 32, seed=4)
    x = x_on(torch, cfg, 3, 1, seed=10)
    compiled = torch.compile(ours, fullgraph=True)

    def step():
        cache.advance(1)
        return compiled(x, cos, sin, cache)

    step()  # tune and load before capturing
    ref_cache.advance(1)
    ref(x, cos, sin, ref_cache)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for i in range(2):  # capturing ran nothing: each replay advances the lengths once
        x.copy_(x_on(torch, cfg, 3, 1, seed=11 + i))
        graph.replay()
        ref_cache.advance(1)
        want = ref(x, cos, sin, ref_cache)
        torch.cuda.synchronize()
        assert torch.equal(cache.seqlens, ref_cache.seqlens)
        assert tb.max_error(out, want) < 2e-2
