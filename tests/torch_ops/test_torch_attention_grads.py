"""Gradients of the attention ops' sliding-window, varlen and softcap calls by ptxdsl's
backward kernels (torch.ops.ptxdsl.attention_backward and attention_varlen_backward, the
window, varlen and softcap builds of ptxdsl/kernels/attention_bwd.py). Without a GPU: the
schemas, what autograd records and calls (fake tensors, the backward node applied directly),
bad inputs, a torch.compile trace, and (PTXDSL_DEEP=1) every new build through ptxas. On the
GPU, on fresh random bf16 data: O and the gradients against autograd in f32 through the
math-backend SDPA (with the mask written out; a softcap, which SDPA does not take, through
the math written out), and the deterministic mode bit-identical."""

import math
import os

import pytest
from conftest import compile_one_graph
from conftest import cuda_empty as cuda
from test_torch_decode import lens

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")


# ----------------------------------------------------------------------------- no GPU


def test_varlen_schemas(ops, torch):
    assert str(torch.ops.ptxdsl.attention_varlen_lse.default._schema).endswith(
        "float softcap=0.) -> (Tensor, Tensor)")
    assert str(torch.ops.ptxdsl.attention_varlen_backward.default._schema) == (
        "ptxdsl::attention_varlen_backward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, "
        "Tensor do, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q=-1, "
        "int max_seqlen_k=-1, bool causal=False, float? scale=None, int window_left=-1, "
        "int window_right=-1, float softcap=0., bool deterministic=False) -> "
        "(Tensor, Tensor, Tensor)")


def calls_of(torch, fn):
    """The ptxdsl ops fn() reaches below autograd, with their arguments, and its result."""
    from torch.utils._python_dispatch import TorchDispatchMode

    calls = []

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if str(func).startswith("ptxdsl"):
                calls.append((str(func), args))
            return func(*args, **(kwargs or {}))

    with Mode():
        out = fn()
    return calls, out


def test_varlen_autograd_runs_the_backward_kernels(ops, torch, fake):
    """A varlen call that needs gradients runs attention_varlen_lse (O and the (H, total_q)
    LSE kept); its backward node calls attention_varlen_backward with the call's lengths,
    mask and softcap."""
    q = cuda(torch, 300, 4, 64).requires_grad_()
    k, v = (cuda(torch, 500, 2, 64).requires_grad_() for _ in "kv")
    cu = lens(torch, 4)

    def both():
        o = torch.ops.ptxdsl.attention_varlen(q, k, v, cu, cu, 120, 200, True, None, 64, -1,
                                              5.0)
        return o, o.grad_fn.apply(torch.ones_like(o))

    calls, (o, grads) = calls_of(torch, both)
    assert [n for n, _ in calls] == ["ptxdsl.attention_varlen_lse.default",
                                     "ptxdsl.attention_varlen_backward.default"]
    args = calls[1][1]
    assert (args[4].shape, args[4].dtype) == ((4, 300), torch.float32)  # the LSE
    assert args[8:15] == (120, 200, True, None, 64, -1, 5.0)
    assert [tuple(g.shape) for g in grads[1:4]] == [(300, 4, 64), (500, 2, 64), (500, 2, 64)]


def test_a_softcap_reaches_the_backward_kernels(ops, torch, fake):
    q = cuda(torch, 1, 4, 100, 128).requires_grad_()
    k, v = (cuda(torch, 1, 4, 100, 128).requires_grad_() for _ in "kv")

    def both():
        o = torch.ops.ptxdsl.attention(q, k, v, softcap=20.0)
        return o.grad_fn.apply(torch.ones_like(o))

    calls, _ = calls_of(torch, both)
    assert [n for n, _ in calls] == ["ptxdsl.attention_lse.default",
                                     "ptxdsl.attention_backward.default"]
    assert calls[1][1][-1] == 20.0


def bad_inputs(torch):
    q, kv = cuda(torch, 100, 4, 64), cuda(torch, 120, 2, 64)
    lse, cu = cuda(torch, 4, 100, dtype=torch.float32), lens(torch, 3)
    return [
        (torch.ops.ptxdsl.attention, (cuda(torch, 1, 2, 64, 64),) * 3, {"softcap": -1.0},
         "softcap must be 0 .none. or positive and finite, got -1.0"),
        (torch.ops.ptxdsl.attention_varlen, (q, kv, kv, cu, cu), {"max_seqlen_k": 121},
         r"max_seqlen_k must be the longest sequence's keys \(1 .. total_k = 120\)"),
        (torch.ops.ptxdsl.attention_varlen_backward,
         (q, kv, kv, q, cuda(torch, 100, 4, dtype=torch.float32), q, cu, cu), {},
         r"lse must be \(H, total_q\) = \(4, 100\), got \(100, 4\)"),
        (torch.ops.ptxdsl.attention_varlen_backward, (q, kv, kv, q, lse, q, cu, cu),
         {"softcap": math.inf}, "softcap must be"),
        (torch.ops.ptxdsl.attention_backward,
         (cuda(torch, 1, 2, 64, 64), cuda(torch, 1, 2, 32, 64), cuda(torch, 1, 2, 32, 64),
          cuda(torch, 1, 2, 64, 64), cuda(torch, 1, 2, 64, dtype=torch.float32),
          cuda(torch, 1, 2, 64, 64)), {"window_left": 8},
         "causal or a window, as many keys as queries"),
    ]


@pytest.mark.parametrize("case", range(5))
def test_bad_inputs_are_named(ops, torch, fake, case):
    op, args, kwargs, message = bad_inputs(torch)[case]
    assert len(bad_inputs(torch)) == 5
    with pytest.raises(ValueError, match=message):
        op(*args, **kwargs)


def test_compile_varlen_with_a_backward_traces_without_a_graph_break(ops, torch, fake):
    def f(q, k, v, cu_q, cu_k):
        return torch.ops.ptxdsl.attention_varlen(q * 2, k, v, cu_q, cu_k, 128, 128, True,
                                                 softcap=10.0).float().sum()

    out, targets = compile_one_graph(
        torch, f, cuda(torch, 300, 4, 64).requires_grad_(),
        cuda(torch, 300, 1, 64).requires_grad_(), cuda(torch, 300, 1, 64).requires_grad_(),
        lens(torch, 4), lens(torch, 4))
    assert out.requires_grad and "ptxdsl.attention_varlen" in targets


def test_compile_window_with_a_backward_traces_without_a_graph_break(ops, torch, fake):
    def f(q, k, v):
        return torch.ops.ptxdsl.attention(q * 2, k, v, True, None, 128, -1,
                                          30.0).float().sum()

    out, targets = compile_one_graph(torch, f, *(cuda(torch, 1, 4, 256, 64).requires_grad_()
                                                 for _ in "qkv"))
    assert out.requires_grad and "ptxdsl.attention" in targets


@pytest.mark.skipif(not os.environ.get("PTXDSL_DEEP"), reason="ptxas on 69 builds: a minute")
def test_the_new_builds_assemble_without_spills(ops, tmp_path):
    """Every backward build the window, varlen and softcap calls may run, and the forward's
    softcap builds of every config, through ptxas: no spill."""
    from conftest import assemble, assert_no_spills

    from ptxdsl.torch.kernels import (
        attention_bwd_kernel,
        attention_bwd_pre_kernel,
        attention_configs,
        attention_kernel,
    )

    builds = []
    for d in (64, 128):
        for window, varlen in ((True, False), (False, True), (True, True), (False, False)):
            for gqa in (0, 1):
                for det in (0, 1):
                    for softcap in (False, True) if window or varlen else (True,):
                        builds.append(attention_bwd_kernel(d, False, gqa, det, window, varlen,
                                                           softcap))
            if window or varlen:
                builds.append(attention_bwd_pre_kernel(d, window, varlen))
        for c in attention_configs(d):
            builds.append(attention_kernel(d, True, c["pingpong"], c["hold"], c["nwg"],
                                           softcap=True))
    for kd in builds:
        assert_no_spills(assemble(kd.ptx("sm_90a"), tmp_path))


# ----------------------------------------------------------------------------- GPU


def rand(torch, *shape, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=g).to(torch.bfloat16)


def band(torch, s, skv, causal, left, right, device):
    """The (s, skv) keys each row sees: row r's diagonal key r + skv - s, window (left,
    right) around it, -1 unbounded, causal making right 0."""
    rows = torch.arange(s, device=device)[:, None] + (skv - s)
    keys = torch.arange(skv, device=device)[None, :]
    right = 0 if causal else right
    mask = torch.ones(s, skv, dtype=torch.bool, device=device)
    if left >= 0:
        mask &= keys >= rows - left
    if right >= 0:
        mask &= keys <= rows + right
    return mask


def exact(torch, q, k, v, mask, softcap=0.0):
    """Attention of f32 (B, H, S, D) q and (B, KVH, S_kv, D) k, v: the math-backend SDPA
    with the mask, or with a softcap (SDPA takes none) the math written out."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if not softcap:
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    group = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(group, 1) for x in (k, v))
    s = softcap * torch.tanh(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) / softcap)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf)
    return s.softmax(-1) @ v


def assert_close(torch, got, want, what):
    """O within 2^-7 relative plus 2^-7 (the forward tests' bound); a gradient within 2^-5
    of its reference's largest magnitude (the backward tests' bound)."""
    if what == "o":
        err = (got.float() - want).abs()
        assert (err <= 2**-7 * want.abs() + 2**-7).all(), float(err.max())
        return
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    err = float((got.float() - want).abs().max() / want.abs().max())
    assert err < 2 ** -5, f"{what}: {err:.4f} of the largest magnitude"


DENSE = [  # b, h, kvh, s, skv, d, causal, left, right, softcap
    (2, 8, 2, 1000, 1000, 128, True, 256, -1, 0.0),  # causal local attention (Mistral-style)
    (2, 4, 4, 777, 777, 64, False, 100, 100, 0.0),   # a symmetric band, odd length
    (1, 8, 1, 300, 2000, 128, False, 5, 3, 0.0),     # a narrow band: most keys seen by none
    (2, 4, 2, 500, 600, 64, False, 0, -1, 0.0),      # a row sees its key and every later one
    (2, 8, 4, 1000, 1000, 128, True, -1, -1, 5.0),   # softcap, causal (Gemma-2-style)
    (1, 4, 4, 700, 900, 64, False, -1, -1, 2.0),     # a cap that bends most scores
    (2, 4, 2, 800, 800, 64, True, 128, -1, 3.0),     # softcap in a causal window
]


@pytest.mark.gpu
@pytest.mark.parametrize("b, h, kvh, s, skv, d, causal, left, right, softcap", DENSE)
def test_dense_against_autograd(ops, torch, cuda, gpu_cache, b, h, kvh, s, skv, d, causal,
                                left, right, softcap):
    seed = s + d + left
    q = rand(torch, b, h, s, d, seed=seed).requires_grad_()
    k, v = (rand(torch, b, kvh, skv, d, seed=seed + i).requires_grad_() for i in (1, 2))
    w = rand(torch, b, h, s, d, seed=seed + 3).float()
    o = torch.ops.ptxdsl.attention(q, k, v, causal, None, left, right, softcap)
    (o.float() * w).sum().backward()
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    masked = causal or left >= 0 or right >= 0
    mask = band(torch, s, skv, causal, left, right, q.device) if masked else None
    ref = exact(torch, *leaves, mask, softcap)
    (ref * w).sum().backward()
    assert_close(torch, o.detach(), ref.detach(), "o")
    for name, got, want in zip("qkv", (q.grad, k.grad, v.grad), leaves, strict=True):
        assert_close(torch, got, want.grad, f"d{name}")


def packed(torch, lengths, h, kvh, d, seed):
    """Random bf16 packed q (total_q, h, d), k and v (total_k, kvh, d) and their int32
    cu_seqlens for `lengths`, a list of (query rows, keys)."""
    nq, nk = (torch.tensor([n[i] for n in lengths]) for i in (0, 1))
    cu_q, cu_k = (torch.cat([torch.zeros(1, dtype=torch.int64), n.cumsum(0)]).to(
        device="cuda", dtype=torch.int32) for n in (nq, nk))
    q = rand(torch, int(nq.sum()), h, d, seed=seed)
    k, v = (rand(torch, int(nk.sum()), kvh, d, seed=seed + i) for i in (1, 2))
    return q, k, v, cu_q, cu_k


VARLEN = [  # lengths (query rows, keys), h, kvh, d, causal, left, right, softcap
    ([(1000, 1000), (1, 1), (0, 0), (333, 333), (70, 0), (2049, 2049)], 8, 2, 128, False, -1,
     -1, 0.0),
    ([(1000, 1000), (1, 1), (333, 333), (1025, 1025)], 8, 2, 64, True, -1, -1, 0.0),
    ([(17, 900), (200, 200), (129, 4000)], 4, 4, 128, True, -1, -1, 0.0),  # KV caches
    ([(2048, 2048), (77, 77), (1500, 1500)], 16, 4, 64, True, 256, -1, 0.0),  # local
    ([(700, 700), (5, 5), (300, 450)], 4, 1, 128, False, 31, 8, 0.0),  # a band, MQA
    ([(600, 600), (1, 1), (257, 300)], 4, 2, 64, True, -1, -1, 4.0),  # softcap
]


@pytest.mark.gpu
@pytest.mark.parametrize("lengths, h, kvh, d, causal, left, right, softcap", VARLEN)
def test_varlen_against_autograd(ops, torch, cuda, gpu_cache, lengths, h, kvh, d, causal,
                                 left, right, softcap):
    """O and the gradients sequence by sequence (a sequence without keys: O and its
    gradients 0); sequences of 0 and 1 rows."""
    seed = len(lengths) + d + left
    q, k, v, cu_q, cu_k = packed(torch, lengths, h, kvh, d, seed)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    w = rand(torch, *q.shape, seed=seed + 3).float()
    o = torch.ops.ptxdsl.attention_varlen(q, k, v, cu_q, cu_k, max(n for n, _ in lengths),
                                          max(n for _, n in lengths), causal, None, left,
                                          right, softcap)
    (o.float() * w).sum().backward()
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = torch.zeros(q.shape, device=q.device)
    r0 = k0 = 0
    for nq, nk in lengths:
        if nq and nk:
            qs, ks, vs = (x[a:a + n].transpose(0, 1)[None] for x, a, n in
                          zip(leaves, (r0, k0, k0), (nq, nk, nk), strict=True))
            mask = band(torch, nq, nk, causal, left, right, q.device)
            ref[r0:r0 + nq] = exact(torch, qs, ks, vs, mask, softcap)[0].transpose(0, 1)
        r0, k0 = r0 + nq, k0 + nk
    (ref * w).sum().backward()
    assert_close(torch, o.detach(), ref.detach(), "o")
    for name, got, want in zip("qkv", (q.grad, k.grad, v.grad), leaves, strict=True):
        assert_close(torch, got, want.grad, f"d{name}")


@pytest.mark.gpu
@pytest.mark.parametrize("varlen", [False, True])
def test_deterministic_window_gives_the_same_bits(ops, torch, cuda, gpu_cache, varlen):
    """Under torch.use_deterministic_algorithms a windowed (or varlen) backward adds dQ in
    key-block order: two backward passes give the same bits."""
    if varlen:
        q, k, v, cu_q, cu_k = packed(torch, [(1500, 1500), (333, 700)], 8, 4, 64, seed=80)

        def op(q, k, v):
            return torch.ops.ptxdsl.attention_varlen(q, k, v, cu_q, cu_k, 1500, 1500, True,
                                                     None, 300)
    else:
        q = rand(torch, 2, 8, 1500, 64, seed=80)
        k, v = (rand(torch, 2, 4, 1500, 64, seed=80 + i) for i in (1, 2))

        def op(q, k, v):
            return torch.ops.ptxdsl.attention(q, k, v, True, None, 300)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    do = rand(torch, *q.shape, seed=83)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        o = op(q, k, v)
        first = torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
        second = torch.autograd.grad(o, (q, k, v), do)
    finally:
        torch.use_deterministic_algorithms(was)
    for a, b in zip(first, second, strict=True):
        assert torch.isfinite(a).all() and torch.equal(a, b)


@pytest.mark.parametrize("varlen", [False, True])
def test_launch_scalars_follow_the_kernels_parameters(ops, torch, varlen):
    """The backward plans' scalar arguments (launch_scalars, varlen_launch_scalars: what
    they launch with, by position) land on the kernels' parameters of those names."""
    from ptxdsl.kernels.attention_bwd_masks import head_rows, padded
    from ptxdsl.torch import attention_bwd as op
    from ptxdsl.torch.kernels import attention_bwd_kernel, attention_bwd_pre_kernel

    d, h, kvh, scale, cap = 64, 4, 2, 0.125, 30.0
    log2e = math.log2(math.e)
    args = {"scale": scale, "softcap": cap, "causal": True, "window_left": 50,
            "window_right": -1}
    if varlen:
        args |= {"q": torch.empty(300, h, d), "k": torch.empty(500, kvh, d),
                 "cu_seqlens_q": torch.empty(4), "max_seqlen_q": 120, "max_seqlen_k": -1}
        pre_args, main_args = op.varlen_launch_scalars(args)
        want_pre = {"seq_pad": padded(120), "rows": 3 * h, "heads": h, "total_q": 300,
                    "head_rows": head_rows(300, 3)}
        want_main = {"kv_seq": 500, "seq_pad": head_rows(300, 3), "window_right": 0,
                     "window_left": 50}
    else:
        args |= {"q": torch.empty(2, h, 100, d), "k": torch.empty(2, kvh, 260, d)}
        pre_args, main_args = op.launch_scalars(args)
        want_pre = {"seq": 100, "seq_pad": padded(100), "rows": 2 * h}
        want_main = {"seq": 100, "kv_seq": 260, "seq_pad": padded(100), "window_left": 50,
                     "window_right": 0}
    want_main |= {"heads": h, "kv_heads": kvh, "scale_log2": cap * log2e, "scale": scale,
                  "cap_scale": scale / cap}
    for kd, got, want in ((attention_bwd_pre_kernel(d, True, varlen), pre_args, want_pre),
                          (attention_bwd_kernel(d, False, 1, 0, True, varlen, True), main_args,
                           want_main)):
        names = [p.name for p in kd.ir.params]
        assert dict(zip(names[-len(got):], got, strict=True)) == pytest.approx(want)
