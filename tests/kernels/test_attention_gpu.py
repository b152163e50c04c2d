"""The attention sample on the GPU against torch's math-backend SDPA in f32, on fresh random
bf16 data: head dims 64 and 128, causal and not, GQA / MQA, sequence lengths that are not
tile multiples (1, 17, 1000, 4097), and the log-sum-exp against its f32 definition."""

import pytest

from bench.common import twin as sample_twin

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda")]


def run(torch, d, s, causal, b=2, h=4, kvh=4, seed=0, pingpong=False, skv=None, hold=True,
        nwg=2):
    """(o, lse, q, k, v) of ptxdsl's kernel on fresh random inputs (keys of length `skv`,
    default `s`)."""
    from bench.attention import launcher

    g = torch.Generator(device="cuda").manual_seed(seed + 1000 * d + s)
    q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g)
    skv = s if skv is None else skv
    k = torch.randn(b, kvh, skv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(b, kvh, skv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    o = torch.full_like(q, float("nan"))
    lse = torch.full((b, h, s), float("nan"), device="cuda", dtype=torch.float32)
    kd = sample_twin("attention").make_attention(d, causal, pingpong, hold=hold, nwg=nwg)
    launcher(kd, q, k, v, o, lse)()
    torch.cuda.synchronize()
    return o, lse, q, k, v


def test_attention_is_compiled_whole_with_its_register_budgets(torch):
    """The module is loaded through the driver JIT (nvJitLink would ignore setmaxnreg): the
    consumers get their 240 registers, so nothing spills to local memory (the relocatable
    build kept 144 bytes of stack) and, where the JIT reports (not when its disk cache
    answered), no wgmma is serialized."""
    import ptxdsl
    from ptxdsl.runtime.driver import check, driver

    kd = sample_twin("attention").make_attention(128, False)
    m = ptxdsl.runtime.load(kd.program().ptx_module)
    drv = driver()
    attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES
    fn = m.kernel().function.handle
    assert check(drv.cuFuncGetAttribute(attr, fn), "cuFuncGetAttribute") == 0
    assert "serialized" not in m.info_log and "C7504" not in m.info_log, m.info_log


@pytest.mark.parametrize("s, skv, causal", [(1500, 1500, False), (1000, 1000, True),
                                           (17, 4097, True), (4097, 4097, False)])
def test_attention_three_warpgroups(torch, s, skv, causal):
    """Head dim 64 on three consumer warpgroups (192-row tiles): ragged tiles, the causal
    diagonal crossing 128-key blocks at every offset, a KV cache longer than the queries."""
    o, lse, q, k, v = run(torch, 64, s, causal, b=2, h=4, kvh=2, skv=skv, nwg=3)
    assert_close(torch, o, lse, *reference(torch, q, k, v, causal))


def reference(torch, q, k, v, causal):
    """(O, LSE) in f32 with torch's math backend (LSE from the scaled scores). Causal with
    keys longer than queries: the mask aligned to the end (row r sees keys <= r + skv - s)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = q.float(), k.float(), v.float()
    s, skv = q.shape[2], k.shape[2]
    hidden = None  # True where a key is masked
    if causal:
        hidden = torch.ones(s, skv, dtype=torch.bool, device=q.device).triu(skv - s + 1)
    with sdpa_kernel(SDPBackend.MATH):
        o = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None if hidden is None else ~hidden, enable_gqa=True)
    group = q.shape[1] // k.shape[1]
    scores = q @ k.repeat_interleave(group, 1).transpose(-1, -2) / q.shape[-1] ** 0.5
    if hidden is not None:
        scores = scores.masked_fill(hidden, float("-inf"))
    return o, torch.logsumexp(scores, -1)


def assert_close(torch, o, lse, ref_o, ref_lse):
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    err = (o.float() - ref_o).abs()
    # bf16 output (2^-8 relative) and bf16 P in the second product
    assert (err <= 2 ** -7 * ref_o.abs() + 2 ** -7).all(), float(err.max())
    assert (lse - ref_lse).abs().max() < 1e-3


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("s", [1, 17, 128, 1000, 4097])
def test_attention_matches_torch(torch, d, s, causal):
    o, lse, q, k, v = run(torch, d, s, causal, b=1 if s > 1000 else 2)
    assert_close(torch, o, lse, *reference(torch, q, k, v, causal))


@pytest.mark.parametrize("h, kvh", [(8, 2), (8, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_gqa_and_mqa(torch, h, kvh, causal):
    o, lse, q, k, v = run(torch, 128, 777, causal, b=2, h=h, kvh=kvh)
    assert_close(torch, o, lse, *reference(torch, q, k, v, causal))


@pytest.mark.parametrize("d, pingpong, hold", [(128, True, False), (64, True, False),
                                              (64, False, False), (128, False, False),
                                              (128, True, True)])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_with_and_without_turns(torch, d, pingpong, causal, hold):
    """The warpgroups taking turns (`turn`) or not, the wait for P V held after the softmax
    or not, in the forms that are not the defaults."""
    o, lse, q, k, v = run(torch, d, 1500, causal, b=2, h=4, kvh=2, pingpong=pingpong,
                          hold=hold)
    assert_close(torch, o, lse, *reference(torch, q, k, v, causal))


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("s, skv", [(1, 4097), (1, 64), (17, 1000), (300, 2000)])
def test_attention_against_a_longer_kv_cache(torch, d, s, skv, causal):
    """Queries shorter than the keys (a KV cache; decode at s = 1)."""
    o, lse, q, k, v = run(torch, d, s, causal, b=3, h=8, kvh=2, skv=skv)
    assert_close(torch, o, lse, *reference(torch, q, k, v, causal))


def test_attention_many_tiles_per_cta(torch):
    """More (query block, batch x head) tiles than resident CTAs: the persistent walk."""
    o, lse, q, k, v = run(torch, 64, 2048, True, b=4, h=16, kvh=16)
    assert_close(torch, o, lse, *reference(torch, q, k, v, True))


@pytest.mark.parametrize("s, h, nwg", [(4097, 9, 2), (4000, 15, 3)])
def test_attention_causal_pairs_with_odd_counts(torch, s, h, nwg):
    """Causal with at least two tiles a CTA, so CTAs take a long and a short query block at a
    time; an odd block count (33; 21 of 192 rows) and an odd head count make pairs span two
    heads, the odd heads starting with their middle block."""
    o, lse, q, k, v = run(torch, 64, s, True, b=1, h=h, kvh=h, nwg=nwg)
    assert_close(torch, o, lse, *reference(torch, q, k, v, True))


def test_attention_large_values_stay_finite(torch):
    """Scores far from zero (Q scaled by 30): the online softmax's rescaling keeps exp in
    range where a naive exp(S) would overflow."""
    from bench.attention import launcher

    g = torch.Generator(device="cuda").manual_seed(5)
    q = 30 * torch.randn(1, 2, 600, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, 2, 600, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(1, 2, 600, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    o = torch.full_like(q, float("nan"))
    lse = torch.empty(1, 2, 600, device="cuda", dtype=torch.float32)
    launcher(sample_twin("attention").make_attention(128, False), q, k, v, o, lse)()
    torch.cuda.synchronize()
    ref_o, ref_lse = reference(torch, q, k, v, False)
    assert torch.isfinite(o).all()
    assert (o.float() - ref_o).abs().max() < 0.05
    assert ((lse - ref_lse).abs() / ref_lse.abs()).max() < 1e-4
