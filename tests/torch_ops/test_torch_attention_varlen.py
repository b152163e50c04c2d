"""torch.ops.ptxdsl.attention_varlen: packed sequences of different lengths (FlashAttention's
cu_seqlens layout). Without a GPU: its schema, fake outputs, input errors, a torch.compile
trace, every build it may run assembling; on the GPU (fresh random data) against torch's
math-backend SDPA sequence by sequence, causal, windowed and GQA, with sequences of 0 and 1
rows."""

import numpy as np
import pytest
from conftest import compile_one_graph
from conftest import cuda_empty as cuda
from test_torch_decode import lens

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")


# ----------------------------------------------------------------------------- no GPU


def test_schema(ops, torch):
    assert str(torch.ops.ptxdsl.attention_varlen.default._schema) == (
        "ptxdsl::attention_varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, "
        "Tensor cu_seqlens_k, int max_seqlen_q=-1, int max_seqlen_k=-1, bool causal=False, "
        "float? scale=None, int window_left=-1, int window_right=-1, float softcap=0.) -> "
        "Tensor")


def test_fake_outputs(ops, torch, fake):
    q, kv = cuda(torch, 700, 8, 128), cuda(torch, 900, 2, 128)
    o = torch.ops.ptxdsl.attention_varlen(q, kv, kv, lens(torch, 4), lens(torch, 4), 300,
                                          causal=True)
    assert (o.shape, o.dtype, o.device.type) == ((700, 8, 128), torch.bfloat16, "cuda")
    packed = cuda(torch, 500, 3, 4, 64)  # q, k and v as slices of one packed projection
    o = torch.ops.ptxdsl.attention_varlen(packed[:, 0], packed[:, 1], packed[:, 2],
                                          lens(torch, 3), lens(torch, 3), 250)
    assert o.shape == (500, 4, 64) and o.is_contiguous()


def bad_inputs(torch):
    q, kv, cu = cuda(torch, 100, 4, 64), cuda(torch, 120, 2, 64), lens(torch, 3)
    return [
        ((q.float(), kv, kv, cu, cu), {}, TypeError, "^attention_varlen: q must be bf16"),
        ((q, kv, kv, cu.long(), cu), {}, TypeError,
         "cu_seqlens_q must be torch.int32, got torch.int64"),
        ((q[None], kv, kv, cu, cu), {}, ValueError, "q must have 3 dimensions, got 4"),
        ((q, kv, kv[:60], cu, cu), {}, ValueError, "v must have k's shape"),
        ((q, cuda(torch, 120, 3, 64), cuda(torch, 120, 3, 64), cu, cu), {}, ValueError,
         r"k's heads must divide q's \(4\), got 3"),
        ((q, kv, kv, cu, lens(torch, 4)), {}, ValueError,
         r"cu_seqlens_q and cu_seqlens_k must both be \(B \+ 1,\) with B >= 1, got \(3,\) and "
         r"\(4,\)"),
        ((q, kv, kv, lens(torch, 1), lens(torch, 1)), {}, ValueError, "with B >= 1"),
        ((q, kv, kv, cu, cu, 101), {}, ValueError,
         r"max_seqlen_q must be the longest sequence's query rows \(1 .. total_q = 100\), or "
         r"-1 \(total_q\), got 101"),
        ((q, kv, kv, cu, cu, 0), {}, ValueError, "max_seqlen_q must be"),
        ((q, kv[:0], kv[:0], cu, cu), {}, ValueError, "k and v must hold at least one key"),
        ((q, kv, kv, cu, cu), {"window_right": -3}, ValueError,
         "window_left and window_right must be -1"),
        ((q, kv, kv, cu, cu), {"scale": float("inf")}, ValueError, "scale must be positive"),
        ((cuda(torch, 100, 4, 96), cuda(torch, 120, 2, 96), cuda(torch, 120, 2, 96), cu, cu),
         {}, ValueError, "head dim .* must be 64 or 128, got 96"),
    ]


BAD = 13


def test_every_bad_input_case_runs(ops, torch, fake):
    assert len(bad_inputs(torch)) == BAD


@pytest.mark.parametrize("case", range(BAD))
def test_bad_inputs_are_named(ops, torch, fake, case):
    args, kwargs, exc, message = bad_inputs(torch)[case]
    with pytest.raises(exc, match=message):
        torch.ops.ptxdsl.attention_varlen(*args, **kwargs)


def test_the_window_a_varlen_call_runs(ops):
    """The varlen build has no causal form: causal runs the window (left, 0)."""
    from ptxdsl.torch.attention import varlen_window

    def call(causal, left=-1, right=-1):
        return varlen_window({"causal": causal, "window_left": left, "window_right": right})

    assert call(False) is None
    assert call(True) == (-1, 0)
    assert call(True, 100, 5) == (100, 0)
    assert call(False, -1, 3) == (-1, 3)


@pytest.mark.parametrize("causal, left, right", [(False, -1, -1), (True, 20, -1)])
def test_the_launch_arguments_drive_the_kernel(ops, torch, causal, left, right):
    """The op's scalar arguments (varlen_scalars, what its plan launches with) run the
    kernel it picks in the interpreter: O matches numpy's per-sequence reference (a wrong
    order, window or scale would not)."""
    from conftest import sample_module

    from ptxdsl.interp import run_sample
    from ptxdsl.runtime.dtypes import bf16_bits_to_f32
    from ptxdsl.torch.attention import varlen_scalars, varlen_window
    from ptxdsl.torch.kernels import attention_configs, attention_kernel

    lengths = [(40, 60), (1, 1), (90, 130)]
    twin = sample_module("attention")
    args = {"q": torch.empty(131, 2, 64, dtype=torch.bfloat16),
            "k": torch.empty(191, 1, 64, dtype=torch.bfloat16),
            "cu_seqlens_q": torch.zeros(4, dtype=torch.int32), "max_seqlen_q": 90,
            "causal": causal, "scale": None, "window_left": left, "window_right": right,
            "softcap": 0.0}
    window = varlen_window(args)
    c = attention_configs(64)[0]
    kd = attention_kernel(64, False, c["pingpong"], c["hold"], c["nwg"], window is not None,
                          True)
    ex = twin.example_varlen(np.random.default_rng(1), lengths, heads=2, kv_heads=1, d=64,
                             nwg=c["nwg"], window=window, grid=2)
    names = [p.name for p in kd.ir.params]
    ex["inputs"] = {**{n: ex["inputs"][n] for n in names[:7] if n in ex["inputs"]},
                    **dict(zip(names[7:], varlen_scalars(args), strict=True))}
    out = run_sample(kd.ir, {"kernel": kd.name, **ex})
    want = ex["expected"]["o"]
    assert np.abs(bf16_bits_to_f32(out["o"]) - want).max() < 2 ** -6 * (1 + np.abs(want).max())


def test_compile_traces_without_a_graph_break(ops, torch, fake):
    def f(q, k, v, cu_q, cu_k):
        return torch.ops.ptxdsl.attention_varlen(q * 2, k, v, cu_q, cu_k, 128, causal=True,
                                                 window_left=64).sum(1)

    out, targets = compile_one_graph(torch, f, cuda(torch, 300, 4, 64), cuda(torch, 300, 1, 64),
                                     cuda(torch, 300, 1, 64), lens(torch, 4), lens(torch, 4))
    assert out.shape == (300, 64)
    assert "ptxdsl.attention_varlen" in targets


def test_the_builds_it_runs_assemble_without_spills(ops, tmp_path):
    from conftest import assemble, assert_no_spills

    from ptxdsl.torch.kernels import attention_configs, attention_kernel

    for d in (64, 128):
        c = attention_configs(d)[0]
        for window in (False, True):
            kd = attention_kernel(d, False, c["pingpong"], c["hold"], c["nwg"], window, True)
            assert_no_spills(assemble(kd.ptx("sm_90a"), tmp_path))


# ----------------------------------------------------------------------------- GPU


def packed(torch, lengths, h, kvh, d, seed):
    """Random bf16 packed q (total_q, h, d), k and v (total_k, kvh, d) and their int32
    cu_seqlens for `lengths`, a list of (query rows, keys)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    nq, nk = (torch.tensor([n[i] for n in lengths]) for i in (0, 1))
    cu_q, cu_k = (torch.cat([torch.zeros(1, dtype=torch.int64), n.cumsum(0)]).to(
        device="cuda", dtype=torch.int32) for n in (nq, nk))
    q = torch.randn(int(nq.sum()), h, d, device="cuda", generator=g).to(torch.bfloat16)
    k, v = (torch.randn(int(nk.sum()), kvh, d, device="cuda", generator=g).to(torch.bfloat16)
            for _ in "kv")
    return q, k, v, cu_q, cu_k


def reference(torch, q, k, v, lengths, causal, left, right):
    """The math backend in f32 per sequence, the mask written out (aligned to each
    sequence's end; -1 unbounded; causal: right 0)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    right = 0 if causal else right
    r0 = k0 = 0
    for nq, nk in lengths:
        rows = torch.arange(nq, device=q.device)[:, None] + (nk - nq)
        keys = torch.arange(nk, device=q.device)[None, :]
        mask = torch.ones(nq, nk, dtype=torch.bool, device=q.device)
        if left >= 0:
            mask &= keys >= rows - left
        if right >= 0:
            mask &= keys <= rows + right
        if nq and nk:
            qs, ks, vs = (x.float().transpose(0, 1)[None] for x in
                          (q[r0:r0 + nq], k[k0:k0 + nk], v[k0:k0 + nk]))
            with sdpa_kernel(SDPBackend.MATH):
                o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, enable_gqa=True)
            out[r0:r0 + nq] = o[0].transpose(0, 1)
        r0, k0 = r0 + nq, k0 + nk
    return out


CASES = [  # lengths (query rows, keys), h, kvh, d, causal, left, right
    ([(1000, 1000), (1, 1), (0, 0), (333, 333), (4097, 4097)], 8, 2, 128, False, -1, -1),
    ([(1000, 1000), (1, 1), (0, 0), (333, 333), (4097, 4097)], 8, 2, 64, True, -1, -1),
    ([(17, 900), (200, 200), (129, 4000)], 4, 4, 128, True, -1, -1),   # KV caches
    ([(2048, 2048), (77, 77), (1500, 1500)], 16, 4, 64, True, 256, -1),  # local, causal
    ([(700, 700), (5, 5), (300, 450)], 4, 1, 128, False, 31, 8),         # a band, MQA
]


@pytest.mark.gpu
@pytest.mark.parametrize("lengths, h, kvh, d, causal, left, right", CASES)
def test_varlen_matches_the_math_backend(ops, torch, cuda, gpu_cache, lengths, h, kvh, d,
                                         causal, left, right):
    q, k, v, cu_q, cu_k = packed(torch, lengths, h, kvh, d, seed=len(lengths) + d)
    o = torch.ops.ptxdsl.attention_varlen(q, k, v, cu_q, cu_k, max(n for n, _ in lengths),
                                          causal=causal, window_left=left, window_right=right)
    ref = reference(torch, q, k, v, lengths, causal, left, right)
    assert o.dtype == torch.bfloat16 and torch.isfinite(o).all()
    err = (o.float() - ref).abs()
    assert (err <= 2**-7 * ref.abs() + 2**-7).all(), float(err.max())


@pytest.mark.gpu
def test_varlen_without_max_seqlen_and_in_a_graph(ops, torch, cuda, gpu_cache):
    """max_seqlen_q = -1 (total_q: every tile past a sequence skipped) gives the same bits
    as the longest length; a CUDA graph replays it on new lengths of the same total."""
    lengths = [(300, 300), (40, 40), (600, 600)]
    q, k, v, cu_q, cu_k = packed(torch, lengths, 4, 2, 64, seed=9)
    want = torch.ops.ptxdsl.attention_varlen(q, k, v, cu_q, cu_k, 600)
    torch.testing.assert_close(torch.ops.ptxdsl.attention_varlen(q, k, v, cu_q, cu_k), want,
                               rtol=0, atol=0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.ptxdsl.attention_varlen(q, k, v, cu_q, cu_k, 640)
    again = [(640, 640), (200, 200), (100, 100)]
    cu_q.copy_(packed(torch, again, 4, 2, 64, seed=9)[3])
    cu_k.copy_(cu_q)
    graph.replay()
    torch.cuda.synchronize()
    ref = reference(torch, q, k, v, again, False, -1, -1)
    err = (out.float() - ref).abs()
    assert (err <= 2**-7 * ref.abs() + 2**-7).all(), float(err.max())
