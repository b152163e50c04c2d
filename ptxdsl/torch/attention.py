"""`torch.ops.ptxdsl.attention(q, k, v, causal=False, scale=None, window_left=-1,
window_right=-1, softcap=0.0)`: softmax(Q K^T scale) V, the library's FlashAttention-3-style
forward kernel (ptxdsl/kernels/attention.ptxdsl).

q is (B, H, S, D), k and v (B, KVH, S_kv, D), bf16, head dim 64 or 128, KVH dividing H
(GQA/MQA), as `torch.nn.functional.scaled_dot_product_attention(..., enable_gqa=True)` takes
them; the output is (B, H, S, D) bf16. Keys may outnumber queries (a KV cache; decode at
S = 1): the causal mask is then aligned to the end, query row r seeing keys 0 .. r + S_kv - S
(FlashAttention's convention; SDPA's `is_causal` aligns to the start, the same when S = S_kv).
Any strides a tensor map takes (unit stride in D, the others multiples of 16 bytes) are
read in place: (B, S, H, D) tensors transposed to (B, H, S, D), or the first S_kv rows of a
longer KV cache. Whether the consumer warpgroups take turns, whether the wait for P V is held
after the softmax, and at head dim 64 whether three consumer warpgroups (192-row tiles) or two
run, is tuned per shape. A sliding window (window_left, window_right as FlashAttention's
window_size, -1 unbounded, causal making the right bound 0) runs the kernel's window build:
row r sees keys r + S_kv - S - window_left .. r + S_kv - S + window_right (S_kv >= S), and a
query tile skips the key blocks outside its rows' windows. `softcap` > 0 caps the scores
before the softmax as FlashAttention's softcap: s -> softcap tanh(s scale / softcap).

`torch.ops.ptxdsl.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=-1,
max_seqlen_k=-1, causal=False, scale=None, window_left=-1, window_right=-1, softcap=0.0)`:
packed sequences of different lengths, as FlashAttention's varlen functions take them: q
(total_q, H, D), k and v (total_k, KVH, D), int32 cu_seqlens (B + 1) of the sequences' first
rows and keys (read on the GPU; nothing checks them there: they must rise from 0 to total_q
and total_k), max_seqlen_q and max_seqlen_k the longest sequence's query rows and keys (-1:
total_q and total_k, correct but walking many empty tiles; one too small leaves rows
unwritten; the forward reads only max_seqlen_q, the backward both); the output (total_q, H,
D). Causal and the window align to each sequence's end; a row that sees no key (a sequence
without keys) gets zeros. Untuned (the first config).

The backward is ptxdsl's (ptxdsl/torch/attention_bwd.py, `torch.ops.ptxdsl.attention_backward`
and `attention_varlen_backward`), for the causal mask, a window and a softcap alike: a call
that needs a gradient runs `torch.ops.ptxdsl.attention_lse` (`attention_varlen_lse`) in the
op's place, which also returns the f32 log-sum-exp (B, H, S) ((H, total_q)) the backward
kernels read, and keeps O and it (the call that needs no gradient writes the LSE to scratch,
as before). As with SDPA's flash backward, O is saved: writing into the output in place before
the backward makes autograd refuse it (a modified saved tensor). The backward is
deterministic where torch.use_deterministic_algorithms(True) asks. Sizes the dense backward
kernels do not take (no query rows, or element offsets past 2**32: `attention_bwd.takes`) are
differentiated by torch instead, the attention recomputed on the saved q, k, v; the varlen
backward refuses offsets past 2**32 elements with a ValueError."""

from __future__ import annotations

import math
from functools import cache
from typing import Any, Protocol

import torch

from ..runtime.launch import Kernel
from ..runtime.occupancy import resident_ctas
from ..runtime.tensormap import TensorMap
from . import autotune
from .attention_bwd import (
    attention_backward,
    attention_varlen_backward,
    check_packed,
    check_scale,
    check_window,
    mask_of,
    scalars,
    takes,
    varlen_mask,
)
from .dispatch import register
from .kernels import ATTENTION_HEAD_DIMS, attention_configs, attention_kernel, attention_recipe
from .opspec import Args, OpSpec, Run, ScalarParam, TensorParam


class Launch(Protocol):
    """A plan's launch, the attention op's run: (q, k, v), O, the CUstream handle, and the
    LSE's f32 tensor (None: a scratch one)."""

    def __call__(self, tensors: tuple, out: torch.Tensor, stream: int,
                 lse: torch.Tensor | None = None) -> None: ...

BLOCK = 128  # keys of a block; query rows of a tile: 64 per consumer warpgroup
_S32 = 2**31


@cache
def _tuner(d: int, causal: bool, window: bool, softcap: bool = False) -> Any:
    def recipe(config: Any) -> Any:
        return attention_recipe(d, causal, config["pingpong"], config["hold"], config["nwg"],
                                window, softcap=softcap)

    name = f"ptxdsl::attention_d{d}{'_causal' if causal else ''}{'_window' if window else ''}" \
        f"{'_softcap' if softcap else ''}"
    return autotune.tuner(name, attention_configs(d), recipe)


@cache
def _loaded(d: int, causal: bool, pingpong: int, hold: int, nwg: int, window: bool,
            device: int, varlen: bool = False, softcap: bool = False) -> tuple[Kernel, int]:
    kernel = attention_kernel(d, causal, pingpong, hold, nwg, window, varlen,
                              softcap).program().kernel(device=device)
    return kernel, resident_ctas(kernel, 1, device)


def check(args: Args) -> str | None:
    q, k, v = args["q"], args["k"], args["v"]
    (b, h, s, d), (bk, hk, skv, dk) = q.shape, k.shape
    if tuple(v.shape) != tuple(k.shape):
        return f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}"
    if bk != b or dk != d:
        return (f"k and v must be (B, KVH, S_kv, D) with q's B = {b} and D = {d}, got "
                f"{tuple(k.shape)}")
    if d not in ATTENTION_HEAD_DIMS:
        return f"the head dim (q's last dimension) must be 64 or 128, got {d}"
    if hk < 1 or h % hk:
        return f"k's heads must divide q's ({h}), got {hk}"
    if skv < 1 and s > 0:
        return "k and v must hold at least one key"
    wrong = check_window(args)
    if wrong:
        return wrong
    causal, window = mask_of(bool(args["causal"]), args["window_left"], args["window_right"])
    if causal and skv < s:
        return (f"causal attention needs at least as many keys as queries (the mask aligns "
                f"to the end), got S = {s} queries and S_kv = {skv} keys")
    if window is not None and skv < s:
        return (f"a sliding window needs at least as many keys as queries (it aligns to the "
                f"end, as the causal mask), got S = {s} queries and S_kv = {skv} keys")
    if max(b * h, s, skv) >= _S32:
        return f"B * H, S and S_kv must be below 2**31, got {b * h}, {s}, {skv}"
    return check_scale(args)


def output(args: Args) -> tuple[tuple[int, ...], torch.dtype]:
    return tuple(args["q"].shape), torch.bfloat16


def _lse(args: Args) -> tuple[tuple[int, ...], torch.dtype]:
    return tuple(args["q"].shape[:3]), torch.float32


def _map(x: torch.Tensor, box_rows: int) -> TensorMap:
    return TensorMap(x, box=(1, 1, box_rows, 64), swizzle="128B")


def packed(q: torch.Tensor, out: torch.Tensor, kv_heads: int, causal: bool,
           window: bool = False) -> tuple[torch.Tensor, torch.Tensor] | None:
    """q and out (B, H, S, D) seen as (B, KVH, H / KVH * S, D): the query heads that share a
    KV head stacked as rows of one head, so that short queries (decode) fill the query tiles
    (128 or 192 rows) instead of padding them. Only where the mask allows it (not causal, or
    S = 1, where the causal mask hides nothing; no `window`), S is below 128 and the strides
    let the heads and rows merge; else None."""
    b, h, s, d = q.shape
    if h == kv_heads or s >= BLOCK or (causal and s > 1) or window:
        return None
    if s > 1 and q.stride(1) != s * q.stride(2):  # heads and rows do not merge in q
        return None
    shape = (b, kv_heads, h // kv_heads * s, d)
    return q.view(shape), out.view(shape)  # out is contiguous


def _launcher(args: Args, out: torch.Tensor, stream: int) -> Launch:
    """The tuned launch over the layouts of args and the output O: `launch(tensors, o,
    stream, lse)`, the f32 LSE (B, H, S) given, or allocated and dropped where None."""
    q, k, v, causal = args["q"], args["k"], args["v"], bool(args["causal"])
    d = q.shape[3]
    kvh, skv = k.shape[1], k.shape[2]
    scale = args["scale"] if args["scale"] is not None else 1.0 / math.sqrt(d)
    softcap = float(args["softcap"])
    causal, window = mask_of(causal, args["window_left"], args["window_right"])
    # scale_log2, the window build's window_left and window_right (kv_seq keys unbounded),
    # and the softcap build's cap_scale
    log2_scale, _, *more = scalars(scale, softcap, window, skv)
    stacked = packed(q, out, kvh, causal, window is not None)
    if stacked is not None:  # views of the same memory: the maps take their shapes
        q, out = stacked
        causal = False  # S = 1 or not causal
    b, h, s, _ = q.shape
    device = q.device.index
    km, vm = _map(k, BLOCK), _map(v, BLOCK)
    lse_size = b * h * s

    def runner(config: Any, o: torch.Tensor) -> Launch:
        nwg = config["nwg"]
        kernel, resident = _loaded(d, causal, config["pingpong"], config["hold"], nwg,
                                   window is not None, device, False, softcap > 0)
        grid = min(-(-s // (64 * nwg)) * b * h, resident)
        qm, om = _map(q, 64 * nwg), _map(o, 64)

        def launch(tensors: tuple, out: torch.Tensor, stream: int,
                   lse: torch.Tensor | None = None) -> None:
            tq, tk, tv = tensors
            if lse is None:  # the kernel writes it; nothing reads it
                lse = tq.new_empty(lse_size, dtype=torch.float32)
            kernel[grid, None, stream](qm.at(tq.data_ptr()), km.at(tk.data_ptr()),
                                       vm.at(tv.data_ptr()), om.at(out.data_ptr()), lse, s, skv,
                                       h, kvh, b, log2_scale, *more)

        return launch

    tensors = (args["q"], k, v)

    def trial(config: Any) -> torch.Tensor:
        o = torch.empty_like(out)
        runner(config, o)(tensors, o, stream)
        return o

    # lengths rounded up to powers of two: sequences vary, the best choice barely does
    shape = (b * h, h // kvh, 1 << (s - 1).bit_length(), 1 << (skv - 1).bit_length())
    config = _tuner(d, causal, window is not None, softcap > 0).choose(
        shape, trial, autotune.close(2**-6), device=device, tune=autotune.tuning_allowed())
    return runner(config, out)


def _plan_lse(args: Args, out: tuple[torch.Tensor, torch.Tensor], stream: int) -> Run:
    launch = _launcher(args, out[0], stream)

    def run(tensors: tuple, out: tuple[torch.Tensor, torch.Tensor], stream: int) -> None:
        launch(tensors, out[0], stream, out[1])

    return run


PARAMS = (
    TensorParam(name="q", dtypes=(torch.bfloat16,), rank=4, layout="tma"),
    TensorParam(name="k", dtypes=(torch.bfloat16,), rank=4, layout="tma"),
    TensorParam(name="v", dtypes=(torch.bfloat16,), rank=4, layout="tma"),
    ScalarParam(name="causal", type="bool", default=False),
    ScalarParam(name="scale", type="float?", default=None),
    ScalarParam(name="window_left", type="int", default=-1),
    ScalarParam(name="window_right", type="int", default=-1),
    ScalarParam(name="softcap", type="float", default=0.0),
)

SPEC = OpSpec(name="attention", params=PARAMS, check=check, output=output, plan=_launcher)

# the same attention, returning the LSE too: what autograd runs in the op's place
LSE_SPEC = OpSpec(name="attention_lse", params=PARAMS, check=check, output=output,
                  extra_outputs=(_lse,), plan=_plan_lse)


def window_mask(s: int, skv: int, window: tuple[int, int], device: Any) -> torch.Tensor:
    """The (s, skv) keys each query row sees through the window (left, right), -1 unbounded,
    aligned to the end: row r's diagonal is key r + skv - s."""
    rel = (torch.arange(skv, device=device)[None, :] - torch.arange(s, device=device)[:, None]
           - (skv - s))
    left, right = window
    seen = torch.ones(s, skv, dtype=torch.bool, device=device)
    if left >= 0:
        seen &= rel >= -left
    if right >= 0:
        seen &= rel <= right
    return seen


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
         scale: float | None, window: tuple[int, int] | None = None) -> torch.Tensor:
    """The same attention with torch's scaled_dot_product_attention (its causal mask aligned
    to the end like the op's; `window` as mask_of gives it)."""
    import torch.nn.functional as F

    s, skv = q.shape[2], k.shape[2]
    if window is not None:
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True,
                                              attn_mask=window_mask(s, skv, window, q.device))
    if causal and s != skv:
        mask = torch.ones(s, skv, dtype=torch.bool, device=q.device).tril(skv - s)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                              enable_gqa=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                          enable_gqa=True)


def _setup(ctx: Any, inputs: tuple, output: tuple[torch.Tensor, torch.Tensor]) -> None:
    q, k, v, causal, scale, left, right, softcap = inputs
    ctx.scale, ctx.mask, ctx.softcap = scale, (bool(causal), left, right), softcap
    ctx.save_for_backward(q, k, v, *output)  # O and the LSE from attention_lse


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    """dL/dq, dL/dk, dL/dv by ptxdsl's backward kernels (deterministic where torch is asked
    for deterministic algorithms), or where they do not take the sizes, by torch."""
    q, k, v, o, lse = ctx.saved_tensors
    b, h, s, d = q.shape
    if takes(b, h, s, k.shape[2], d):
        dq, dk, dv = attention_backward(q, k, v, o, lse, grad.contiguous(), ctx.mask[0],
                                        ctx.scale, torch.are_deterministic_algorithms_enabled(),
                                        *ctx.mask[1:], ctx.softcap)
    else:
        dq, dk, dv = recomputed(q, k, v, grad, *mask_of(*ctx.mask), ctx.scale, ctx.softcap)
    return dq, dk, dv, None, None, None, None, None


def recomputed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad: torch.Tensor,
               causal: bool, window: tuple[int, int] | None, scale: float | None,
               softcap: float = 0.0) -> tuple[torch.Tensor, ...]:
    """The gradients by torch: the attention recomputed on q, k and v and differentiated
    (for what the backward kernels do not take: no query, or offsets past 2**32 elements);
    its SDPA, or with a softcap (which SDPA does not take) the math written out."""
    with torch.enable_grad():
        lq, lk, lv = (t.detach().requires_grad_() for t in (q, k, v))
        if softcap:
            out = capped(lq, lk, lv, causal, window, scale, softcap)
        else:
            out = sdpa(lq, lk, lv, causal, scale, window)
        return torch.autograd.grad(out, (lq, lk, lv), grad)


def capped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
           window: tuple[int, int] | None, scale: float | None,
           softcap: float) -> torch.Tensor:
    """Attention with the scores capped, softcap tanh(s scale / softcap), in torch's math
    (f32; a row that sees no key gets 0), the mask as sdpa's."""
    s, skv, d = q.shape[2], k.shape[2], q.shape[3]
    group = q.shape[1] // k.shape[1]
    k, v = (x.float().repeat_interleave(group, 1) for x in (k, v))
    scores = q.float() @ k.transpose(-1, -2) * (1.0 / math.sqrt(d) if scale is None else scale)
    scores = softcap * torch.tanh(scores / softcap)
    if causal or window is not None:
        seen = window_mask(s, skv, (-1, 0) if window is None else window, q.device)
        scores = scores.masked_fill(~seen, -math.inf)
    return (scores.softmax(-1).nan_to_num(0.0) @ v).to(q.dtype)


def check_varlen(args: Args) -> str | None:
    (total_q, h, _), total_k = args["q"].shape, args["k"].shape[0]
    wrong = check_packed(args)
    if wrong:
        return wrong
    if total_k < 1 and total_q > 0:
        return "k and v must hold at least one key"
    for name, what, total in (("max_seqlen_q", "query rows", total_q),
                              ("max_seqlen_k", "keys", total_k)):
        most = args[name]
        if most < -1 or most == 0 and total > 0 or most > total:
            side = name[-1]
            return (f"{name} must be the longest sequence's {what} (1 .. total_{side} = "
                    f"{total}), or -1 (total_{side}), got {most}")
    if max(total_q * h, total_k) >= _S32:
        return f"total_q * H and total_k must be below 2**31, got {total_q * h}, {total_k}"
    return check_window(args) or check_scale(args)


def varlen_window(args: Args) -> tuple[int, int] | None:
    """The window of a varlen call (its build has no causal form: causal is the window
    (window_left, 0)); None without a mask."""
    return varlen_mask(bool(args["causal"]), args["window_left"], args["window_right"])


def varlen_scalars(args: Args) -> tuple[int | float, ...]:
    """The varlen kernel's scalar arguments, in its parameter order (seq .. scale_log2, a
    window's window_left and window_right, a softcap's cap_scale): the walk's query rows a
    sequence (max_seqlen_q, or total_q), total_q, the heads, B and the scale in log2 units."""
    q, k = args["q"], args["k"]
    (total_q, h, d), (total_k, kvh, _) = q.shape, k.shape
    seq = total_q if args["max_seqlen_q"] < 0 else args["max_seqlen_q"]
    scale = args["scale"] if args["scale"] is not None else 1.0 / math.sqrt(d)
    log2_scale, _, *more = scalars(scale, float(args["softcap"]), varlen_window(args), total_k)
    return (seq, total_q, h, kvh, args["cu_seqlens_q"].shape[0] - 1, log2_scale, *more)


def _varlen_launcher(args: Args, out: torch.Tensor, stream: int) -> Launch:
    """The varlen build's launch, untuned: the first of attention_configs (the benchmark's
    fastest on equal lengths); the LSE (H, total_q) given, or written to scratch."""
    q = args["q"]
    total_q, h, d = q.shape
    values = varlen_scalars(args)
    seq, b = values[0], values[4]
    config = attention_configs(d)[0]
    nwg = config["nwg"]
    kernel, resident = _loaded(d, False, config["pingpong"], config["hold"], nwg,
                               varlen_window(args) is not None, q.device.index, True,
                               args["softcap"] > 0)
    grid = min(-(-seq // (64 * nwg)) * b * h, resident)
    qm = TensorMap(q, box=(64 * nwg, 1, 64), swizzle="128B")
    km, vm = (TensorMap(args[x], box=(BLOCK, 1, 64), swizzle="128B") for x in "kv")

    def launch(tensors: tuple, out: torch.Tensor, stream: int,
               lse: torch.Tensor | None = None) -> None:
        tq, tk, tv, cu_q, cu_k = tensors
        if lse is None:  # the kernel writes it; nothing reads it
            lse = tq.new_empty(h * total_q, dtype=torch.float32)
        kernel[grid, None, stream](qm.at(tq.data_ptr()), km.at(tk.data_ptr()),
                                   vm.at(tv.data_ptr()), out, lse, cu_q, cu_k, *values)

    return launch


def _plan_varlen_lse(args: Args, out: tuple[torch.Tensor, torch.Tensor], stream: int) -> Run:
    launch = _varlen_launcher(args, out[0], stream)

    def run(tensors: tuple, out: tuple[torch.Tensor, torch.Tensor], stream: int) -> None:
        launch(tensors, out[0], stream, out[1])

    return run


def _varlen_lse(args: Args) -> tuple[tuple[int, ...], torch.dtype]:
    return (args["q"].shape[1], args["q"].shape[0]), torch.float32


def _setup_varlen(ctx: Any, inputs: tuple, output: tuple[torch.Tensor, torch.Tensor]
                  ) -> None:
    q, k, v, cu_q, cu_k, *rest = inputs
    ctx.rest = rest  # max_seqlen_q .. softcap, in the backward op's order
    ctx.save_for_backward(q, k, v, cu_q, cu_k, *output)


def _backward_varlen(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    """dL/dq, dL/dk, dL/dv by ptxdsl's varlen backward kernels (deterministic where torch
    is asked for deterministic algorithms); zeros where there is no query or no key."""
    q, k, v, cu_q, cu_k, o, lse = ctx.saved_tensors
    if min(q.shape[0], k.shape[0]) == 0:
        grads = tuple(torch.zeros_like(t) for t in (q, k, v))
    else:
        grads = attention_varlen_backward(q, k, v, o, lse, grad.contiguous(), cu_q, cu_k,
                                          *ctx.rest,
                                          torch.are_deterministic_algorithms_enabled())
    return *grads, *(None,) * (2 + len(ctx.rest))


VARLEN_PARAMS = (
    TensorParam(name="q", dtypes=(torch.bfloat16,), rank=3, layout="tma"),
    TensorParam(name="k", dtypes=(torch.bfloat16,), rank=3, layout="tma"),
    TensorParam(name="v", dtypes=(torch.bfloat16,), rank=3, layout="tma"),
    TensorParam(name="cu_seqlens_q", dtypes=(torch.int32,), rank=1, aligned=False),
    TensorParam(name="cu_seqlens_k", dtypes=(torch.int32,), rank=1, aligned=False),
    ScalarParam(name="max_seqlen_q", type="int", default=-1),
    ScalarParam(name="max_seqlen_k", type="int", default=-1),
    *PARAMS[3:],
)

VARLEN_SPEC = OpSpec(name="attention_varlen", params=VARLEN_PARAMS, check=check_varlen,
                     output=output, plan=_varlen_launcher)
# the same, returning the LSE too: what autograd runs in the op's place
VARLEN_LSE_SPEC = OpSpec(name="attention_varlen_lse", params=VARLEN_PARAMS,
                         check=check_varlen, output=output, extra_outputs=(_varlen_lse,),
                         plan=_plan_varlen_lse)

attention_varlen_lse = register(VARLEN_LSE_SPEC)
attention_varlen = register(VARLEN_SPEC, backward=_backward_varlen,
                            setup_context=_setup_varlen,
                            forward=torch.ops.ptxdsl.attention_varlen_lse.default)
attention_lse = register(LSE_SPEC)
attention = register(SPEC, backward=_backward, setup_context=_setup,
                     forward=torch.ops.ptxdsl.attention_lse.default)
