"""torch.ops.ptxdsl.decode_attention: its schema, fake outputs and input errors (no GPU: fake
tensors), and on the GPU its results against torch's math in f32 on fresh random data
(contiguous and paged caches, uneven lengths with 0 and 1, GQA 4:1 and 8:1, 1 to 16 new
tokens causal), repeated launches bit for bit, under torch.compile and in a CUDA graph."""

import pytest
from conftest import compile_one_graph
from conftest import cuda_empty as cuda

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")


# ----------------------------------------------------------------------------- no GPU


def test_schema(ops, torch):
    assert str(torch.ops.ptxdsl.decode_attention.default._schema) == (
        "ptxdsl::decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, "
        "Tensor cache_seqlens, Tensor? block_table=None, bool causal=True, "
        "float? scale=None) -> Tensor")


def lens(torch, b):
    return cuda(torch, b, dtype=torch.int32)


def test_fake_outputs(ops, torch, fake):
    q = cuda(torch, 4, 1, 32, 128)
    kv = cuda(torch, 4, 4096, 8, 128)
    o = torch.ops.ptxdsl.decode_attention(q, kv, kv, lens(torch, 4))
    assert (o.shape, o.dtype, o.device.type) == ((4, 1, 32, 128), torch.bfloat16, "cuda")
    pages = cuda(torch, 100, 16, 8, 64)
    table = cuda(torch, 3, 20, dtype=torch.int32)
    o = torch.ops.ptxdsl.decode_attention(cuda(torch, 3, 5, 64, 64), pages, pages,
                                          lens(torch, 3), table, causal=False, scale=0.1)
    assert o.shape == (3, 5, 64, 64) and o.is_contiguous()


def bad_inputs(torch):
    q, kv, n = cuda(torch, 2, 1, 8, 128), cuda(torch, 2, 512, 2, 128), lens(torch, 2)
    pages = cuda(torch, 64, 16, 2, 128)
    table = cuda(torch, 2, 8, dtype=torch.int32)
    return [
        ((q.float(), kv, kv, n), {}, TypeError,
         "^decode_attention: q must be bf16, got torch.float32$"),
        ((q, kv, kv, n.long()), {}, TypeError,
         "cache_seqlens must be torch.int32, got torch.int64"),
        ((q, kv, kv, n, table.long()), {}, TypeError,
         "block_table must be torch.int32, got torch.int64"),
        ((cuda(torch, 2, 1, 8, 96), cuda(torch, 2, 512, 2, 96), cuda(torch, 2, 512, 2, 96), n),
         {}, ValueError, "head dim .* must be 64 or 128, got 96"),
        ((cuda(torch, 2, 17, 8, 128), kv, kv, n), {}, ValueError,
         "q must have 1 to 16 new tokens a sequence .* got 17"),
        ((q, kv, kv[:, :256], n), {}, ValueError, "v_cache must have k_cache's shape"),
        ((q, cuda(torch, 2, 512, 3, 128), cuda(torch, 2, 512, 3, 128), n), {}, ValueError,
         r"k_cache's heads \(dimension 2\) must divide q's \(8\), got 3"),
        ((q, kv, kv, lens(torch, 3)), {}, ValueError, r"cache_seqlens must be \(2,\)"),
        ((q, cuda(torch, 3, 512, 2, 128), cuda(torch, 3, 512, 2, 128), n), {}, ValueError,
         "a contiguous k_cache must be .* with q's B = 2"),
        ((q, pages, pages, n, cuda(torch, 3, 8, dtype=torch.int32)), {}, ValueError,
         r"block_table must be \(2, pages per sequence\), got \(3, 8\)"),
        ((q, cuda(torch, 64, 24, 2, 128), cuda(torch, 64, 24, 2, 128), n, table), {},
         ValueError, "page size .* must be a power of two from 16, got 24"),
        ((q, kv, kv, n), {"scale": 0.0}, ValueError, "scale must be positive and finite"),
        ((q, kv, kv, n.reshape(2, 1)), {}, ValueError,
         "cache_seqlens must have 1 dimensions, got 2"),
    ]


BAD = 13  # the cases of bad_inputs


def test_every_bad_input_case_runs(ops, torch, fake):
    assert len(bad_inputs(torch)) == BAD


@pytest.mark.parametrize("case", range(BAD))
def test_bad_inputs_are_named(ops, torch, fake, case):
    args, kwargs, exc, message = bad_inputs(torch)[case]
    with pytest.raises(exc, match=message):
        torch.ops.ptxdsl.decode_attention(*args, **kwargs)


def test_cpu_tensors_are_named(ops, torch):
    q = torch.zeros(1, 1, 8, 64, dtype=torch.bfloat16)
    kv = torch.zeros(1, 16, 1, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^decode_attention: q must be on a CUDA device"):
        torch.ops.ptxdsl.decode_attention(q, kv, kv, torch.ones(1, dtype=torch.int32))


def test_compile_traces_without_a_graph_break(ops, torch, fake):
    def f(q, k, v, n, table):
        return torch.ops.ptxdsl.decode_attention(q * 2, k, v, n, table).sum(2)

    out, targets = compile_one_graph(
        torch, f, cuda(torch, 2, 2, 8, 64), cuda(torch, 40, 64, 2, 64),
        cuda(torch, 40, 64, 2, 64), lens(torch, 2), cuda(torch, 2, 20, dtype=torch.int32))
    assert out.shape == (2, 2, 64)
    assert "ptxdsl.decode_attention" in targets


def test_every_config_builds(ops):
    from ptxdsl.torch.kernels import DECODE_BOXES, DECODE_HEAD_DIMS, decode_kernel

    for d in DECODE_HEAD_DIMS:
        for box in DECODE_BOXES:
            assert ".entry" in decode_kernel(d, box).ptx()


# ----------------------------------------------------------------------------- GPU


@pytest.fixture(scope="module")
def gpu(cuda, gpu_cache):
    yield


def rand(torch, *shape, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=g).to(torch.bfloat16)


def make_cache(torch, b, capacity, kvh, d, page, seed):
    """K and V caches holding `capacity` keys a sequence: contiguous (page None), or pages
    in shuffled order with a block table (and spare pages nobody's table names). The rows
    past any length are NaN, as a cache allocated with torch.empty may hold."""
    if page is None:
        return (rand(torch, b, capacity, kvh, d, seed=seed),
                rand(torch, b, capacity, kvh, d, seed=seed + 1), None)
    per = -(-capacity // page)
    total = b * per + 3
    k, v = rand(torch, total, page, kvh, d, seed=seed), rand(torch, total, page, kvh, d,
                                                               seed=seed + 1)
    g = torch.Generator(device="cuda").manual_seed(seed + 2)
    order = torch.randperm(total, device="cuda", generator=g)[: b * per]
    return k, v, order.reshape(b, per).to(torch.int32)


def poison_past(torch, k, v, table, n):
    """NaN in every cache row at or past each sequence's length."""
    for i, length in enumerate(n.tolist()):
        if table is None:
            k[i, length:] = float("nan")
            v[i, length:] = float("nan")
        else:
            flat = table[i].long()
            page = k.shape[1]
            for j, p in enumerate(flat.tolist()):
                start = max(0, length - j * page)
                k[p, start:] = float("nan")
                v[p, start:] = float("nan")


def assert_close(torch, o, ref):
    assert o.dtype == torch.bfloat16 and torch.isfinite(o).all()
    err = (o.float() - ref).abs()
    assert (err <= 2**-7 * ref.abs() + 2**-7).all(), float(err.max())


CASES = [  # b, s, h, kvh, d, capacity, page, lengths (None: random up to the capacity)
    (4, 1, 32, 8, 128, 4096, None, (0, 1, 4096, 1000)),
    (3, 1, 32, 8, 128, 8192, 16, (1, 129, 8000)),
    (2, 2, 32, 8, 128, 2048, 64, (2, 2048)),
    (5, 4, 16, 4, 64, 1024, 256, None),
    (2, 16, 64, 8, 128, 4096, 128, (16, 3000)),  # 128 rows: two tiles a KV head
    (1, 1, 32, 8, 128, 131072, 256, (131072,)),  # one long sequence: many splits
    (64, 1, 32, 8, 128, 1024, None, None),
    (2, 3, 8, 8, 64, 512, 32, (3, 2)),  # MHA; a length below the new tokens
]


@pytest.mark.gpu
@pytest.mark.parametrize("b, s, h, kvh, d, capacity, page, lengths", CASES)
def test_matches_torch_math(ops, torch, gpu, b, s, h, kvh, d, capacity, page, lengths):
    from ptxdsl.torch.decode import reference

    k, v, table = make_cache(torch, b, capacity, kvh, d, page, seed=b + s + d)
    if lengths is None:
        g = torch.Generator(device="cuda").manual_seed(7)
        n = torch.randint(0, capacity + 1, (b,), device="cuda", generator=g, dtype=torch.int32)
    else:
        n = torch.tensor(lengths, device="cuda", dtype=torch.int32)
    poison_past(torch, k, v, table, n)
    q = rand(torch, b, s, h, d, seed=3)
    for causal in (True, False):
        ref = reference(q, k, v, n, table, causal)
        first = torch.ops.ptxdsl.decode_attention(q, k, v, n, table, causal)
        assert_close(torch, first, ref)
        again = torch.ops.ptxdsl.decode_attention(q, k, v, n, table, causal)
        assert torch.equal(first.view(torch.int16), again.view(torch.int16))


@pytest.mark.gpu
def test_lengths_and_pages_out_of_range_read_nothing_outside(ops, torch, gpu):
    """Lengths past the capacity or negative, and table entries outside the pages: clamped
    (the reference clamps the same way) and read as zeros, never a fault."""
    from ptxdsl.torch.decode import reference

    k, v, table = make_cache(torch, 2, 256, 2, 64, 16, seed=1)
    table[1, 3] = 10**6
    table[1, 5] = -7
    n = torch.tensor([-5, 10**6], device="cuda", dtype=torch.int32)
    q = rand(torch, 2, 1, 8, 64, seed=2)
    o = torch.ops.ptxdsl.decode_attention(q, k, v, n, table)
    torch.cuda.synchronize()
    assert torch.all(o[0] == 0) and torch.isfinite(o).all()
    # pages outside the cache read as zeros: the reference's are a zero page past the end
    kz, vz = (torch.cat([c, torch.zeros_like(c[:1])]) for c in (k, v))
    fixed = table.clone()
    fixed[1, 3] = fixed[1, 5] = kz.shape[0] - 1
    ref = reference(q, kz, vz, n, fixed)
    assert_close(torch, o[1:], ref[1:])


@pytest.mark.gpu
def test_in_a_cuda_graph(ops, torch, gpu):
    """Captured after a first call, replayed on new lengths and a new query."""
    from ptxdsl.torch.decode import reference

    k, v, table = make_cache(torch, 8, 2048, 8, 128, 64, seed=5)
    n = torch.full((8,), 1000, device="cuda", dtype=torch.int32)
    q = rand(torch, 8, 1, 32, 128, seed=6)
    torch.ops.ptxdsl.decode_attention(q, k, v, n, table)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.ptxdsl.decode_attention(q, k, v, n, table)
    n.copy_(torch.arange(8, device="cuda", dtype=torch.int32) * 250)
    q.copy_(rand(torch, 8, 1, 32, 128, seed=7))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(torch, out, reference(q, k, v, n, table))
