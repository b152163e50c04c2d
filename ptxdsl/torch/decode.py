"""`torch.ops.ptxdsl.decode_attention(q, k_cache, v_cache, cache_seqlens, block_table=None,
causal=True, scale=None)`: attention of the new tokens of each sequence against its KV cache
(the argument order of flash_attn_with_kvcache), the library's split-KV decode kernel
(ptxdsl.kernels.decode_attention).

q is bf16 (B, S, H, D) with S = 1 to 16 new tokens and D = 64 or 128; the cache is contiguous,
k_cache and v_cache (B, S_max, KVH, D), or paged, (pages, page_size, KVH, D) with block_table
int32 (B, pages per sequence) and page_size a power of two from 16; cache_seqlens int32 (B,)
the keys each sequence holds, the S new ones included (causal, new token t sees keys up to
cache_seqlens - S + t). Lengths and block-table entries are read on the GPU: a length is
clamped to [0, the cache's capacity] and a page outside the cache reads as zeros, so no
value makes the kernel read outside the caches; a row that sees no key is zero. The output is
like q."""

from __future__ import annotations

import math
from functools import cache

import torch

from ..kernels import decode_attention as da
from ..runtime.launch import Kernel
from ..runtime.tensormap import TensorMap
from .dispatch import register
from .gemm import semaphores
from .kernels import DECODE_HEAD_DIMS, decode_kernel
from .opspec import Args, OpSpec, Run, ScalarParam, TensorParam

MAX_NEW = 16  # new tokens a call takes (speculative decoding, chunked prefill)
MIN_PAGE = 16  # the smallest page: the kernel's smallest TMA copy (16 keys)


def _paged(args: Args) -> bool:
    return args["block_table"] is not None


def capacity(args: Args) -> int:
    """The keys a sequence's cache holds: S_max, or pages per sequence x page size."""
    k = args["k_cache"]
    return args["block_table"].shape[1] * k.shape[1] if _paged(args) else k.shape[1]


def check(args: Args) -> str | None:
    q, k, v, lens = args["q"], args["k_cache"], args["v_cache"], args["cache_seqlens"]
    b, s, h, d = q.shape
    if d not in DECODE_HEAD_DIMS:
        return f"the head dim (q's last size) must be 64 or 128, got {d}"
    if not 1 <= s <= MAX_NEW:
        return f"q must have 1 to {MAX_NEW} new tokens a sequence (dimension 1), got {s}"
    if tuple(v.shape) != tuple(k.shape):
        return f"v_cache must have k_cache's shape {tuple(k.shape)}, got {tuple(v.shape)}"
    kvh = k.shape[2]
    if k.shape[3] != d:
        return f"k_cache's head dim must be q's ({d}), got {k.shape[3]}"
    if kvh < 1 or h % kvh:
        return f"k_cache's heads (dimension 2) must divide q's ({h}), got {kvh}"
    if tuple(lens.shape) != (b,):
        return f"cache_seqlens must be ({b},), one length per sequence of q, got " \
               f"{tuple(lens.shape)}"
    if _paged(args):
        table, page = args["block_table"], k.shape[1]
        if table.dim() != 2 or table.shape[0] != b or table.shape[1] < 1:
            return f"block_table must be ({b}, pages per sequence), got {tuple(table.shape)}"
        if page < MIN_PAGE or page & (page - 1):
            return f"the page size (k_cache's dimension 1) must be a power of two from " \
                   f"{MIN_PAGE}, got {page}"
    elif k.shape[0] != b:
        return f"a contiguous k_cache must be (B, S_max, KVH, D) with q's B = {b}, got " \
               f"{tuple(k.shape)} (pass block_table for a paged cache)"
    if k.shape[0] < 1 or k.shape[1] < 1:
        return f"k_cache must hold at least one key, got {tuple(k.shape)}"
    if capacity(args) >= 2**31:
        return f"a sequence's cache must hold fewer than 2**31 keys, got {capacity(args)}"
    scale = args["scale"]
    if scale is not None and not (0 < scale < math.inf):
        return f"scale must be positive and finite, got {scale}"
    return None


def output(args: Args) -> tuple[tuple[int, ...], torch.dtype]:
    return tuple(args["q"].shape), torch.bfloat16


@cache
def _loaded(d: int, box: int, device: int) -> tuple[Kernel, int]:
    """The loaded kernel and the device's SM count."""
    from ..runtime.driver import device_info

    return decode_kernel(d, box).program().kernel(device=device), device_info(device).sm_count


def _plan(args: Args, out: torch.Tensor, stream: int) -> Run:
    q, k = args["q"], args["k_cache"]
    b, s, h, d = q.shape
    kvh = k.shape[2]
    paged = _paged(args)
    page = k.shape[1] if paged else 0
    box = da.box_for(page if paged else None)
    cap = capacity(args)
    kernel, sms = _loaded(d, box, q.device.index)
    tiles = da.row_tiles(s, h // kvh)
    splits = da.pick_splits(b, kvh, tiles, cap, sms)
    size, nsem = da.workspace(b, kvh, tiles, splits, d)
    grid = da.launch_grid(b, kvh, tiles, splits, sms)
    tk = TensorMap(k, box=(1, box, 1, 64), swizzle="128B")
    tv = TensorMap(args["v_cache"], box=(1, box, 1, 64), swizzle="128B")
    scale = args["scale"] if args["scale"] is not None else 1.0 / math.sqrt(d)
    log2_scale = scale * math.log2(math.e)
    pages_per_seq = args["block_table"].shape[1] if paged else 1
    causal = int(bool(args["causal"]))
    device = q.device.index

    def run(tensors: tuple, out: torch.Tensor, stream: int) -> None:
        x, kc, vc, lens = tensors[:4]
        # contiguous: the kernel never reads the table; any device pointer stands in
        table = tensors[4] if paged else lens
        ws = x.new_empty(size, dtype=torch.float32)
        sem = semaphores(device, stream, nsem)
        kernel[grid, None, stream](x, tk.at(kc.data_ptr()), tv.at(vc.data_ptr()), out, lens,
                                   table, ws, sem, s, h, kvh, b, cap, page or cap,
                                   pages_per_seq, int(paged), causal, splits, log2_scale)

    return run


SPEC = OpSpec(
    name="decode_attention",
    params=(
        TensorParam(name="q", dtypes=(torch.bfloat16,), rank=4),
        TensorParam(name="k_cache", dtypes=(torch.bfloat16,), rank=4, layout="tma"),
        TensorParam(name="v_cache", dtypes=(torch.bfloat16,), rank=4, layout="tma"),
        TensorParam(name="cache_seqlens", dtypes=(torch.int32,), rank=1, aligned=False),
        TensorParam(name="block_table", dtypes=(torch.int32,), rank=2, optional=True,
                    aligned=False),
        ScalarParam(name="causal", type="bool", default=True),
        ScalarParam(name="scale", type="float?", default=None),
    ),
    check=check,
    output=output,
    plan=_plan,
)


def reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              cache_seqlens: torch.Tensor, block_table: torch.Tensor | None = None,
              causal: bool = True, scale: float | None = None) -> torch.Tensor:
    """The same attention with torch's math in f32, sequence by sequence (for tests and the
    benchmark's check): the pages gathered through the block table (one outside the cache
    reads as zeros, as TMA fills it), lengths clamped as the kernel clamps them, a row that
    sees no key zero."""
    b, s, h, d = q.shape
    kvh = k_cache.shape[2]
    scale = scale if scale is not None else 1.0 / math.sqrt(d)
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for i in range(b):
        if block_table is not None:
            pages = block_table[i].long()
            held = ((pages >= 0) & (pages < k_cache.shape[0]))[:, None, None, None]
            at = pages.clamp(0, k_cache.shape[0] - 1)  # a page outside the cache reads zeros
            kk, vv = (torch.where(held, c[at], 0).flatten(0, 1) for c in (k_cache, v_cache))
        else:
            kk, vv = k_cache[i], v_cache[i]
        n = max(0, min(int(cache_seqlens[i]), kk.shape[0]))
        kk = kk[:n].float().repeat_interleave(h // kvh, dim=1)  # (n, H, D)
        vv = vv[:n].float().repeat_interleave(h // kvh, dim=1)
        scores = torch.einsum("thd,khd->htk", q[i].float(), kk) * scale
        if causal:
            see = torch.arange(n, device=q.device)[None, :] <= \
                (n - s + torch.arange(s, device=q.device))[:, None]
            scores = scores.masked_fill(~see, -math.inf)
        p = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row with no key: 0
        out[i] = torch.einsum("htk,khd->thd", p, vv)
    return out


decode_attention = register(SPEC)
