"""`torch.ops.ptxdsl.attention_backward(q, k, v, o, lse, do, causal=False, scale=None,
deterministic=False, window_left=-1, window_right=-1, softcap=0.0)`: (dQ, dK, dV) of
`torch.ops.ptxdsl.attention` by the library's backward kernels
(ptxdsl/kernels/attention_bwd.py): the preprocess (dPsum, the log2 LSE, the zeroed f32 dQ),
the main kernel (a CTA a key block, dQ reduce-added in f32), and the finish (dQ to bf16 times
the scale; with GQA, dK and dV summed over the query heads of a KV head). It is the attention
op's backward (ptxdsl/torch/attention.py) wherever `takes` says so.

q, o and do are (B, H, S, D), k and v (B, KVH, S_kv, D), bf16, head dim 64 or 128, KVH
dividing H; lse is the forward's f32 log-sum-exp (B, H, S), natural units, as
`torch.ops.ptxdsl.attention_lse` returns it; the causal mask, the sliding window and the
softcap as the forward's (mask_of). q, k and v are read through tensor maps (any strides a
map takes), o and do as rows (contiguous). `deterministic`: every dQ tile's adds in key-block
order (bit-identical runs); dK and dV are always deterministic.

`torch.ops.ptxdsl.attention_varlen_backward(q, k, v, o, lse, do, cu_seqlens_q, cu_seqlens_k,
max_seqlen_q=-1, max_seqlen_k=-1, causal=False, scale=None, window_left=-1, window_right=-1,
softcap=0.0, deterministic=False)`: the same for `torch.ops.ptxdsl.attention_varlen`'s packed
sequences: q, o, do (total_q, H, D), k, v (total_k, KVH, D), lse (H, total_q) as
`attention_varlen_lse` returns it; max_seqlen_q and max_seqlen_k the longest sequence's
query rows and keys (-1: total_q and total_k, correct but launching many idle CTAs; one too
small leaves gradients unwritten). A row that sees no key gets zero gradients."""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import torch

from ..kernels.attention import window_bounds
from ..kernels.attention_bwd import FINISH_THREADS, PRE_THREADS, grid, padded
from ..kernels.attention_bwd_masks import head_rows
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
_LOG2E = math.log2(math.e)


def mask_of(causal: bool, left: int, right: int) -> tuple[bool, tuple[int, int] | None]:
    """(causal, window) of a call with `causal` and window_left / window_right as
    FlashAttention's window_size takes them (-1 unbounded; causal makes the right bound 0):
    the sliding window (left, right) in keys, or None where it bounds nothing the causal
    mask (or none) does not; causal spelled as the window (-1, 0) is causal."""
    right = 0 if causal else right
    if left < 0 and right <= 0:
        return right == 0, None
    return False, (left, right)


def varlen_mask(causal: bool, left: int, right: int) -> tuple[int, int] | None:
    """The window of a varlen call (its builds have no causal form: causal is the window
    (window_left, 0)); None without a mask."""
    causal, window = mask_of(causal, left, right)
    return (-1, 0) if causal else window


def takes(b: int, h: int, s: int, skv: int, d: int) -> bool:
    """Whether the kernels take attention of these sizes (head dim and heads as the forward
    allows): at least one query and one key, and element offsets within u32."""
    return min(s, skv) >= 1 and b * h * max(padded(s), skv) * d < _U32


def takes_varlen(batch: int, h: int, total_q: int, total_k: int, d: int) -> bool:
    """Whether the varlen kernels take these sizes: element offsets within u32."""
    return max(total_q, total_k) * h * d < _U32 and h * head_rows(total_q, batch) < _U32


def scalars(scale: float, softcap: float, window: tuple[int, int] | None, skv: int
            ) -> tuple[float | int, ...]:
    """The main kernel's last arguments: scale_log2 and scale, a window's window_left and
    window_right (skv keys unbounded), and a softcap's cap_scale (the capped scores are in
    units of the cap: scale_log2 is softcap log2 e)."""
    return ((softcap or scale) * _LOG2E, scale,
            *(window_bounds(window, skv) if window is not None else ()),
            *((scale / softcap,) if softcap else ()))


@cache
def _main(d: int, causal: bool, gqa: bool, deterministic: bool, device: int,
          window: bool = False, varlen: bool = False, softcap: bool = False) -> Kernel:
    return attention_bwd_kernel(d, causal, gqa, deterministic, window, varlen,
                                softcap).program().kernel(device=device)


@cache
def _pre(d: int, device: int, window: bool = False, varlen: bool = False) -> Kernel:
    return attention_bwd_pre_kernel(d, window, varlen).program().kernel(device=device)


@cache
def _finish(device: int) -> Kernel:
    return attention_bwd_finish_kernel().program().kernel(device=device)


def _map(x: torch.Tensor, rows: int, cols: int) -> TensorMap:
    """A (B, H, S, D) tensor's map, or a packed (rows, H, D) one's: boxes of `rows` x
    `cols`, 128-byte swizzled."""
    box = (1, 1, rows, cols) if x.dim() == 4 else (rows, 1, cols)
    return TensorMap(x, box=box, swizzle="128B")


def check_window(args: Args) -> str | None:
    """The window's bounds, which every attention op checks."""
    left, right = args["window_left"], args["window_right"]
    if min(left, right) < -1:
        return (f"window_left and window_right must be -1 (unbounded) or at least 0, got "
                f"({left}, {right})")
    return None


def check_scale(args: Args) -> str | None:
    """The scale and the softcap, which every attention op checks."""
    scale, softcap = args["scale"], args["softcap"]
    if scale is not None and not (0 < scale < math.inf):
        return f"scale must be positive and finite, got {scale}"
    if not (0 <= softcap < math.inf):
        return f"softcap must be 0 (none) or positive and finite, got {softcap}"
    return None


def check_packed(args: Args) -> str | None:
    """The shapes of a varlen call's q (total_q, H, D), k and v (total_k, KVH, D) and
    cu_seqlens, which the varlen ops check."""
    q, k, v = args["q"], args["k"], args["v"]
    cu_q, cu_k = args["cu_seqlens_q"], args["cu_seqlens_k"]
    (h, d), (kvh, dk) = q.shape[1:], k.shape[1:]
    if tuple(v.shape) != tuple(k.shape):
        return f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}"
    if dk != d:
        return f"k and v must be (total_k, KVH, D) with q's D = {d}, got {tuple(k.shape)}"
    if d not in ATTENTION_HEAD_DIMS:
        return f"the head dim (q's last dimension) must be 64 or 128, got {d}"
    if kvh < 1 or h % kvh:
        return f"k's heads must divide q's ({h}), got {kvh}"
    if cu_q.shape[0] < 2 or cu_k.shape != cu_q.shape:
        return (f"cu_seqlens_q and cu_seqlens_k must both be (B + 1,) with B >= 1, got "
                f"{tuple(cu_q.shape)} and {tuple(cu_k.shape)}")
    return None


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
    causal, window = mask_of(bool(args["causal"]), args["window_left"], args["window_right"])
    if min(s, skv) < 1 or (causal or window is not None) and skv < s:
        return (f"needs at least one query and one key, and causal or a window, as many "
                f"keys as queries; got S = {s}, S_kv = {skv}")
    if tuple(lse.shape) != (b, h, s):
        return f"lse must be (B, H, S) = {(b, h, s)}, got {tuple(lse.shape)}"
    if not takes(b, h, s, skv, d):  # the kernels' u32 element offsets
        return (f"B * H * max(S, S_kv) * D must be below 2**32, got {b} * {h} * "
                f"{max(s, skv)} * {d}")
    return check_window(args) or check_scale(args)


def _grads(args: Args) -> tuple[tuple[int, ...], torch.dtype]:
    return tuple(args["q"].shape), torch.bfloat16


def _kv_grad(args: Args) -> tuple[tuple[int, ...], torch.dtype]:
    return tuple(args["k"].shape), torch.bfloat16


def _summer(d: int, device: int) -> Any:
    finish = _finish(device)

    def summed(src: torch.Tensor, dst: torch.Tensor, length: int, group: int, factor: float,
               stream: int) -> None:
        """dst = bf16(factor * the sum over `group` consecutive heads of src), heads of
        `length` rows."""
        n = dst.numel()
        finish[-(-n // (4 * FINISH_THREADS)), None, stream](src, dst, n, length * d, group,
                                                             factor)

    return summed


def _scale(args: Args) -> float:
    d = args["q"].shape[-1]
    return 1.0 / math.sqrt(d) if args["scale"] is None else float(args["scale"])


def launch_scalars(args: Args) -> tuple[tuple, tuple]:
    """The scalar arguments of a dense call's preprocess (seq .. rows) and main kernel
    (seq .. scale_log2, scale, a window's bounds, a softcap's cap_scale), in parameter
    order."""
    (b, h, s, _), (_, kvh, skv, _) = args["q"].shape, args["k"].shape
    window = mask_of(bool(args["causal"]), args["window_left"], args["window_right"])[1]
    return ((s, padded(s), b * h),
            (s, skv, padded(s), h, kvh,
             *scalars(_scale(args), float(args["softcap"]), window, skv)))


def varlen_launch_scalars(args: Args) -> tuple[tuple, tuple]:
    """The scalar arguments of a varlen call's preprocess (seq_pad .. head_rows) and main
    kernel (kv_seq .. scale_log2, scale, a window's bounds, a softcap's cap_scale), in
    parameter order: the walk's rows a sequence padded (max_seqlen_q, or total_q) and its
    keys (max_seqlen_k, or total_k), a head's LSE rows."""
    (tq, h, _), (tk, kvh, _) = args["q"].shape, args["k"].shape
    batch = args["cu_seqlens_q"].shape[0] - 1
    maxq = tq if args["max_seqlen_q"] < 0 else args["max_seqlen_q"]
    maxk = tk if args["max_seqlen_k"] < 0 else args["max_seqlen_k"]
    window = varlen_mask(bool(args["causal"]), args["window_left"], args["window_right"])
    rows = head_rows(tq, batch)
    return ((padded(maxq), batch * h, h, tq, rows),
            (maxk, rows, h, kvh, *scalars(_scale(args), float(args["softcap"]), window, tk)))


def _plan(args: Args, out: Any, stream: int) -> Run:
    q, k = args["q"], args["k"]
    deterministic = bool(args["deterministic"])
    causal, window = mask_of(bool(args["causal"]), args["window_left"], args["window_right"])
    softcap = float(args["softcap"])
    b, h, s, d = q.shape
    kvh, skv = k.shape[1], k.shape[2]
    scale = _scale(args)
    gqa = h != kvh
    group = h // kvh
    sp = padded(s)
    rows = b * h * sp
    device = q.device.index
    pre, summed = _pre(d, device, window is not None), _summer(d, device)
    main = _main(d, causal, gqa, deterministic, device, window is not None, False, softcap > 0)
    qm, km, vm, dom = _map(q, 64, 64), _map(k, 128, 64), _map(args["v"], 128, 64), \
        _map(args["do"], 64, 64)
    f32 = torch.float32
    # the f32 dQ accumulator is each call's own: its map is re-pointed like the inputs'
    accm = _map(q.new_empty((b, h, s, d), dtype=f32), 64, 32)
    # per query head: f32 partials with GQA (summed by the finish), else the bf16 result
    part = (b, h, skv, d)
    pre_grid, main_grid = -(-rows // PRE_THREADS), grid(b, h, skv)
    pre_args, main_args = launch_scalars(args)

    def run(tensors: tuple, out: tuple, stream: int) -> None:
        tq, tk, tv, to, tlse, tdo = tensors
        dq, dk, dv = out
        lse2, dps = tq.new_empty(rows, dtype=f32), tq.new_empty(rows, dtype=f32)
        acc = tq.new_empty((b, h, s, d), dtype=f32)
        pre[pre_grid, None, stream](to, tdo, tlse, lse2, dps, acc, *pre_args)
        pk, pv = (tq.new_empty(part, dtype=f32) for _ in "kv") if gqa else (dk, dv)
        # the dQ tiles' add counts: the default kernel never reads them (a memset saved)
        sem = tq.new_zeros(rows // 64, dtype=torch.uint32) if deterministic else _NOWHERE
        main[main_grid, None, stream](
            qm.at(tq.data_ptr()), km.at(tk.data_ptr()), vm.at(tv.data_ptr()),
            dom.at(tdo.data_ptr()), lse2, dps, accm.at(acc.data_ptr()), sem, pk, pv, *main_args)
        summed(acc, dq, s, 1, scale, stream)
        if gqa:
            summed(pk, dk, skv, group, 1.0, stream)
            summed(pv, dv, skv, group, 1.0, stream)

    return run


def _tensors(rank: int) -> tuple[TensorParam, ...]:
    """q, k and v (read through tensor maps), o, the LSE and dO of a backward op: (B, H, S,
    D) tensors at rank 4, packed (total, H, D) ones at rank 3."""
    bf16 = (torch.bfloat16,)
    return (*(TensorParam(name=n, dtypes=bf16, rank=rank, layout="tma") for n in "qkv"),
            TensorParam(name="o", dtypes=bf16, rank=rank),
            TensorParam(name="lse", dtypes=(torch.float32,), rank=rank - 1),
            TensorParam(name="do", dtypes=bf16, rank=rank))


MASK = (
    ScalarParam(name="window_left", type="int", default=-1),
    ScalarParam(name="window_right", type="int", default=-1),
    ScalarParam(name="softcap", type="float", default=0.0),
)

SPEC = OpSpec(
    name="attention_backward",
    params=(
        *_tensors(4),
        ScalarParam(name="causal", type="bool", default=False),
        ScalarParam(name="scale", type="float?", default=None),
        ScalarParam(name="deterministic", type="bool", default=False),
        *MASK,
    ),
    check=check,
    output=_grads,
    extra_outputs=(_kv_grad, _kv_grad),
    plan=_plan,
)

attention_backward = register(SPEC)


def check_varlen(args: Args) -> str | None:
    q, k, o, lse, do = (args[n] for n in ("q", "k", "o", "lse", "do"))
    (tq, h, d), tk = q.shape, k.shape[0]
    if tuple(o.shape) != tuple(q.shape) or tuple(do.shape) != tuple(q.shape):
        return (f"o and do must have q's shape {tuple(q.shape)}, got {tuple(o.shape)} and "
                f"{tuple(do.shape)}")
    wrong = check_packed(args)
    if wrong:
        return wrong
    if min(tq, tk) < 1:
        return f"needs at least one query and one key, got total_q = {tq}, total_k = {tk}"
    if tuple(lse.shape) != (h, tq):
        return f"lse must be (H, total_q) = {(h, tq)}, got {tuple(lse.shape)}"
    for name, total in (("max_seqlen_q", tq), ("max_seqlen_k", tk)):
        if not (args[name] == -1 or 1 <= args[name] <= total):
            return (f"{name} must be the longest sequence's length (1 .. {total}) or -1, got "
                    f"{args[name]}")
    if not takes_varlen(args["cu_seqlens_q"].shape[0] - 1, h, tq, tk, d):
        return (f"max(total_q, total_k) * H * D must be below 2**32, got {max(tq, tk)} * {h} "
                f"* {d}")
    return check_window(args) or check_scale(args)


def _plan_varlen(args: Args, out: Any, stream: int) -> Run:
    q, k = args["q"], args["k"]
    (tq, h, d), (tk, kvh, _) = q.shape, k.shape
    pre_args, main_args = varlen_launch_scalars(args)
    sp, rows, maxk = pre_args[0], pre_args[4], main_args[0]
    batch = args["cu_seqlens_q"].shape[0] - 1
    window = varlen_mask(bool(args["causal"]), args["window_left"], args["window_right"])
    softcap, deterministic = float(args["softcap"]), bool(args["deterministic"])
    scale = _scale(args)
    gqa = h != kvh
    group = h // kvh
    device = q.device.index
    pre, summed = _pre(d, device, window is not None, True), _summer(d, device)
    main = _main(d, False, gqa, deterministic, device, window is not None, True, softcap > 0)
    qm, km, vm, dom = _map(q, 64, 64), _map(k, 128, 64), _map(args["v"], 128, 64), \
        _map(args["do"], 64, 64)
    f32 = torch.float32
    accm = _map(q.new_empty((tq, h, d), dtype=f32), 64, 32)  # re-pointed at each call's
    pre_grid, main_grid = -(-batch * h * sp // PRE_THREADS), grid(batch, h, maxk)

    def run(tensors: tuple, out: tuple, stream: int) -> None:
        tq_, tk_, tv, to, tlse, tdo, cu_q, cu_k = tensors
        dq, dk, dv = out
        lse2, dps = (tq_.new_empty(h * rows, dtype=f32) for _ in "ld")
        acc = tq_.new_empty((tq, h, d), dtype=f32)
        pre[pre_grid, None, stream](to, tdo, tlse, lse2, dps, acc, cu_q, *pre_args)
        pk, pv = (tq_.new_empty((tk, h, d), dtype=f32) for _ in "kv") if gqa else (dk, dv)
        sem = tq_.new_zeros(h * rows // 64, dtype=torch.uint32) if deterministic else _NOWHERE
        main[main_grid, None, stream](
            qm.at(tq_.data_ptr()), km.at(tk_.data_ptr()), vm.at(tv.data_ptr()),
            dom.at(tdo.data_ptr()), lse2, dps, accm.at(acc.data_ptr()), sem, pk, pv, cu_q, cu_k,
            *main_args)
        summed(acc, dq, 1, 1, scale, stream)  # a "head" of one row: any length sums alike
        if gqa:
            summed(pk, dk, 1, group, 1.0, stream)
            summed(pv, dv, 1, group, 1.0, stream)

    return run


VARLEN_SPEC = OpSpec(
    name="attention_varlen_backward",
    params=(
        *_tensors(3),
        TensorParam(name="cu_seqlens_q", dtypes=(torch.int32,), rank=1, aligned=False),
        TensorParam(name="cu_seqlens_k", dtypes=(torch.int32,), rank=1, aligned=False),
        ScalarParam(name="max_seqlen_q", type="int", default=-1),
        ScalarParam(name="max_seqlen_k", type="int", default=-1),
        ScalarParam(name="causal", type="bool", default=False),
        ScalarParam(name="scale", type="float?", default=None),
        *MASK,
        ScalarParam(name="deterministic", type="bool", default=False),
    ),
    check=check_varlen,
    output=_grads,
    extra_outputs=(_kv_grad, _kv_grad),
    plan=_plan_varlen,
)

attention_varlen_backward = register(VARLEN_SPEC)
