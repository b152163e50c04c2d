"""`torch.ops.ptxdsl.attention_fp8(q, k, v, q_descale, k_descale, v_descale, causal=False,
scale=None)`: softmax(Q K^T scale) V on e4m3 inputs, the library's fp8 forward kernel
(ptxdsl/kernels/attention_fp8.py).

q is (B, H, S, D), k and v (B, KVH, S_kv, D), torch.float8_e4m3fn, head dim 64 or 128, KVH
dividing H; q_descale, k_descale and v_descale one-element f32 tensors (the true values are
descale * the fp8 ones; read on the GPU, so a CUDA graph replays with new ones). The output
is (B, H, S, D) bf16: what SDPA computes on the dequantised tensors, the causal mask aligned
to the end as the bf16 op's (S_kv >= S). The kernel reads V transposed (fp8 wgmma reads
both operands K-major, and P V reduces over the keys), its keys padded to a multiple of 16
and permuted within each 16 to the order of P's fragments in registers
(ptxdsl.kernels.attention_fp8.vt_layout): each call first writes that V^T into a scratch
tensor, one read and one write of V (a small part of the attention's time at long
sequences: the bench's note gives it). Forward only, untuned (one build per head dim and
mask)."""

from __future__ import annotations

import math
from functools import cache

import torch

from ..kernels.attention_fp8 import KEY_PITCH, VT_AXES, VT_SPLIT, key_pitch
from ..runtime.launch import Kernel
from ..runtime.occupancy import resident_ctas
from ..runtime.tensormap import TensorMap
from .attention import check as check_attention
from .dispatch import register
from .kernels import attention_fp8_kernel
from .opspec import Args, OpSpec, Run, ScalarParam, TensorParam

BLOCK = 128  # keys of a block; query rows of a tile


@cache
def _loaded(d: int, causal: bool, device: int) -> tuple[Kernel, int]:
    kernel = attention_fp8_kernel(d, causal).program().kernel(device=device)
    return kernel, resident_ctas(kernel, 1, device)


def check(args: Args) -> str | None:
    """The bf16 op's checks (shapes, head dim, heads, keys, causal lengths, scale)."""
    return check_attention({**args, "window_left": -1, "window_right": -1, "softcap": 0.0})


def output(args: Args) -> tuple[tuple[int, ...], torch.dtype]:
    return tuple(args["q"].shape), torch.bfloat16


def transposed(v: torch.Tensor) -> torch.Tensor:
    """V (B, KVH, S_kv, D) as the kernel reads it (vt_layout's torch twin): V^T (B, KVH, D,
    key_pitch(S_kv)), the keys padded with zeros and permuted within each 16."""
    b, kvh, skv, d = v.shape
    pitch = key_pitch(skv)
    x = v.view(torch.uint8)  # the bytes: copies of fp8 need no arithmetic
    if pitch != skv:
        padded = x.new_zeros(b, kvh, pitch, d)
        padded[:, :, :skv] = x
        x = padded
    return x.reshape(b, kvh, pitch // KEY_PITCH, *VT_SPLIT, d).permute(VT_AXES) \
        .reshape(b, kvh, d, pitch).view(v.dtype)


def _plan(args: Args, out: torch.Tensor, stream: int) -> Run:
    q, k, v = args["q"], args["k"], args["v"]
    b, h, s, d = q.shape
    kvh, skv = k.shape[1], k.shape[2]
    scale = args["scale"] if args["scale"] is not None else 1.0 / math.sqrt(d)
    kernel, resident = _loaded(d, bool(args["causal"]), q.device.index)
    grid = min(-(-s // BLOCK) * b * h, resident)
    swizzle = f"{d}B"  # Q's and K's rows: d bytes, one swizzle row
    qm = TensorMap(q, box=(1, 1, BLOCK, d), swizzle=swizzle)
    km = TensorMap(k, box=(1, 1, BLOCK, d), swizzle=swizzle)
    vm = TensorMap(transposed(v), box=(1, 1, d, BLOCK), swizzle="128B")
    om = TensorMap(out, box=(1, 1, 64, 64), swizzle="128B")
    log2_scale = scale * math.log2(math.e)

    def run(tensors: tuple, out: torch.Tensor, stream: int) -> None:
        tq, tk, tv, qd, kd, vd = tensors
        vt = transposed(tv)  # on the current stream, which the kernel runs on after it
        lse = tq.new_empty(b * h * s, dtype=torch.float32)  # nothing reads it (no backward)
        kernel[grid, None, stream](qm.at(tq.data_ptr()), km.at(tk.data_ptr()),
                                   vm.at(vt.data_ptr()), om.at(out.data_ptr()), lse, qd, kd,
                                   vd, s, skv, h, kvh, b, log2_scale)

    return run


SPEC = OpSpec(
    name="attention_fp8",
    params=(
        TensorParam(name="q", dtypes=(torch.float8_e4m3fn,), rank=4, layout="tma"),
        TensorParam(name="k", dtypes=(torch.float8_e4m3fn,), rank=4, layout="tma"),
        TensorParam(name="v", dtypes=(torch.float8_e4m3fn,), rank=4, layout="tma"),
        TensorParam(name="q_descale", dtypes=(torch.float32,), numel=1),
        TensorParam(name="k_descale", dtypes=(torch.float32,), numel=1),
        TensorParam(name="v_descale", dtypes=(torch.float32,), numel=1),
        ScalarParam(name="causal", type="bool", default=False),
        ScalarParam(name="scale", type="float?", default=None),
    ),
    check=check,
    output=output,
    plan=_plan,
)

attention_fp8 = register(SPEC)
