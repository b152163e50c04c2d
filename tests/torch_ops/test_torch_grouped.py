"""torch.ops.ptxdsl.grouped_mm: the mixture-of-experts grouped GEMM as a torch op, in
torch._grouped_mm's contiguous layout (a T x K, b E x N x K, int32 cumulative row ends).

Without a GPU (torch's CPU build): the schema, the fake output, every input check and
torch.compile(fullgraph=True) tracing it; skipped where torch is not installed (CI). With a
GPU: results against each expert's f32 product (ragged and empty experts) and against
torch._grouped_mm, offsets past the end, and CUDA-graph replay with new offsets."""

from __future__ import annotations

import pytest
from conftest import compile_one_graph
from conftest import cuda_empty as cuda


def offsets(torch, ends, device="cuda"):
    return torch.tensor(ends, dtype=torch.int32, device=device)


def test_schema_and_fake_output(ops, torch, fake):
    schema = str(torch.ops.ptxdsl.grouped_mm.default._schema)
    assert schema == "ptxdsl::grouped_mm(Tensor a, Tensor b, Tensor offs) -> Tensor"
    c = torch.ops.ptxdsl.grouped_mm(cuda(torch, 300, 64), cuda(torch, 4, 136, 64),
                                    cuda(torch, 4, dtype=torch.int32))
    assert (c.shape, c.dtype) == ((300, 136), torch.bfloat16)


ERRORS = [
    (lambda t: (cuda(t, 8, 64), cuda(t, 2, 8, 32), cuda(t, 2, dtype=t.int32)), ValueError,
     r"grouped_mm: a \(T x K\) and b \(E x N x K\) must have the same K"),
    (lambda t: (cuda(t, 8, 64), cuda(t, 2, 8, 64), cuda(t, 3, dtype=t.int32)), ValueError,
     r"grouped_mm: offs must hold one row end per expert \(2\), got shape \(3,\)"),
    (lambda t: (cuda(t, 8, 64), cuda(t, 2, 8, 64), cuda(t, 2, dtype=t.int64)), TypeError,
     "grouped_mm: offs must be int32|grouped_mm: offs must be torch.int32"),
    (lambda t: (cuda(t, 8, 64), cuda(t, 2, 12, 64), cuda(t, 2, dtype=t.int32)), ValueError,
     r"grouped_mm: N must be a multiple of 8"),
    (lambda t: (cuda(t, 8, 60), cuda(t, 2, 8, 60), cuda(t, 2, dtype=t.int32)), ValueError,
     r"grouped_mm: K must be a multiple of 8"),
    (lambda t: (cuda(t, 8, 64), cuda(t, 8, 64), cuda(t, 2, dtype=t.int32)), ValueError,
     r"grouped_mm: b must have 3 dimensions, got 2"),
]


@pytest.mark.parametrize("make, exc, message", ERRORS)
def test_rejects(ops, torch, fake, make, exc, message):
    with pytest.raises(exc, match=message):
        torch.ops.ptxdsl.grouped_mm(*make(torch))


@pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")  # dynamo's own imports
def test_compile_traces_it_without_a_graph_break(ops, torch, fake):
    def f(a, b, offs):
        return torch.ops.ptxdsl.grouped_mm(a, b, offs) * 2

    out, targets = compile_one_graph(torch, f, cuda(torch, 64, 128), cuda(torch, 2, 256, 128),
                                     cuda(torch, 2, dtype=torch.int32))
    assert out.shape == (64, 256) and "ptxdsl.grouped_mm" in targets


# ----------------------------------------------------------------------------- GPU


def reference(torch, a, b, ends):
    out = torch.zeros(a.shape[0], b.shape[1], device="cuda")
    start = 0
    for g, end in enumerate(ends):
        out[start:end] = a[start:end].float() @ b[g].float().T
        start = end
    return out


def rand(torch, *shape, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=g).to(torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("rows, n, k", [([300, 0, 129, 1, 64], 1032, 520),
                                        ([128] * 8, 2048, 1024), ([0, 0, 77], 256, 64)])
def test_matches_each_experts_product(ops, torch, rows, n, k):
    import itertools

    ends = list(itertools.accumulate(rows))
    a, b = rand(torch, ends[-1], k, seed=n), rand(torch, len(rows), n, k, seed=k)
    c = torch.ops.ptxdsl.grouped_mm(a, b, offsets(torch, ends))
    torch.cuda.synchronize()
    torch.testing.assert_close(c.float(), reference(torch, a, b, ends), rtol=2**-7,
                               atol=1e-3 * k**0.5)
    if all(e % 16 == 0 for e in ends):  # what torch._grouped_mm takes
        ref = torch._grouped_mm(a, b.transpose(1, 2), offs=offsets(torch, ends))
        torch.testing.assert_close(c.float(), ref.float(), rtol=2**-7, atol=1e-3 * k**0.5)


@pytest.mark.gpu
def test_offsets_past_the_end_compute_the_rows_that_exist(ops, torch):
    """An expert's end past T (a bad offset the op cannot check without a sync): the rows
    that exist are right, and the kernel stores no row past T (its `tokens` bound)."""
    a, b = rand(torch, 200, 64, seed=1), rand(torch, 2, 128, 64, seed=2)
    c = torch.ops.ptxdsl.grouped_mm(a, b, offsets(torch, [150, 400]))
    torch.cuda.synchronize()
    torch.testing.assert_close(c[:150].float(), a[:150].float() @ b[0].float().T,
                               rtol=2**-7, atol=1e-3 * 8)
    torch.testing.assert_close(c[150:].float(), a[150:].float() @ b[1].float().T,
                               rtol=2**-7, atol=1e-3 * 8)


@pytest.mark.gpu
def test_decreasing_and_negative_offsets_are_made_safe(ops, torch):
    """Offsets the op cannot check without a sync: each is clamped to 0 .. T and raised to
    the running maximum on the device, so an expert whose end falls below the previous one
    owns no rows (no row count wraps around, no endless walk)."""
    a, b = rand(torch, 256, 64, seed=5), rand(torch, 4, 128, 64, seed=6)
    c = torch.ops.ptxdsl.grouped_mm(a, b, offsets(torch, [100, 40, -5, 200]))
    torch.cuda.synchronize()
    torch.testing.assert_close(c[:200].float(), reference(torch, a, b, [100, 100, 100, 200])[:200],
                               rtol=2**-7, atol=1e-3 * 8)


@pytest.mark.gpu
def test_cuda_graph_replays_with_new_offsets(ops, torch):
    a, b = rand(torch, 512, 128, seed=3), rand(torch, 4, 256, 128, seed=4)
    offs = offsets(torch, [128, 256, 384, 512])
    torch.ops.ptxdsl.grouped_mm(a, b, offs)  # load and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c = torch.ops.ptxdsl.grouped_mm(a, b, offs)
    offs.copy_(offsets(torch, [100, 100, 300, 512]))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(c.float(), reference(torch, a, b, [100, 100, 300, 512]),
                               rtol=2**-7, atol=1e-3 * 128**0.5)
