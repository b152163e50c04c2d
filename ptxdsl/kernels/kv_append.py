"""The KV-cache append: the new keys and values of each sequence written into its cache, the
layout `decode_attention` reads, with the Python API.

K_new and V_new are bf16 (B x S x KVH x D), S new tokens a sequence; the caches are contiguous,
(B x S_max x KVH x D), or paged, (pages x page_size x KVH x D) with a block table (B x pages
per sequence, s32). `lens` (s32 on the GPU, B) counts each sequence's keys with the new ones
(decode_attention's convention), so new token t of sequence b goes to position
lens[b] - S + t. Every tensor is addressed through its strides (elements, the last dimension
unit-stride, 16-byte aligned rows), so a view such as V sliced out of a fused QKV projection
needs no copy.

A CTA takes a (sequence, token) row at a time (a grid-stride loop over the B x S rows): it
works out the row's place once, then its 128 threads copy the row's KVH x D keys and values
16 bytes a load. Lengths and table entries are read on the GPU, so no value may write outside
the cache: a position below 0 or at the capacity (S_max, or pages per sequence x page_size)
and beyond is skipped, the table is read only at slots below pages per sequence, and a page
outside 0 .. pages - 1 is skipped too. The page size is a power of two (`page_shift`), so a
position's page and row are a shift and a mask."""

import numpy as np

import ptxdsl
from ptxdsl import bf16, ptr, s32, u32, u64
from ptxdsl.kernels.family import Family

THREADS = 128
VEC = 8  # bf16 elements of a 16-byte load


def make_kv_append(d: int = 128) -> ptxdsl.KernelDef:
    """The append for head dim `d` (a multiple of 8 from 8 to 512)."""
    if d % VEC or not VEC <= d <= 512:
        raise ValueError(f"make_kv_append: head dim is a multiple of 8 from 8 to 512, not {d}")
    per_head = d // VEC  # 16-byte chunks of a head

    def kv_append(k, k_new: ptr(bf16), v_new: ptr(bf16), k_cache: ptr(bf16),
                  v_cache: ptr(bf16), lens: ptr(s32), table: ptr(s32), seq: u32, rows: u32,
                  kv_heads: u32, capacity: u32, page_shift: u32, pages_per_seq: u32,
                  pages: u32, paged: u32, kn_b: u64, kn_t: u64, kn_h: u64, vn_b: u64,
                  vn_t: u64, vn_h: u64, kc_p: u64, kc_r: u64, kc_h: u64, vc_p: u64,
                  vc_r: u64, vc_h: u64):
        chunks = k.let("chunks", kv_heads * per_head)
        with k.for_("r", k.ctaid.x, rows, k.nctaid.x) as r:
            b = k.let("b", r / seq)
            t = k.let("t", r % seq)
            pos = k.let("pos", lens[b] - seq.to(s32) + t.to(s32))
            ok = k.let("ok", (pos >= 0) & (pos < capacity.to(s32)))
            page = k.let("page", b.to(s32))
            row = k.let("row", pos)
            with k.if_(ok & (paged != 0)):
                slot = k.let("slot", pos.to(u32) >> page_shift)  # < pages_per_seq: pos < capacity
                k.assign(page, table[b * pages_per_seq + slot])
                k.assign(row, pos & ((1 << page_shift) - 1).to(s32))
                k.assign(ok, (page >= 0) & (page < pages.to(s32)))
            with k.if_(ok):
                b64, t64 = b.to(u64), t.to(u64)
                page64, row64 = page.to(u64), row.to(u64)
                kn = k.let("kn", b64 * kn_b + t64 * kn_t)
                vn = k.let("vn", b64 * vn_b + t64 * vn_t)
                kc = k.let("kc", page64 * kc_p + row64 * kc_r)
                vc = k.let("vc", page64 * vc_p + row64 * vc_r)
                with k.for_("c", k.tid.x, chunks, THREADS) as c:
                    h = k.let("h", (c / per_head).to(u64))
                    x = k.let("x", (c % per_head * VEC).to(u64))
                    kv = k.let("kv", k.vload(k_new[kn + h * kn_h + x], VEC))
                    vv = k.let("vv", k.vload(v_new[vn + h * vn_h + x], VEC))
                    k_cache[kc + h * kc_h + x] = kv
                    v_cache[vc + h * vc_h + x] = vv

    return ptxdsl.kernel(threads=THREADS, name=f"kv_append_d{d}")(kv_append)


kv_append = make_kv_append()  # the family's default build: head dim 128


def launch_grid(rows: int, sms: int = 132) -> int:
    """One CTA per (sequence, token) row, at most 16 an SM (a CTA walks rows in turn)."""
    return max(1, min(rows, 16 * sms))


def reference(k_new: np.ndarray, k_cache: np.ndarray, lens: np.ndarray,
              table: np.ndarray | None) -> np.ndarray:
    """The cache after the append, for one of K or V: new token t of sequence b at position
    lens[b] - S + t, skipped outside 0 .. capacity - 1 or on a page outside the cache."""
    out = k_cache.copy()
    bsz, seq = k_new.shape[:2]
    page_size = k_cache.shape[1]
    capacity = table.shape[1] * page_size if table is not None else page_size
    for b in range(bsz):
        for t in range(seq):
            pos = int(lens[b]) - seq + t
            if not 0 <= pos < capacity:
                continue
            if table is None:
                out[b, pos] = k_new[b, t]
                continue
            page = int(table[b, pos // page_size])
            if 0 <= page < k_cache.shape[0]:
                out[page, pos % page_size] = k_new[b, t]
    return out


def example(rng: np.random.Generator, batch: int = 3, seq: int = 5, kv_heads: int = 2,
            d: int = 64, lens: tuple[int, ...] = (5, 11, 34), page_size: int | None = 8,
            capacity: int = 32, wide: int = 0, bad_pages: bool = False,
            grid: int | None = None) -> dict:
    """Random bf16 new keys and values appended into random bf16 caches, which the kernel
    updates in place (compared bit for bit): paged (pages shuffled, two spare) when
    `page_size` is given, else contiguous with S_max = capacity. `wide`: the new K and V are
    views of rows `wide` heads wider (as slices of a fused QKV projection are). `bad_pages`:
    the last sequence's table names pages past the cache and negative ones (its rows are
    skipped). The default lengths put a page boundary inside sequence 1's new tokens and
    sequence 2's last two past the capacity."""
    from ptxdsl.runtime.dtypes import f32_to_bf16

    def rand(shape):  # finite bf16 bits
        return f32_to_bf16(rng.standard_normal(shape, np.float32))

    new_shape = (batch, seq, kv_heads + wide, d)
    kn, vn = rand(new_shape), rand(new_shape)
    if page_size is None:
        cache_shape = (batch, capacity, kv_heads, d)
        table, per, shift, pages = None, 1, 0, batch
    else:
        per = capacity // page_size
        pages = batch * per + 2
        cache_shape = (pages, page_size, kv_heads, d)
        table = rng.permutation(pages)[: batch * per].reshape(batch, per).astype(np.int32)
        if bad_pages:
            table[-1, ::2], table[-1, 1::2] = pages + 5, -3
        shift = page_size.bit_length() - 1
    kc, vc = rand(cache_shape), rand(cache_shape)
    n = np.array(lens, np.int32)

    def strides(shape):  # elements, dimensions 0 .. 2 of a row-major array
        return [int(np.prod(shape[i + 1:])) for i in range(3)]

    names = ("kn_b", "kn_t", "kn_h", "vn_b", "vn_t", "vn_h",
             "kc_p", "kc_r", "kc_h", "vc_p", "vc_r", "vc_h")
    values = strides(new_shape) * 2 + strides(cache_shape) * 2
    return {"kernel": f"kv_append_d{d}", "grid": grid or launch_grid(batch * seq),
            "inputs": {"k_new": kn, "v_new": vn, "k_cache": kc, "v_cache": vc, "lens": n,
                       "table": table if table is not None else np.zeros(1, np.int32),
                       "seq": seq, "rows": batch * seq, "kv_heads": kv_heads,
                       "capacity": capacity, "page_shift": shift, "pages_per_seq": per,
                       "pages": pages, "paged": int(table is not None),
                       **{k: np.uint64(v) for k, v in zip(names, values, strict=True)}},
            "expected": {"k_cache": reference(kn[:, :, :kv_heads], kc, n, table),
                         "v_cache": reference(vn[:, :, :kv_heads], vc, n, table)}}


FAMILY = Family(
    name="kv_append",
    summary="the new keys and values of each sequence written into a paged or contiguous "
            "bf16 KV cache at its GPU-side length, out-of-range places skipped",
    factory=make_kv_append,
    defaults={"d": 128},
)
