"""`attention_backward(q, k, v, o, lse, do, causal, scale, deterministic)`: dQ, dK, dV of
`torch.ops.ptxdsl.attention` by the library's backward kernels (ptxdsl/kernels/
attention_bwd.py): the preprocess (dPsum, the log2 LSE, the zeroed f32 dQ), the main kernel
(a CTA a key block, dQ reduce-added in f32), and the finish (dQ to bf16 times the scale;
with GQA, dK and dV summed over the query heads of a KV head).

q, o and do are (B, H, S, D), k and v (B, KVH, S_kv, D), bf16, head dim 64 or 128, KVH
dividing H; lse is the forward's f32 log-sum-exp (B x H x S, natural units), the causal mask
aligned to the end as the forward's. Not yet the op's backward (the op recomputes through
torch's SDPA): that switch waits for these kernels' first runs on a GPU."""

from __future__ import annotations

import math
from functools import cache

import torch

from ..kernels.attention_bwd import FINISH_THREADS, PRE_THREADS, grid, padded
from ..runtime.launch import Kernel
from ..runtime.tensormap import TensorMap
from .kernels import (
    ATTENTION_HEAD_DIMS,
    attention_bwd_finish_kernel,
    attention_bwd_kernel,
    attention_bwd_pre_kernel,
)

_U32 = 2**32


@cache
def _main(d: int, causal: bool, gqa: bool, deterministic: bool, device: int) -> Kernel:
    return attention_bwd_kernel(d, causal, gqa, deterministic).program().kernel(device=device)


@cache
def _pre(d: int, device: int) -> Kernel:
    return attention_bwd_pre_kernel(d).program().kernel(device=device)


@cache
def _finish(device: int) -> Kernel:
    return attention_bwd_finish_kernel().program().kernel(device=device)


def _map(x: torch.Tensor, rows: int, cols: int) -> TensorMap:
    """A (B, H, S, D) tensor's map: boxes of `rows` x `cols`, 128-byte swizzled."""
    return TensorMap(x, box=(1, 1, rows, cols), swizzle="128B")


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
           lse: torch.Tensor, do: torch.Tensor, causal: bool, scale: float) -> None:
    for name, t in (("q", q), ("k", k), ("v", v), ("o", o), ("do", do)):
        if t.dtype != torch.bfloat16 or t.dim() != 4 or not t.is_cuda:
            raise ValueError(f"attention_backward: {name} must be a 4-D bf16 CUDA tensor, got "
                             f"{tuple(t.shape)} {t.dtype} on {t.device}")
    b, h, s, d = q.shape
    if o.shape != q.shape or do.shape != q.shape:
        raise ValueError(f"attention_backward: o and do must have q's shape {tuple(q.shape)}, "
                         f"got {tuple(o.shape)} and {tuple(do.shape)}")
    if v.shape != k.shape or k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"attention_backward: k and v must be (B, KVH, S_kv, D) with B = {b} "
                         f"and D = {d}, got {tuple(k.shape)} and {tuple(v.shape)}")
    if d not in ATTENTION_HEAD_DIMS:
        raise ValueError(f"attention_backward: the head dim must be 64 or 128, got {d}")
    if k.shape[1] < 1 or h % k.shape[1]:
        raise ValueError(f"attention_backward: k's heads must divide q's ({h}), got "
                         f"{k.shape[1]}")
    if min(s, k.shape[2]) < 1 or causal and k.shape[2] < s:
        raise ValueError(f"attention_backward: needs at least one query and one key, and "
                         f"causal, as many keys as queries; got S = {s}, S_kv = {k.shape[2]}")
    if lse.dtype != torch.float32 or lse.numel() != b * h * s:
        raise ValueError(f"attention_backward: lse must hold B * H * S = {b * h * s} f32 "
                         f"values, got {lse.numel()} {lse.dtype}")
    if b * h * max(padded(s), k.shape[2]) * d >= _U32:  # the kernels' u32 element offsets
        raise ValueError(f"attention_backward: B * H * max(S, S_kv) * D must be below 2**32, "
                         f"got {b} * {h} * {max(s, k.shape[2])} * {d}")
    if not 0 < scale < math.inf:
        raise ValueError(f"attention_backward: scale must be positive and finite, got {scale}")


def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                       lse: torch.Tensor, do: torch.Tensor, causal: bool = False,
                       scale: float | None = None, deterministic: bool = False
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV), bf16, shaped as q, k and v. `deterministic`: every dQ tile's adds in
    key-block order (bit-identical runs); dK and dV are always deterministic."""
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    _check(q, k, v, o, lse, do, causal, scale)
    q, k, v, o, do = (t.contiguous() for t in (q, k, v, o, do))
    b, h, s, _ = q.shape
    kvh, skv = k.shape[1], k.shape[2]
    gqa = h != kvh
    sp = padded(s)
    device = q.device.index
    stream = torch.cuda.current_stream(q.device).cuda_stream
    f32 = torch.float32
    lse2, dps = q.new_empty(b * h * sp, dtype=f32), q.new_empty(b * h * sp, dtype=f32)
    dqacc = q.new_empty((b, h, s, d), dtype=f32)
    rows = b * h * sp
    _pre(d, device)[-(-rows // PRE_THREADS), None, stream](
        o, do, lse.reshape(-1).contiguous(), lse2, dps, dqacc, s, sp, b * h)

    part = (b, h, skv, d)  # per query head: f32 partials with GQA, else the bf16 result
    dk = q.new_empty(part, dtype=f32 if gqa else torch.bfloat16)
    dv = torch.empty_like(dk)
    sem = q.new_zeros(b * h * sp // 64, dtype=torch.uint32)  # dQ tiles' counts (deterministic)
    _main(d, causal, gqa, deterministic, device)[grid(b, h, skv), None, stream](
        _map(q, 64, 64), _map(k, 128, 64), _map(v, 128, 64), _map(do, 64, 64), lse2, dps,
        _map(dqacc, 64, 32), sem, dk, dv, s, skv, sp, h, kvh, scale * math.log2(math.e), scale)

    finish = _finish(device)

    def summed(src: torch.Tensor, heads: int, group: int, factor: float) -> torch.Tensor:
        out = src.new_empty((b, heads, *src.shape[2:]), dtype=torch.bfloat16)
        n = out.numel()
        finish[-(-n // (4 * FINISH_THREADS)), None, stream](src, out, n, src[0, 0].numel(),
                                                             group, factor)
        return out

    dq = summed(dqacc, h, 1, scale)
    if gqa:
        dk, dv = summed(dk, kvh, h // kvh, 1.0), summed(dv, kvh, h // kvh, 1.0)
    return dq, dk, dv
