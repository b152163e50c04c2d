"""torch.ops.ptxdsl.kv_append: its schema (the caches declared written), fake calls, input
errors, version bumps, the refusal of inputs that need a gradient, torch.compile's
functionalization that inductor writes back in place (no copy of a cache), all without a GPU;
and on the GPU against torch indexing on fresh random data (contiguous and paged caches, 1 and
5 new tokens, uneven lengths, a page boundary inside the new tokens, V a view of a fused QKV
row), lengths and pages out of range writing nothing outside, decode_attention after the
append against the math SDPA, under torch.compile and in a CUDA graph."""

import pytest
from conftest import compile_one_graph
from conftest import cuda_empty as cuda
from test_torch_decode import assert_close, make_cache, rand

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")


# ----------------------------------------------------------------------------- no GPU


def test_schema(ops, torch):
    assert str(torch.ops.ptxdsl.kv_append.default._schema) == (
        "ptxdsl::kv_append(Tensor k_new, Tensor v_new, Tensor(a!) k_cache, "
        "Tensor(b!) v_cache, Tensor cache_seqlens, Tensor? block_table=None) -> ()")


def lens(torch, b):
    return cuda(torch, b, dtype=torch.int32)


def test_fake_calls_return_nothing(ops, torch, fake):
    new = cuda(torch, 4, 1, 8, 128)
    kv = cuda(torch, 4, 4096, 8, 128)
    assert torch.ops.ptxdsl.kv_append(new, new, kv, kv.clone(), lens(torch, 4)) is None
    pages = cuda(torch, 100, 16, 2, 64)
    table = cuda(torch, 3, 20, dtype=torch.int32)
    assert torch.ops.ptxdsl.kv_append(cuda(torch, 3, 5, 2, 64), cuda(torch, 3, 5, 2, 64),
                                      pages, pages.clone(), lens(torch, 3), table) is None


def test_views_of_a_fused_row_are_taken(ops, torch, fake):
    """K and V as slices of a (B, S, H + 2 KVH, D) projection: strided, 16-byte rows."""
    qkv = cuda(torch, 2, 3, 12, 64)
    pages = cuda(torch, 10, 32, 2, 64)
    torch.ops.ptxdsl.kv_append(qkv[:, :, 8:10], qkv[:, :, 10:], pages, pages.clone(),
                               lens(torch, 2), cuda(torch, 2, 4, dtype=torch.int32))


def bad_inputs(torch):
    new, kv, n = cuda(torch, 2, 1, 2, 128), cuda(torch, 2, 512, 2, 128), lens(torch, 2)
    kv2 = cuda(torch, 2, 512, 2, 128)
    pages, pages2 = cuda(torch, 64, 16, 2, 128), cuda(torch, 64, 16, 2, 128)
    table = cuda(torch, 2, 8, dtype=torch.int32)
    return [
        ((new.float(), new, kv, kv2, n), TypeError,
         "^kv_append: k_new must be bf16, got torch.float32$"),
        ((new, new, kv, kv2, n.long()), TypeError,
         "cache_seqlens must be torch.int32, got torch.int64"),
        ((new, new, pages, pages2, n, table.long()), TypeError,
         "block_table must be torch.int32, got torch.int64"),
        ((new, new[:, :, :1], kv, kv2, n), ValueError, "v_new must have k_new's shape"),
        ((cuda(torch, 2, 1, 2, 12), cuda(torch, 2, 1, 2, 12), cuda(torch, 2, 8, 2, 12),
          cuda(torch, 2, 8, 2, 12), n), ValueError,
         "head dim .* must be a multiple of 8 from 8 to 512, got 12"),
        ((new, new, kv, kv2[:, :256], n), ValueError, "v_cache must have k_cache's shape"),
        ((new, new, kv, kv, n), ValueError, "k_cache and v_cache must be two tensors"),
        ((new, new, cuda(torch, 2, 512, 4, 128), cuda(torch, 2, 512, 4, 128), n), ValueError,
         r"k_cache must hold k_new's heads and head dim \(2, 128\) .* got \(4, 128\)"),
        ((new, new, kv, kv2, lens(torch, 3)), ValueError, r"cache_seqlens must be \(2,\)"),
        ((new, new, cuda(torch, 3, 512, 2, 128), cuda(torch, 3, 512, 2, 128), n), ValueError,
         "a contiguous k_cache must be .* with k_new's B = 2"),
        ((new, new, pages, pages2, n, cuda(torch, 3, 8, dtype=torch.int32)), ValueError,
         r"block_table must be \(2, pages per sequence\), got \(3, 8\)"),
        ((new, new, cuda(torch, 64, 24, 2, 128), cuda(torch, 64, 24, 2, 128), n, table),
         ValueError, "page size .* must be a power of two, got 24"),
        ((new, new, cuda(torch, 2, 512, 128, 2).transpose(2, 3),
          cuda(torch, 2, 512, 128, 2).transpose(2, 3), n), ValueError,
         "k_cache must have unit stride in its last dimension"),
        ((new, new, kv, kv2, n.reshape(2, 1)), ValueError,
         "cache_seqlens must have 1 dimensions, got 2"),
    ]


BAD = 14  # the cases of bad_inputs


def test_every_bad_input_case_runs(ops, torch, fake):
    assert len(bad_inputs(torch)) == BAD


@pytest.mark.parametrize("case", range(BAD))
def test_bad_inputs_are_named(ops, torch, fake, case):
    args, exc, message = bad_inputs(torch)[case]
    with pytest.raises(exc, match=message):
        torch.ops.ptxdsl.kv_append(*args)


def test_cpu_tensors_are_named(ops, torch):
    new = torch.zeros(1, 1, 1, 64, dtype=torch.bfloat16)
    kv = torch.zeros(1, 16, 1, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^kv_append: k_new must be on a CUDA device"):
        torch.ops.ptxdsl.kv_append(new, new, kv, kv.clone(), torch.ones(1, dtype=torch.int32))


def test_the_caches_versions_go_up(ops, torch, fake):
    """As after torch's own in-place ops: a cache saved for a backward and then appended to
    is an autograd error, not a wrong gradient."""
    new, kv, kv2 = cuda(torch, 2, 1, 2, 64), cuda(torch, 2, 64, 2, 64), cuda(torch, 2, 64, 2, 64)
    before = (new._version, kv._version, kv2._version)
    torch.ops.ptxdsl.kv_append(new, new, kv, kv2, lens(torch, 2))
    assert (new._version, kv._version, kv2._version) == (before[0], before[1] + 1,
                                                         before[2] + 1)


def test_inputs_that_need_a_gradient_are_refused(ops, torch, fake):
    new = cuda(torch, 2, 1, 2, 64).requires_grad_()
    kv = cuda(torch, 2, 64, 2, 64)
    with pytest.raises(RuntimeError, match="kv_append writes its inputs in place and has no "
                                           "backward"):
        torch.ops.ptxdsl.kv_append(new, new, kv, kv.clone(), lens(torch, 2))
    with torch.no_grad():
        torch.ops.ptxdsl.kv_append(new, new, kv, kv.clone(), lens(torch, 2))


def append_then_decode(torch, kn, vn, kc, vc, n, table, q):
    torch.ops.ptxdsl.kv_append(kn, vn, kc, vc, n, table)
    return torch.ops.ptxdsl.decode_attention(q, kc, vc, n, table)


def fake_decode_inputs(torch):
    kn = cuda(torch, 2, 1, 8, 128)
    kc, vc = cuda(torch, 10, 16, 8, 128), cuda(torch, 10, 16, 8, 128)
    return (kn, kn.clone(), kc, vc, lens(torch, 2), cuda(torch, 2, 5, dtype=torch.int32),
            cuda(torch, 2, 1, 32, 128))


def test_compile_traces_without_a_graph_break(ops, torch, fake):
    out, targets = compile_one_graph(torch, lambda *a: append_then_decode(torch, *a),
                                     *fake_decode_inputs(torch))
    assert out.shape == (2, 1, 32, 128)
    assert {"ptxdsl.kv_append", "ptxdsl.decode_attention"} <= targets


def test_inductor_writes_the_caches_in_place(ops, torch, fake):
    """torch.compile functionalizes the append (auto_functionalized) and inductor's reinplace
    pass, which decides what to copy first, copies neither cache: the kernel writes them where
    they are, and decode_attention reads what it wrote."""
    from torch._dynamo.backends.common import aot_autograd

    reinplace = pytest.importorskip("torch._inductor.fx_passes.reinplace")
    graphs = []

    def forward(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    backend = aot_autograd(fw_compiler=forward, keep_inference_input_mutations=True)
    torch._dynamo.reset()
    torch.compile(lambda *a: append_then_decode(torch, *a), backend=backend,
                  fullgraph=True)(*fake_decode_inputs(torch))
    (gm,) = graphs
    reinplace.reinplace_inplaceable_ops_core(gm.graph)
    calls = [n for n in gm.graph.nodes if "auto_functionalized" in str(n.target)]
    assert len(calls) == 1 and calls[0].args[0] is torch.ops.ptxdsl.kv_append.default
    assert calls[0].meta["only_clone_these_tensors"] == []


@pytest.mark.parametrize("paged", [True, False])
def test_the_launch_arguments_drive_the_kernel(ops, torch, paged):
    """The op's scalar arguments (kv_append.scalars, what its plan launches with) run the
    kernel in the interpreter on CPU tensors, V a view of a fused QKV row: the caches come
    out as numpy's reference has them (a wrong order or stride would scatter the rows)."""
    import numpy as np

    from ptxdsl.interp import run_sample
    from ptxdsl.kernels import kv_append as ka
    from ptxdsl.torch.kv_append import scalars

    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(torch.bfloat16)

    qkv = rand(3, 5, 4 + 2 + 2, 64)
    kn, vn = rand(3, 5, 2, 64), qkv[:, :, 6:]
    if paged:
        kc, vc = rand(9, 16, 2, 64), rand(9, 16, 2, 64)
        table = torch.tensor([[3, 0], [8, 1], [2, 5]], dtype=torch.int32)
    else:
        kc, vc, table = rand(3, 32, 2, 64), rand(3, 32, 2, 64), None
    n = torch.tensor([5, 19, 33], dtype=torch.int32)  # a page crossed; the capacity passed
    args = {"k_new": kn, "v_new": vn, "k_cache": kc, "v_cache": vc, "cache_seqlens": n,
            "block_table": table}

    def flat(t):  # raw bf16 bits from the tensor's first element on (its data pointer)
        base = t if t._base is None else t._base
        return base.reshape(-1).view(torch.int16)[t.storage_offset():].numpy().view(np.uint16)

    kd = ka.make_kv_append(d=64)
    names = [p.name for p in kd.ir.params]
    values = dict(zip(names[6:], scalars(args), strict=True))
    ex = {"grid": 2, "inputs": {"k_new": flat(kn), "v_new": flat(vn), "k_cache": flat(kc),
                               "v_cache": flat(vc), "lens": n.numpy(),
                               "table": (table if paged else n).numpy(),
                               **values},
          "expected": {"k_cache": None, "v_cache": None}}
    out = run_sample(kd.ir, ex)
    bits = {t: x.view(torch.int16).numpy().view(np.uint16) for t, x in
            (("kn", kn), ("vn", vn.contiguous()), ("kc", kc), ("vc", vc))}
    tab = None if table is None else table.numpy()
    for name, new, cache in (("k_cache", "kn", "kc"), ("v_cache", "vn", "vc")):
        want = ka.reference(bits[new], bits[cache], n.numpy(), tab)
        assert not np.array_equal(want, bits[cache])
        assert np.array_equal(out[name].reshape(want.shape), want), name


def test_every_config_builds(ops):
    from ptxdsl.torch.kernels import KV_APPEND_HEAD_DIMS, kv_append_kernel

    for d in KV_APPEND_HEAD_DIMS:
        assert f".entry kv_append_d{d}" in kv_append_kernel(d).ptx()


# ----------------------------------------------------------------------------- GPU


@pytest.fixture(scope="module")
def gpu(cuda, gpu_cache):
    yield


def expected(torch, new, cache, n, table):
    """The cache after the append, by torch indexing at places worked out on the host: new
    token t of sequence b at position n[b] - S + t, skipped outside the capacity or on a page
    outside the cache."""
    out = cache.clone()
    b, s = new.shape[:2]
    page_size = cache.shape[1]
    cap = table.shape[1] * page_size if table is not None else page_size
    rows = table.tolist() if table is not None else None
    pages, places, src = [], [], []
    for i, length in enumerate(n.tolist()):
        for t in range(s):
            pos = length - s + t
            if not 0 <= pos < cap:
                continue
            page = i if rows is None else rows[i][pos // page_size]
            if 0 <= page < cache.shape[0]:
                pages.append(page)
                places.append(pos % page_size if rows is not None else pos)
                src.append(i * s + t)
    if src:
        index = torch.tensor(src, device="cuda")
        out[torch.tensor(pages, device="cuda"), torch.tensor(places, device="cuda")] = \
            new.reshape(b * s, *new.shape[2:])[index]
    return out


def bits_equal(torch, a, b):
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


CASES = [  # b, s, kvh, d, capacity, page, lengths
    (4, 1, 8, 128, 4096, None, (1, 4096, 1000, 17)),
    (3, 5, 8, 128, 1024, 16, (5, 19, 1024)),  # sequence 1's new tokens cross a page
    (5, 1, 2, 64, 512, 64, (1, 64, 65, 300, 512)),
    (2, 5, 4, 64, 256, None, (5, 200)),
    (6, 5, 8, 128, 2048, 256, (255, 259, 5, 2000, 1024, 513)),  # pages crossed at 256
    (64, 1, 8, 128, 4096, 128, None),  # a decode step of a serving batch
]


@pytest.mark.gpu
@pytest.mark.parametrize("b, s, kvh, d, capacity, page, lengths", CASES)
def test_matches_torch_indexing(ops, torch, gpu, b, s, kvh, d, capacity, page, lengths):
    kc, vc, table = make_cache(torch, b, capacity, kvh, d, page, seed=b + s + d)
    if lengths is None:
        g = torch.Generator(device="cuda").manual_seed(7)
        n = torch.randint(s, capacity + 1, (b,), device="cuda", generator=g, dtype=torch.int32)
    else:
        n = torch.tensor(lengths, device="cuda", dtype=torch.int32)
    kn, vn = rand(torch, b, s, kvh, d, seed=3), rand(torch, b, s, kvh, d, seed=4)
    want_k, want_v = expected(torch, kn, kc, n, table), expected(torch, vn, vc, n, table)
    assert not bits_equal(torch, want_k, kc)  # the case writes something
    torch.ops.ptxdsl.kv_append(kn, vn, kc, vc, n, table)
    assert bits_equal(torch, kc, want_k) and bits_equal(torch, vc, want_v)


@pytest.mark.gpu
def test_views_of_a_fused_projection(ops, torch, gpu):
    """K and V sliced from one (B, S, H + 2 KVH, D) tensor, as the decoder block has them;
    only the caches' versions go up."""
    qkv = rand(torch, 3, 5, 32 + 16, 128, seed=5)
    kn, vn = qkv[:, :, 32:40], qkv[:, :, 40:]
    kc, vc, table = make_cache(torch, 3, 512, 8, 128, 32, seed=6)
    n = torch.tensor([5, 40, 512], device="cuda", dtype=torch.int32)
    want_k, want_v = expected(torch, kn, kc, n, table), expected(torch, vn, vc, n, table)
    versions = kc._version, vc._version, qkv._version
    torch.ops.ptxdsl.kv_append(kn, vn, kc, vc, n, table)
    assert bits_equal(torch, kc, want_k) and bits_equal(torch, vc, want_v)
    # the call that goes straight to the launch bumps the caches' versions once, as the
    # dispatcher's ADInplaceOrView kernel would
    assert (kc._version, vc._version, qkv._version) == (versions[0] + 1, versions[1] + 1,
                                                        versions[2])


@pytest.mark.gpu
def test_out_of_range_writes_nothing_outside(ops, torch, gpu):
    """Lengths negative or past the capacity and table entries outside the pages: skipped;
    the caches are views inside larger buffers whose edges stay as they were."""
    page, kvh, d = 16, 2, 64
    kbuf, vbuf = rand(torch, 14, page, kvh, d, seed=8), rand(torch, 14, page, kvh, d, seed=9)
    kc, vc = kbuf[2:12], vbuf[2:12]  # 10 pages; two guard pages either side
    # sequence 1's new tokens fall on its two bad pages; sequence 3 (sequence 0's pages:
    # that one writes nothing) crosses a page
    table = torch.tensor([[0, 1, 2, 3], [4, 10**6, -7, 5], [6, 7, 8, 9], [0, 1, 2, 3]],
                         device="cuda", dtype=torch.int32)
    n = torch.tensor([-5, 34, 10**6, 18], device="cuda", dtype=torch.int32)
    kn, vn = rand(torch, 4, 5, kvh, d, seed=10), rand(torch, 4, 5, kvh, d, seed=11)
    kb0, vb0 = kbuf.clone(), vbuf.clone()
    want_k, want_v = expected(torch, kn, kc, n, table), expected(torch, vn, vc, n, table)
    assert not bits_equal(torch, want_k, kc)  # sequence 3 writes
    torch.ops.ptxdsl.kv_append(kn, vn, kc, vc, n, table)
    torch.cuda.synchronize()
    assert bits_equal(torch, kc, want_k) and bits_equal(torch, vc, want_v)
    for buf, before in ((kbuf, kb0), (vbuf, vb0)):
        assert bits_equal(torch, buf[:2], before[:2]) and bits_equal(torch, buf[12:],
                                                                      before[12:])


def sdpa_math(torch, q, kc, vc, n, table):
    """decode attention by torch's math SDPA in f32, sequence by sequence over the gathered
    cache, causal aligned to the end (new token t of a length-L sequence sees keys up to
    L - S + t)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, s, h, d = q.shape
    out = torch.empty(q.shape, dtype=torch.float32, device="cuda")
    for i, length in enumerate(n.tolist()):
        kk, vv = (c[table[i].long()].flatten(0, 1) if table is not None else c[i]
                  for c in (kc, vc))
        kk, vv = (x[:length].float().transpose(0, 1) for x in (kk, vv))  # (KVH, L, D)
        see = torch.arange(length, device="cuda")[None, :] <= \
            (length - s + torch.arange(s, device="cuda"))[:, None]
        with sdpa_kernel(SDPBackend.MATH):
            o = F.scaled_dot_product_attention(q[i].float().transpose(0, 1)[None], kk[None],
                                               vv[None], attn_mask=see, enable_gqa=True)
        out[i] = o[0].transpose(0, 1)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("s, page", [(1, 64), (5, 16), (3, None)])
def test_decode_attention_after_the_append(ops, torch, gpu, s, page):
    """Append S new tokens of uneven sequences, then attend: what decode_attention reads is
    what the append wrote, against the math SDPA."""
    b, h, kvh, d = 4, 32, 8, 128
    kc, vc, table = make_cache(torch, b, 1024, kvh, d, page, seed=12 + s)
    n = torch.tensor([s, 17, 600, 1024], device="cuda", dtype=torch.int32)
    kn, vn = rand(torch, b, s, kvh, d, seed=13), rand(torch, b, s, kvh, d, seed=14)
    q = rand(torch, b, s, h, d, seed=15)
    o = append_then_decode(torch, kn, vn, kc, vc, n, table, q)
    assert_close(torch, o, sdpa_math(torch, q, kc, vc, n, table))
    for i in range(b):  # the new tokens themselves are in the cache, where attention saw them
        last = n[i].item()
        kk = kc[table[i].long()].flatten(0, 1) if table is not None else kc[i]
        assert bits_equal(torch, kk[last - s:last], kn[i])


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:TensorFloat32 tensor cores")  # inductor's advice
def test_compiled_equals_eager(ops, torch, gpu):
    """Through inductor: the caches written in place, the same bits as eager."""
    kc, vc, table = make_cache(torch, 3, 512, 8, 128, 16, seed=20)
    n = torch.tensor([1, 200, 511], device="cuda", dtype=torch.int32)
    kn, vn = rand(torch, 3, 1, 8, 128, seed=21), rand(torch, 3, 1, 8, 128, seed=22)
    q = rand(torch, 3, 1, 32, 128, seed=23)
    kc2, vc2 = kc.clone(), vc.clone()
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: append_then_decode(torch, *a), fullgraph=True)
    got = compiled(kn * 2, vn, kc, vc, n, table, q)
    want = append_then_decode(torch, kn * 2, vn, kc2, vc2, n, table, q)
    assert bits_equal(torch, got, want)
    assert bits_equal(torch, kc, kc2) and bits_equal(torch, vc, vc2)


@pytest.mark.gpu
def test_in_a_cuda_graph(ops, torch, gpu):
    """Append and attend captured after a first call, replayed on new lengths, new tokens
    and a new query: the replay writes where the new lengths say."""
    kc, vc, table = make_cache(torch, 8, 2048, 8, 128, 64, seed=30)
    n = torch.full((8,), 1000, device="cuda", dtype=torch.int32)
    kn, vn = rand(torch, 8, 1, 8, 128, seed=31), rand(torch, 8, 1, 8, 128, seed=32)
    q = rand(torch, 8, 1, 32, 128, seed=33)
    append_then_decode(torch, kn, vn, kc, vc, n, table, q)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = append_then_decode(torch, kn, vn, kc, vc, n, table, q)
    n.copy_(torch.arange(8, device="cuda", dtype=torch.int32) * 250 + 3)
    kn.copy_(rand(torch, 8, 1, 8, 128, seed=34))
    vn.copy_(rand(torch, 8, 1, 8, 128, seed=35))
    q.copy_(rand(torch, 8, 1, 32, 128, seed=36))
    want_k, want_v = expected(torch, kn, kc, n, table), expected(torch, vn, vc, n, table)
    graph.replay()
    torch.cuda.synchronize()
    assert bits_equal(torch, kc, want_k) and bits_equal(torch, vc, want_v)
    assert_close(torch, out, sdpa_math(torch, q, kc, vc, n, table))
