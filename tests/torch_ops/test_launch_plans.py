"""The torch ops' launch plans (ptxdsl/torch/dispatch.py): a call with a known signature only
re-points addresses, and a call that changes anything else a plan depends on (address
alignment, strides, dtype, device) gets its own plan after the checks, never a stale one.

Without a GPU: the signature's parts. With a GPU: results against torch after each change."""

from __future__ import annotations

import math

import pytest
from test_torch_ops import check_gemm, rand, ref_rms_norm


def test_a_signature_holds_what_a_plan_depends_on(ops, torch):
    from ptxdsl.torch.dispatch import signer

    signature = signer(1)
    a = torch.empty(64, 64, dtype=torch.bfloat16)
    base = signature((a, 1e-5))
    assert signature((a.clone(), 1e-5)) == base  # another tensor alike: the same plan
    assert signature((a.float(), 1e-5)) != base  # dtype
    assert signature((a[:, :32], 1e-5)) != base  # shape
    assert signature((a.t(), 1e-5)) != base  # strides
    assert signature((a, 1e-6)) != base  # a scalar
    assert signature((a,)) != base  # a scalar left to its default
    off = a.view(-1)[1:65].view(1, 64)
    assert signature((off, 1e-5))[4] == 2  # the address's alignment (2 bytes past)
    two = signer(2)((a, off))
    assert len(two) == 11 and two[9] == 2 and two[-1] == ()


def test_an_optional_tensor_signs_as_none_or_as_a_tensor(ops, torch):
    """decode_attention's block_table: left out or None sign alike, a tensor as itself."""
    from ptxdsl.torch.dispatch import signer

    signature = signer(2, optional=1)
    a = torch.empty(8, 8, dtype=torch.int32)
    left_out, none, given = signature((a,)), signature((a, None)), signature((a, a))
    assert left_out[5] is None and none[5] is None and given[5] is not None
    assert given != none and signature((a, a[:, :4]))[5] != given[5]


@pytest.mark.gpu
def test_gemm_plans_follow_address_stride_and_dtype(ops, torch, gpu_cache):
    op = ops.gemm
    a, b = rand(torch, 192, 128, seed=1), rand(torch, 256, 128, seed=2)
    check_gemm(torch, torch.ops.ptxdsl.gemm(a, b), a, b)
    before = op.plans
    for seed in (3, 5):  # new memory, same signature: the same plan, maps re-pointed
        a2, b2 = rand(torch, 192, 128, seed=seed), rand(torch, 256, 128, seed=seed + 1)
        check_gemm(torch, torch.ops.ptxdsl.gemm(a2, b2), a2, b2)
    assert op.plans == before
    wide = rand(torch, 192, 192, seed=7)[:, :128]  # a wider row pitch: a plan of its own
    check_gemm(torch, torch.ops.ptxdsl.gemm(wide, b), wide, b)
    assert op.plans == before + 1
    bad = rand(torch, 192 * 128 + 1, seed=8)[1:].view(192, 128)  # 2 bytes off
    with pytest.raises(ValueError, match="^gemm: a's address must be 16-byte aligned"):
        torch.ops.ptxdsl.gemm(bad, b)
    with pytest.raises(TypeError, match="^gemm: a must be bf16, got torch.float16$"):
        torch.ops.ptxdsl.gemm(a.half(), b)
    check_gemm(torch, torch.ops.ptxdsl.gemm(a, b), a, b)  # the first plan still right
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_norm_plans_follow_the_alignment_of_an_address(ops, torch, gpu_cache):
    w = 1 + 0.1 * rand(torch, 1024, seed=9)
    x = rand(torch, 4 * 1024 + 8, seed=10)
    for offset in (0, 8, 1, 0):  # 16-byte loads, then 16-byte again, then 2-byte loads
        xv = x[offset:offset + 4 * 1024].view(4, 1024)
        y = torch.ops.ptxdsl.rms_norm(xv, w, 1e-5)
        torch.testing.assert_close(y.float(), ref_rms_norm(torch, xv, w, 1e-5), rtol=2**-7,
                                   atol=2**-7)


@pytest.mark.gpu
def test_attention_plan_re_points_every_map(ops, torch, gpu_cache):
    from ptxdsl.torch.attention import sdpa

    def qkv(seed):
        return [rand(torch, 1, 4, 200, 64, seed=seed + i) for i in range(3)]

    for seed in (20, 30):
        q, k, v = qkv(seed)
        got = torch.ops.ptxdsl.attention(q, k, v)
        torch.testing.assert_close(got, sdpa(q, k, v, False, None), rtol=2**-6, atol=2**-6)


@pytest.mark.gpu
def test_a_plan_is_per_device(ops, torch, gpu_cache):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs (runs on the nvidia-h200-x2 machine)")
    with torch.cuda.device(0):  # an earlier test may have left another device current
        a, b = rand(torch, 128, 64, seed=40), rand(torch, 256, 64, seed=41)
        check_gemm(torch, torch.ops.ptxdsl.gemm(a, b), a, b)
    assert a.device.index == 0
    a1, b1 = a.to("cuda:1"), b.to("cuda:1")
    with torch.cuda.device(1):
        c1 = torch.ops.ptxdsl.gemm(a1, b1)
        torch.cuda.synchronize()
    assert c1.device.index == 1
    # tensors of another device: the op guards the device as ATen does; a new shape there is
    # tuned (its trials captured in a CUDA graph on a stream of device 1) under device 0
    a2, b2 = (rand(torch, r, 64, seed=seed).to("cuda:0") for r, seed in ((40, 42), (192, 43)))
    a21, b21 = a2.to("cuda:1"), b2.to("cuda:1")
    with torch.cuda.device(0):
        for _ in range(2):  # the new plan, then the known one
            c21 = torch.ops.ptxdsl.gemm(a21, b21)
            assert torch.cuda.current_device() == 0 and c21.device.index == 1
            check_gemm(torch, c21.to("cuda:0"), a2, b2)
        check_gemm(torch, torch.ops.ptxdsl.gemm(a1, b1).to("cuda:0"), a, b)  # device 1's plan
        assert torch.cuda.current_device() == 0
        check_gemm(torch, torch.ops.ptxdsl.gemm(a, b), a, b)  # device 0's plan still runs
    check_gemm(torch, c1.to("cuda:0"), a, b)
    with pytest.raises(ValueError, match="^gemm: b must be on a's device"):
        torch.ops.ptxdsl.gemm(a, b1)


@pytest.mark.gpu
def test_an_op_without_a_backward_says_so(ops, torch, gpu_cache):
    a = rand(torch, 128, 64, seed=50).requires_grad_()
    b = rand(torch, 128, 64, seed=51)
    c = torch.ops.ptxdsl.gemm(a, b)
    with pytest.raises(RuntimeError, match="ptxdsl.gemm has no backward"):
        c.float().sum().backward()
    assert math.isfinite(float(c.detach().float().sum()))
