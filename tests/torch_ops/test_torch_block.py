"""samples/torch_block.py on the GPU: the decoder block on ptxdsl's ops against the same block
on PyTorch's kernels (eager), prefill and a decode step over a KV cache, and under
torch.compile(fullgraph=True) without a graph break."""

import pytest

from bench.common import twin

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning:torch"),
              pytest.mark.filterwarnings("ignore:TensorFloat32 tensor cores")]


@pytest.fixture(scope="module")
def tb(torch):
    return twin("torch_block")


@pytest.fixture(scope="module")
def blocks(tb):
    cfg = tb.Config(hidden=1024, heads=8, kv_heads=2, head_dim=128, ffn=2816)
    ours = tb.Block(cfg, seed=1)
    return cfg, ours, tb.Block(cfg, tb.TORCH).share_weights(ours), tb.rope_tables(cfg, 2048)


def x_of(torch, cfg, b, s, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(b, s, cfg.hidden, device="cuda", generator=g).to(torch.bfloat16)


@pytest.mark.parametrize("b, s", [(1, 1000), (3, 257)])
def test_prefill_matches_eager_pytorch(torch, tb, blocks, b, s):
    cfg, ours, ref, (cos, sin) = blocks
    x = x_of(torch, cfg, b, s, seed=b * s)
    assert tb.max_error(ours(x, cos, sin), ref(x, cos, sin)) < 2e-2


@pytest.mark.parametrize("b, s, pos", [(16, 1, 700), (4, 1, 0), (2, 37, 300)])
def test_decode_over_a_kv_cache_matches_eager_pytorch(torch, tb, blocks, b, s, pos):
    cfg, ours, ref, (cos, sin) = blocks
    cache, ref_cache = tb.KVCache.empty(cfg, b, 1024), tb.KVCache.empty(cfg, b, 1024)
    cache.k[:, :, :pos].normal_()
    cache.v[:, :, :pos].normal_()
    ref_cache.k.copy_(cache.k)
    ref_cache.v.copy_(cache.v)
    x = x_of(torch, cfg, b, s, seed=pos)
    assert tb.max_error(ours(x, cos, sin, cache, pos), ref(x, cos, sin, ref_cache, pos)) < 2e-2
    # the new keys and values landed in both caches alike
    assert tb.max_error(cache.k[:, :, pos:pos + s], ref_cache.k[:, :, pos:pos + s]) < 2e-2
    assert tb.max_error(cache.v[:, :, pos:pos + s], ref_cache.v[:, :, pos:pos + s]) < 2e-2


def test_fullgraph_compile_without_a_graph_break(torch, tb, blocks):
    cfg, ours, ref, (cos, sin) = blocks
    x = x_of(torch, cfg, 2, 300, seed=7)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(ours)(x, cos, sin)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    ops = {str(n.target) for g in explained.graphs for n in g.graph.nodes
           if n.op == "call_function"}
    assert {t.split(".")[1] for t in ops if t.startswith("ptxdsl.")} >= {
        "gemm", "rms_norm", "attention"}, ops
    torch._dynamo.reset()
    got = torch.compile(ours, fullgraph=True)(x, cos, sin)
    assert tb.max_error(got, ref(x, cos, sin)) < 2e-2
