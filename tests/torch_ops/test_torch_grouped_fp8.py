"""torch.ops.ptxdsl.grouped_mm_fp8 and grouped_mm_fp8_masked: the block-scaled (DeepGEMM
recipe) grouped e4m3 GEMM as torch ops, in torch._grouped_mm's contiguous layout and in
decoding's masked one.

Without a GPU (torch's CPU build): the schemas, the fake outputs, every input check and
torch.compile(fullgraph=True) tracing both. With a GPU: results against torch's product of
the dequantised inputs, summed in float64 (bench/grouped.py's Fp8Experts), within 2^-7 |ref|
+ 2^-6 ||a row|| ||b row|| / sqrt(K) (bench/fp8.py's tolerance): ragged and empty experts,
ragged N and K, counts over the capacity, negative and decreasing offsets, and CUDA-graph
replay with new counts."""

from __future__ import annotations

import pytest
from conftest import compile_one_graph
from conftest import cuda_empty as cuda

BENCH = "grouped"  # the conftest fixture `bench`: bench/grouped.py (Fp8Experts)


def fp8(torch, *shape):
    return cuda(torch, *shape, dtype=torch.float8_e4m3fn)


def f32(torch, *shape):
    return cuda(torch, *shape, dtype=torch.float32)


def i32(torch, *shape):
    return cuda(torch, *shape, dtype=torch.int32)


def contiguous_args(torch, t=300, e=4, n=136, k=256):
    return (fp8(torch, t, k), fp8(torch, e, n, k), f32(torch, t, -(-k // 128)),
            f32(torch, e, -(-n // 128), -(-k // 128)), i32(torch, e))


def masked_args(torch, e=4, cap=64, n=136, k=256):
    return (fp8(torch, e, cap, k), fp8(torch, e, n, k), f32(torch, e, cap, -(-k // 128)),
            f32(torch, e, -(-n // 128), -(-k // 128)), i32(torch, e))


def test_schemas_and_fake_outputs(ops, torch, fake):
    for name, last in (("grouped_mm_fp8", "offs"), ("grouped_mm_fp8_masked", "counts")):
        schema = str(getattr(torch.ops.ptxdsl, name).default._schema)
        assert schema == (f"ptxdsl::{name}(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, "
                          f"Tensor {last}) -> Tensor")
    c = torch.ops.ptxdsl.grouped_mm_fp8(*contiguous_args(torch))
    assert (c.shape, c.dtype) == ((300, 136), torch.bfloat16)
    c = torch.ops.ptxdsl.grouped_mm_fp8_masked(*masked_args(torch, k=208))
    assert (c.shape, c.dtype) == ((4, 64, 136), torch.bfloat16)


def replace(args: tuple, i: int, value) -> tuple:
    return (*args[:i], value, *args[i + 1:])


ERRORS = [
    (lambda t: replace(contiguous_args(t), 1, fp8(t, 4, 136, 128)), ValueError,
     r"grouped_mm_fp8: a \(T x K\) and b \(E x N x K\) must have the same K"),
    (lambda t: replace(contiguous_args(t), 4, i32(t, 3)), ValueError,
     r"grouped_mm_fp8: offs must hold one row end per expert \(4\), got shape \(3,\)"),
    (lambda t: replace(contiguous_args(t), 4, cuda(t, 4, dtype=t.int64)), TypeError,
     "grouped_mm_fp8: offs must be torch.int32, got torch.int64"),
    (lambda t: replace(contiguous_args(t), 0, cuda(t, 300, 256)), TypeError,
     "grouped_mm_fp8: a must be torch.float8_e4m3fn, got torch.bfloat16"),
    (lambda t: replace(contiguous_args(t), 2, f32(t, 300, 1)), ValueError,
     r"grouped_mm_fp8: scale_a must hold one scale per row of a and 128 of K, \(T, ceil\(K / "
     r"128\)\) = \(300, 2\), got \(300, 1\)"),
    (lambda t: replace(contiguous_args(t), 3, f32(t, 4, 2, 3)), ValueError,
     r"grouped_mm_fp8: scale_b must hold one scale per 128 x 128 block of each expert's "
     r"weight, \(E, ceil\(N / 128\), ceil\(K / 128\)\) = \(4, 2, 2\), got \(4, 2, 3\)"),
    (lambda t: contiguous_args(t, k=200), ValueError,
     r"grouped_mm_fp8: K=200 breaks TMA's 16-byte rule"),
    (lambda t: contiguous_args(t, n=132), ValueError,
     r"grouped_mm_fp8: N=132 breaks TMA's 16-byte rule"),
    (lambda t: replace(contiguous_args(t), 3, f32(t, 4, 4)), ValueError,
     r"grouped_mm_fp8: scale_b must have 3 dimensions, got 2"),
    (lambda t: replace(masked_args(t), 1, fp8(t, 3, 136, 256)), ValueError,
     r"grouped_mm_fp8_masked: a \(E x C x K\) and b \(E x N x K\) must have the same E and K"),
    (lambda t: replace(masked_args(t), 2, f32(t, 256, 2)), ValueError,
     r"grouped_mm_fp8_masked: scale_a must have 3 dimensions, got 2"),
    (lambda t: replace(masked_args(t), 2, f32(t, 4, 63, 2)), ValueError,
     r"grouped_mm_fp8_masked: scale_a must hold one scale per row of a and 128 of K, \(E, C, "
     r"ceil\(K / 128\)\) = \(4, 64, 2\), got \(4, 63, 2\)"),
    (lambda t: replace(masked_args(t), 4, i32(t, 4, 1)), ValueError,
     r"grouped_mm_fp8_masked: counts must have 1 dimensions, got 2"),
    (lambda t: masked_args(t, cap=0), ValueError,
     r"grouped_mm_fp8_masked: a must have rows and b experts, got a \(4, 0, 256\)"),
]


@pytest.mark.parametrize("make, exc, message", ERRORS)
def test_rejects(ops, torch, fake, make, exc, message):
    args = make(torch)
    op = torch.ops.ptxdsl.grouped_mm_fp8_masked if args[0].dim() == 3 else \
        torch.ops.ptxdsl.grouped_mm_fp8
    with pytest.raises(exc, match=message):
        op(*args)


@pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")  # dynamo's own imports
def test_compile_traces_both_without_a_graph_break(ops, torch, fake):
    def f(a, b, sa, sb, offs, am, sam, counts):
        return (torch.ops.ptxdsl.grouped_mm_fp8(a, b, sa, sb, offs).sum() +
                torch.ops.ptxdsl.grouped_mm_fp8_masked(am, b, sam, sb, counts).sum())

    a, b, sa, sb, offs = contiguous_args(torch)
    am, _, sam, _, counts = masked_args(torch)
    out, targets = compile_one_graph(torch, f, a, b, sa, sb, offs, am, sam, counts)
    assert out.shape == () and "ptxdsl.grouped_mm_fp8" in targets
    assert "ptxdsl.grouped_mm_fp8_masked" in targets


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("rows, n, k", [
    ([300, 0, 129, 1, 64], 1032, 528),      # ragged, an empty expert, a 1-row expert, K % 128
    ([256] * 8, 2048, 2048),                # whole tiles only
    ([0, 0, 77], 136, 16),                  # leading empty experts, one short K block
    ([17, 250, 3, 0, 511, 1000, 128, 129], 4104, 7168),  # DeepSeek-V3's K, ragged N
])
def test_contiguous_matches_the_dequantised_product(ops, torch, bench, rows, n, k):
    p = bench.Fp8Experts(rows, n, k, seed=sum(rows) + n + k)
    c = p.op()
    torch.cuda.synchronize()
    assert c.shape == (sum(rows), n) and p.error(c) <= 1.0, p.error(c)


@pytest.mark.gpu
@pytest.mark.parametrize("counts, cap, n, k", [
    ([3, 0, 40, 64, 17, 1], 64, 512, 1024),   # decode: a few tokens per expert
    ([200, 5, 129], 130, 264, 528),           # counts over the capacity are cut to it
])
def test_masked_matches_the_dequantised_product(ops, torch, bench, counts, cap, n, k):
    p = bench.Fp8Experts(counts, n, k, masked=True, cap=cap, seed=cap + n)
    c = p.op()
    torch.cuda.synchronize()
    assert c.shape == (len(counts), cap, n) and p.error(c) <= 1.0, p.error(c)


@pytest.mark.gpu
def test_negative_counts_and_bad_offsets_own_no_rows(ops, torch, bench):
    """Counts and offsets the ops cannot check without a sync: a negative count owns no
    rows (not every row), and decreasing or negative ends are made safe as grouped_mm
    makes them (each clamped to 0 .. T and raised to the running maximum)."""
    p = bench.Fp8Experts([10, 20, 30], 256, 256, masked=True, cap=32, seed=1)
    p.offs.copy_(torch.tensor([10, -3, 30], dtype=torch.int32))
    c = p.op()
    q = bench.Fp8Experts([10, 0, 30], 256, 256, masked=True, cap=32, seed=1)  # the same data
    torch.cuda.synchronize()
    assert q.error(c) <= 1.0, q.error(c)
    p = bench.Fp8Experts([100, 0, 0, 100], 256, 256, seed=2)
    p.offs.copy_(torch.tensor([100, 40, -5, 200], dtype=torch.int32))
    c = p.op()
    torch.cuda.synchronize()
    assert p.error(c) <= 1.0, p.error(c)


@pytest.mark.gpu
def test_cuda_graph_replays_with_new_counts(ops, torch, bench):
    p = bench.Fp8Experts([64, 64, 64, 64], 256, 512, masked=True, cap=64, seed=3)
    p.op()  # load and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c = p.op()
    p.offs.copy_(torch.tensor([5, 0, 64, 33], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    q = bench.Fp8Experts([5, 0, 64, 33], 256, 512, masked=True, cap=64, seed=3)
    assert q.error(c) <= 1.0, q.error(c)
