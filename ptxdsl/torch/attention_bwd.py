"""`torch.ops.ptxdsl.attention_backward(q, k, v, o, lse, do, causal=False, scale=None,
deterministic=False)`: (dQ, dK, dV) of `torch.ops.ptxdsl.attention` by the library's backward
kernels (ptxdsl/kernels/attention_bwd.py): the preprocess (dPsum, the log2 LSE, the zeroed
f32 dQ), the main kernel (a CTA a key block, dQ reduce-added in f32), and the finish (dQ to
bf16 times the scale; with GQA, dK and dV summed over the query heads of a KV head). It is
the attention op's backward (ptxdsl/torch/attention.py) wherever `takes` says so.

q, o and do are (B, H, S, D), k and v (B, KVH, S_kv, D), bf16, head dim 64 or 128, KVH
dividing H; lse is the forward's f32 log-sum-exp (B, H, S), natural units, as
`torch.ops.ptxdsl.attention_lse` returns it; the causal mask aligned to the end as the
forward's. q, k and v are read through tensor maps (any strides a map takes), o and do as
rows (contiguous). `deterministic`: every dQ tile's adds in key-block order (bit-identical
runs); dK and dV are always deterministic."""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import torch

from ..kernels.attention_bwd import FINISH_THREADS, PRE_THREADS, grid, padded
from ..runtime.interop import DevicePointer
from ..runtime.launch import Kernel
from ..runtime.tensormap import TensorMap
from .dispatch import register
from .kernels import (
    ATTENTION_HEAD_DIMS,
    attention_bwd_finish_kernel,
    attention_bwd_kernel,
    attention_bwd_pre_kernel,
)
from .opspec import Args, OpSpec, Run, ScalarParam, TensorParam

_U32 = 2**32
_NOWHERE = DevicePointer(0)  # a pointer argument the kernel does not read


def takes(b: int, h: int, s: int, skv: int, d: int) -> bool:
    """Whether the kernels take attention of these sizes (head dim and heads as the forward
    allows): at least one query and one key, and element offsets within u32."""
    return min(s, skv) >= 1 and b * h * max(padded(s), skv) * d < _U32


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


def check(args: Args) -> str | None:
    q, k, v, o, lse, do = (args[n] for n in ("q", "k", "v", "o", "lse", "do"))
    (b, h, s, d), (bk, kvh, skv, dk) = q.shape, k.shape
    if tuple(o.shape) != tuple(q.shape) or tuple(do.shape) != tuple(q.shape):
        return (f"o and do must have q's shape {tuple(q.shape)}, got {tuple(o.shape)} and "
                f"{tuple(do.shape)}")
    if tuple(v.shape) != tuple(k.shape) or bk != b or dk != d:
        return (f"k and v must be (B, KVH, S_kv, D) with q's B = {b} and D = {d}, got "
                f"{tuple(k.shape)} and {tuple(v.shape)}")
    if d not in ATTENTION_HEAD_DIMS:
        return f"the head dim (q's last dimension) must be 64 or 128, got {d}"
    if kvh < 1 or h % kvh:
        return f"k's heads must divide q's ({h}), got {kvh}"
    if min(s, skv) < 1 or args["causal"] and skv < s:
        return (f"needs at least one query and one key, and causal, as many keys as queries; "
                f"got S = {s}, S_kv = {skv}")
    if tuple(lse.shape) != (b, h, s):
        return f"lse must be (B, H, S) = {(b, h, s)}, got {tuple(lse.shape)}"
    if not takes(b, h, s, skv, d):  # the kernels' u32 element offsets
        return (f"B * H * max(S, S_kv) * D must be below 2**32, got {b} * {h} * "
                f"{max(s, skv)} * {d}")
    scale = args["scale"]
    if scale is not None and not (0 < scale < math.inf):
        return f"scale must be positive and finite, got {scale}"
    return None


def _grads(args: Args) -> tuple[tuple[int, ...], torch.dtype]:
    return tuple(args["q"].shape), torch.bfloat16


def _kv_grad(args: Args) -> tuple[tuple[int, ...], torch.dtype]:
    return tuple(args["k"].shape), torch.bfloat16


def _plan(args: Args, out: Any, stream: int) -> Run:
    q, k, v, do = args["q"], args["k"], args["v"], args["do"]
    causal, deterministic = bool(args["causal"]), bool(args["deterministic"])
    b, h, s, d = q.shape
    kvh, skv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if args["scale"] is None else float(args["scale"])
    gqa = h != kvh
    group = h // kvh
    sp = padded(s)
    rows = b * h * sp
    device = q.device.index
    pre, finish = _pre(d, device), _finish(device)
    main = _main(d, causal, gqa, deterministic, device)
    qm, km, vm, dom = _map(q, 64, 64), _map(k, 128, 64), _map(v, 128, 64), _map(do, 64, 64)
    f32 = torch.float32
    # the f32 dQ accumulator is each call's own: its map is re-pointed like the inputs'
    accm = _map(q.new_empty((b, h, s, d), dtype=f32), 64, 32)
    # per query head: f32 partials with GQA (summed by the finish), else the bf16 result
    part = (b, h, skv, d)
    pre_grid, main_grid = -(-rows // PRE_THREADS), grid(b, h, skv)
    log2_scale = scale * math.log2(math.e)

    def summed(src: torch.Tensor, dst: torch.Tensor, length: int, group: int, factor: float,
               stream: int) -> None:
        """dst = bf16(factor * the sum over `group` consecutive heads of src), heads of
        `length` rows."""
        n = dst.numel()
        finish[-(-n // (4 * FINISH_THREADS)), None, stream](src, dst, n, length * d, group,
                                                             factor)

    def run(tensors: tuple, out: tuple, stream: int) -> None:
        tq, tk, tv, to, tlse, tdo = tensors
        dq, dk, dv = out
        lse2, dps = tq.new_empty(rows, dtype=f32), tq.new_empty(rows, dtype=f32)
        acc = tq.new_empty((b, h, s, d), dtype=f32)
        pre[pre_grid, None, stream](to, tdo, tlse, lse2, dps, acc, s, sp, b * h)
        pk, pv = (tq.new_empty(part, dtype=f32) for _ in "kv") if gqa else (dk, dv)
        # the dQ tiles' add counts: the default kernel never reads them (a memset saved)
        sem = tq.new_zeros(rows // 64, dtype=torch.uint32) if deterministic else _NOWHERE
        main[main_grid, None, stream](
            qm.at(tq.data_ptr()), km.at(tk.data_ptr()), vm.at(tv.data_ptr()),
            dom.at(tdo.data_ptr()), lse2, dps, accm.at(acc.data_ptr()), sem, pk, pv, s, skv,
            sp, h, kvh, log2_scale, scale)
        summed(acc, dq, s, 1, scale, stream)
        if gqa:
            summed(pk, dk, skv, group, 1.0, stream)
            summed(pv, dv, skv, group, 1.0, stream)

    return run


SPEC = OpSpec(
    name="attention_backward",
    params=(
        TensorParam(name="q", dtypes=(torch.bfloat16,), rank=4, layout="tma"),
        TensorParam(name="k", dtypes=(torch.bfloat16,), rank=4, layout="tma"),
        TensorParam(name="v", dtypes=(torch.bfloat16,), rank=4, layout="tma"),
        TensorParam(name="o", dtypes=(torch.bfloat16,), rank=4),
        TensorParam(name="lse", dtypes=(torch.float32,), rank=3),
        TensorParam(name="do", dtypes=(torch.bfloat16,), rank=4),
        ScalarParam(name="causal", type="bool", default=False),
        ScalarParam(name="scale", type="float?", default=None),
        ScalarParam(name="deterministic", type="bool", default=False),
    ),
    check=check,
    output=_grads,
    extra_outputs=(_kv_grad, _kv_grad),
    plan=_plan,
)

attention_backward = register(SPEC)
