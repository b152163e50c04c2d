"""`torch.ops.ptxdsl.kv_append(k_new, v_new, k_cache, v_cache, cache_seqlens, block_table=None)`:
the new keys and values of each sequence written into its KV cache in place, the layout
`decode_attention` reads (ptxdsl.kernels.kv_append).

k_new and v_new are bf16 (B, S, KVH, D), D a multiple of 8 up to 512; the caches are
contiguous, (B, S_max, KVH, D), or paged, (pages, page_size, KVH, D) with block_table int32
(B, pages per sequence) and page_size a power of two; cache_seqlens int32 (B,) counts each
sequence's keys with the new ones (decode_attention's convention), so new token t of sequence
b lands at position cache_seqlens[b] - S + t. Any tensor whose last dimension is unit-stride
and whose other strides are 16-byte multiples is taken as it is (V sliced from a fused QKV
projection needs no copy). The lengths and block-table entries are read on the GPU: a
position outside 0 .. capacity - 1 (S_max, or pages per sequence x page_size), or on a
page outside the cache, is skipped, so no value writes outside the caches.

The schema declares the writes (`Tensor(a!) k_cache, Tensor(b!) v_cache) -> ()`), so
torch.compile functionalizes the call and a CUDA graph replays it; like torch's in-place ops
it bumps the caches' autograd versions, and it refuses inputs that need a gradient."""

from __future__ import annotations

from functools import cache

import torch

from ..kernels import kv_append as ka
from ..runtime.launch import Kernel
from .decode import capacity  # the same cache arguments, the same capacity
from .dispatch import register
from .kernels import kv_append_kernel
from .opspec import Args, OpSpec, Run, TensorParam

MAX_D = 512


def check(args: Args) -> str | None:
    kn, vn, kc, vc = (args[n] for n in ("k_new", "v_new", "k_cache", "v_cache"))
    lens = args["cache_seqlens"]
    b, s, kvh, d = kn.shape
    if tuple(vn.shape) != tuple(kn.shape):
        return f"v_new must have k_new's shape {tuple(kn.shape)}, got {tuple(vn.shape)}"
    if d % ka.VEC or not ka.VEC <= d <= MAX_D:
        return f"the head dim (k_new's last size) must be a multiple of 8 from 8 to {MAX_D}, " \
               f"got {d}"
    if tuple(vc.shape) != tuple(kc.shape):
        return f"v_cache must have k_cache's shape {tuple(kc.shape)}, got {tuple(vc.shape)}"
    if kc is vc:
        return "k_cache and v_cache must be two tensors, got the same one twice"
    if tuple(kc.shape[2:]) != (kvh, d):
        return f"k_cache must hold k_new's heads and head dim ({kvh}, {d}) in dimensions 2 " \
               f"and 3, got {tuple(kc.shape[2:])}"
    if tuple(lens.shape) != (b,):
        return f"cache_seqlens must be ({b},), one length per sequence of k_new, got " \
               f"{tuple(lens.shape)}"
    if args["block_table"] is not None:
        table, page = args["block_table"], kc.shape[1]
        if table.dim() != 2 or table.shape[0] != b or table.shape[1] < 1:
            return f"block_table must be ({b}, pages per sequence), got {tuple(table.shape)}"
        if page < 1 or page & (page - 1):
            return f"the page size (k_cache's dimension 1) must be a power of two, got {page}"
    elif kc.shape[0] != b:
        return f"a contiguous k_cache must be (B, S_max, KVH, D) with k_new's B = {b}, got " \
               f"{tuple(kc.shape)} (pass block_table for a paged cache)"
    if kc.shape[0] < 1 or kc.shape[1] < 1:
        return f"k_cache must hold at least one key, got {tuple(kc.shape)}"
    if capacity(args) >= 2**31 or kc.shape[0] >= 2**31:
        return f"a sequence's cache and the pages must be fewer than 2**31, got " \
               f"{capacity(args)} keys and {kc.shape[0]} pages or sequences"
    if b * s >= 2**31:
        return f"k_new must have fewer than 2**31 (sequence, token) rows, got {b * s}"
    return None


@cache
def _loaded(d: int, device: int) -> tuple[Kernel, int]:
    """The loaded kernel and the device's SM count."""
    from ..runtime.driver import device_info

    return kv_append_kernel(d).program().kernel(device=device), device_info(device).sm_count


def scalars(args: Args) -> tuple[int, ...]:
    """The kernel's scalar arguments, in its parameter order (seq .. vc_h): sizes, the page
    shift, and the strides of dimensions 0 .. 2 of k_new, v_new, k_cache, v_cache."""
    kn, kc, table = args["k_new"], args["k_cache"], args["block_table"]
    b, s, kvh, _ = kn.shape
    paged = table is not None
    return (s, b * s, kvh, capacity(args), kc.shape[1].bit_length() - 1 if paged else 0,
            table.shape[1] if paged else 1, kc.shape[0], int(paged),
            *(st for n in ("k_new", "v_new", "k_cache", "v_cache")
              for st in args[n].stride()[:3]))


def _plan(args: Args, out: torch.Tensor | None, stream: int) -> Run:
    kn = args["k_new"]
    b, s, _, d = kn.shape
    paged = args["block_table"] is not None
    kernel, sms = _loaded(d, kn.device.index)
    grid = ka.launch_grid(b * s, sms)
    values = scalars(args)

    def run(tensors: tuple, out: torch.Tensor | None, stream: int) -> None:
        k_new, v_new, k_cache, v_cache, lens = tensors[:5]
        # contiguous: the kernel never reads the table; any device pointer stands in
        table = tensors[5] if paged else lens
        kernel[grid, None, stream](k_new, v_new, k_cache, v_cache, lens, table, *values)

    return run


SPEC = OpSpec(
    name="kv_append",
    params=(
        TensorParam(name="k_new", dtypes=(torch.bfloat16,), rank=4, layout="tma"),
        TensorParam(name="v_new", dtypes=(torch.bfloat16,), rank=4, layout="tma"),
        TensorParam(name="k_cache", dtypes=(torch.bfloat16,), rank=4, layout="tma",
                    mutated=True),
        TensorParam(name="v_cache", dtypes=(torch.bfloat16,), rank=4, layout="tma",
                    mutated=True),
        TensorParam(name="cache_seqlens", dtypes=(torch.int32,), rank=1, aligned=False),
        TensorParam(name="block_table", dtypes=(torch.int32,), rank=2, optional=True,
                    aligned=False),
    ),
    check=check,
    output=None,
    plan=_plan,
)


kv_append = register(SPEC)
