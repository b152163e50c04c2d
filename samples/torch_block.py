"""A Llama-style decoder block in PyTorch whose kernels are ptxdsl ops.

    python samples/torch_block.py           # checks it against eager PyTorch on the GPU

RMSNorm (`torch.ops.ptxdsl.rms_norm`), the fused QKV, output, gate-up and down projections
(`torch.ops.ptxdsl.gemm`, x @ W^T), causal prefill attention with grouped KV heads
(`torch.ops.ptxdsl.attention`), and at decode the KV-cache append (`torch.ops.ptxdsl.kv_append`)
and split-KV decode attention over the cache (`torch.ops.ptxdsl.decode_attention`) run
ptxdsl's kernels. Up to SMALLM_MAX_M tokens (decoding) the decode GEMM's store does the next
step too: the residual adds after the output and down projections (`gemm(x, w, residual)`)
and SiLU-and-multiply after the gate-up projection (`gemm_silu_mul`, whose weight holds the
gate and up rows interleaved: `interleave_gate_up`, once, as the block is made); past that,
and the rotary embedding always, PyTorch does them (torch.compile fuses them). The same
`Block` runs on PyTorch's own kernels with `Block(cfg, kernels=TORCH)`: that is the
reference, eager or compiled.

Prefill: `block(x, cos, sin)` with x (B, S, hidden) at positions 0 .. S - 1 attends causally
within x. With a cache, `block(x, cos, sin, cache)`: x holds each sequence's S newest tokens,
and `cache.seqlens` (int32 on the GPU, (B,)) already counts them (`cache.advance(S)`), so
sequence b's tokens sit at positions seqlens[b] - S .. seqlens[b] - 1, each sequence at its
own length. The block writes their keys and values into the cache, then attends: up to
MAX_NEW tokens (a decode step, speculative tokens, a short prompt) over the whole cache with
the causal mask aligned to each sequence's end; more (a prompt's prefill) within x alone, so
the cache must hold nothing before them. The cache is contiguous (`KVCache`, (B, S_max, KVH,
D)) or paged (`PagedKVCache`, (pages, page_size, KVH, D) and a block table), the layouts
decode_attention reads; nothing in a call reads a length on the host, so a decode step is
captured whole in a CUDA graph."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import ptxdsl.torch  # registers torch.ops.ptxdsl
from ptxdsl.kernels.gemm_smallm import GATE_UP_GROUP
from ptxdsl.torch.kernels import SMALLM_MAX_M

MAX_NEW = 16  # new tokens a sequence that attend over the cache (decode_attention's limit)


@dataclass(frozen=True)
class Config:
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    ffn: int = 14336
    eps: float = 1e-5
    rope_theta: float = 500000.0


@dataclass
class KVCache:
    """A contiguous cache: keys and values (B, S_max, KVH, D) each, and `seqlens` int32 (B,),
    the keys each sequence holds."""

    k: torch.Tensor
    v: torch.Tensor
    seqlens: torch.Tensor

    @property
    def block_table(self) -> None:
        return None

    @classmethod
    def empty(cls, cfg: Config, batch: int, max_len: int, device="cuda") -> KVCache:
        shape = (batch, max_len, cfg.kv_heads, cfg.head_dim)
        return cls(torch.zeros(shape, dtype=torch.bfloat16, device=device),
                   torch.zeros(shape, dtype=torch.bfloat16, device=device),
                   torch.zeros(batch, dtype=torch.int32, device=device))

    def another(self) -> KVCache:
        """Zeroed keys and values (the next layer's) under the same lengths."""
        return KVCache(torch.zeros_like(self.k), torch.zeros_like(self.v), self.seqlens)

    def sequence(self, b: int) -> KVCache:
        """Sequence b alone, as views: what a call writes, and advance(), land in this
        cache (a prompt's prefill)."""
        return KVCache(self.k[b:b + 1], self.v[b:b + 1], self.seqlens[b:b + 1])

    def advance(self, tokens: int) -> None:
        """Count `tokens` new tokens in every sequence (before the blocks see them)."""
        self.seqlens += tokens


@dataclass
class PagedKVCache:
    """A paged cache: keys and values (pages, page_size, KVH, D) each, `block_table` int32
    (B, pages per sequence) naming sequence b's pages in order, and `seqlens` int32 (B,)."""

    k: torch.Tensor
    v: torch.Tensor
    block_table: torch.Tensor
    seqlens: torch.Tensor

    @property
    def page_size(self) -> int:
        return self.k.shape[1]

    @classmethod
    def empty(cls, cfg: Config, batch: int, max_len: int, page_size: int = 64, device="cuda",
              seed: int = 0) -> PagedKVCache:
        """Room for `max_len` keys a sequence, its pages spread in a shuffled order (as a
        serving engine's allocator leaves them)."""
        per = -(-max_len // page_size)
        shape = (batch * per, page_size, cfg.kv_heads, cfg.head_dim)
        g = torch.Generator(device=device).manual_seed(seed)
        table = torch.randperm(batch * per, device=device, generator=g).view(batch, per)
        return cls(torch.zeros(shape, dtype=torch.bfloat16, device=device),
                   torch.zeros(shape, dtype=torch.bfloat16, device=device),
                   table.to(torch.int32), torch.zeros(batch, dtype=torch.int32, device=device))

    @classmethod
    def of(cls, cache: KVCache, page_size: int = 64, seed: int = 0) -> PagedKVCache:
        """The keys, values and lengths of a contiguous cache (S_max a multiple of
        `page_size`), copied into shuffled pages."""
        b, s_max, kvh, d = cache.k.shape
        paged = cls.empty(Config(kv_heads=kvh, head_dim=d), b, s_max, page_size,
                          cache.k.device, seed)
        for mine, theirs in ((paged.k, cache.k), (paged.v, cache.v)):
            mine[paged.block_table.flatten().long()] = theirs.reshape(mine.shape)
        paged.seqlens.copy_(cache.seqlens)
        return paged

    def another(self) -> PagedKVCache:
        """Zeroed pages (the next layer's) under the same block table and lengths."""
        return PagedKVCache(torch.zeros_like(self.k), torch.zeros_like(self.v),
                            self.block_table, self.seqlens)

    def sequence(self, b: int) -> PagedKVCache:
        """Sequence b alone (its row of the table and its length, as views): what a call
        writes, and advance(), land in this cache (a prompt's prefill)."""
        return PagedKVCache(self.k, self.v, self.block_table[b:b + 1], self.seqlens[b:b + 1])

    def advance(self, tokens: int) -> None:
        """Count `tokens` new tokens in every sequence (before the blocks see them)."""
        self.seqlens += tokens


Cache = KVCache | PagedKVCache


def new_positions(cache: Cache, s: int) -> torch.Tensor:
    """Positions (B, S) of each sequence's S newest tokens: seqlens[b] - S .. seqlens[b] - 1."""
    return cache.seqlens[:, None].long() - s + torch.arange(s, device=cache.seqlens.device)


def silu_mul(y: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of y = x @ W^T over the interleaved gate-up weight (its columns are
    groups of GATE_UP_GROUP gate outputs, each followed by the same outputs' up)."""
    pairs = y.unflatten(-1, (-1, 2, GATE_UP_GROUP))
    return (F.silu(pairs[..., 0, :]) * pairs[..., 1, :]).flatten(-2)


class Kernels:
    """The kernels the block calls, ptxdsl's or PyTorch's."""

    def rms_norm(self, x, w, eps):
        return torch.ops.ptxdsl.rms_norm(x, w, eps)

    def linear(self, x, w, residual=None):
        """x @ w^T (x rows of tokens), plus `residual` (x's rows of the output's width)."""
        if residual is None:
            return torch.ops.ptxdsl.gemm(x, w)
        if x.shape[0] <= SMALLM_MAX_M:  # added as the decode GEMM stores
            return torch.ops.ptxdsl.gemm(x, w, residual)
        return torch.ops.ptxdsl.gemm(x, w) + residual

    def gate_up(self, x, w):
        """silu(gate) * up of x @ w^T, w the interleaved gate-up weight."""
        if x.shape[0] <= SMALLM_MAX_M:
            return torch.ops.ptxdsl.gemm_silu_mul(x, w)
        return silu_mul(torch.ops.ptxdsl.gemm(x, w))

    def attention(self, q, k, v):
        """Prefill: q (B, H, S, D), k and v (B, KVH, S, D), causal."""
        return torch.ops.ptxdsl.attention(q, k, v, True)

    def append(self, k, v, cache: Cache) -> None:
        """k and v (B, S, KVH, D) into the cache at each sequence's S newest positions."""
        torch.ops.ptxdsl.kv_append(k, v, cache.k, cache.v, cache.seqlens, cache.block_table)

    def decode(self, q, cache: Cache):
        """q (B, S, H, D) of each sequence's S newest tokens over its cache, causal aligned to
        the end: (B, S, H, D)."""
        return torch.ops.ptxdsl.decode_attention(q, cache.k, cache.v, cache.seqlens,
                                                 cache.block_table)


class TorchKernels(Kernels):
    def rms_norm(self, x, w, eps):
        return F.rms_norm(x, (x.shape[-1],), w, eps)

    def linear(self, x, w, residual=None):
        y = F.linear(x, w)
        return y if residual is None else y + residual

    def gate_up(self, x, w):
        return silu_mul(F.linear(x, w))

    def attention(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def append(self, k, v, cache: Cache) -> None:
        """Torch indexing at places worked out on the GPU (the lengths are assumed to fit the
        cache: no clamping, unlike the ptxdsl op)."""
        b, s = k.shape[:2]
        pos = new_positions(cache, s)
        if cache.block_table is None:
            page, row = torch.arange(b, device=k.device)[:, None].expand(b, s), pos
        else:
            size = cache.k.shape[1]
            page, row = cache.block_table.long().gather(1, pos // size), pos % size
        cache.k[page, row] = k
        cache.v[page, row] = v

    def decode(self, q, cache: Cache):
        """SDPA over the whole cache (the pages gathered in order), keys past each sequence's
        position masked. The query heads that share a KV head are taken as rows of one head
        (q as (B, KVH, group x S, D)), so no backend repeats K and V per query head."""
        b, s, h, d = q.shape
        if cache.block_table is None:
            k, v = cache.k, cache.v
        else:
            table = cache.block_table.long()
            k, v = (c[table].flatten(1, 2) for c in (cache.k, cache.v))
        kvh = k.shape[2]
        group = h // kvh
        see = torch.arange(k.shape[1], device=q.device) <= new_positions(cache, s)[..., None]
        mask = see[:, None, None].expand(b, 1, group, s, k.shape[1]).flatten(2, 3)
        rows = q.view(b, s, kvh, group, d).permute(0, 2, 3, 1, 4).reshape(b, kvh, group * s, d)
        o = F.scaled_dot_product_attention(rows, k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=mask)
        return o.view(b, kvh, group, s, d).permute(0, 3, 1, 2, 4).reshape(b, s, h, d)


PTXDSL, TORCH = Kernels(), TorchKernels()


def rope_tables(cfg: Config, max_len: int, device="cuda") -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (max_len, head_dim) of the rotary embedding, f32."""
    inv = cfg.rope_theta ** (-torch.arange(0, cfg.head_dim, 2, device=device) / cfg.head_dim)
    angles = torch.outer(torch.arange(max_len, device=device, dtype=torch.float32), inv)
    angles = torch.cat([angles, angles], -1)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, S, heads, D) rotated by the (S, D) or (B, S, D) tables, in f32, back to x's
    dtype."""
    xf = x.float()
    half = x.shape[-1] // 2
    turned = torch.cat([-xf[..., half:], xf[..., :half]], -1)
    return (xf * cos.unsqueeze(-2) + turned * sin.unsqueeze(-2)).to(x.dtype)


class Block(torch.nn.Module):
    def __init__(self, cfg: Config, kernels: Kernels = PTXDSL, device="cuda", seed: int = 0):
        super().__init__()
        self.cfg, self.kernels = cfg, kernels
        g = torch.Generator(device=device).manual_seed(seed)

        def weight(*shape):  # N(0, 1 / fan_in): activations keep their scale
            w = torch.randn(*shape, device=device, generator=g) / math.sqrt(shape[-1])
            return torch.nn.Parameter(w.to(torch.bfloat16), requires_grad=False)

        def norm():
            w = 1 + 0.1 * torch.randn(cfg.hidden, device=device, generator=g)
            return torch.nn.Parameter(w.to(torch.bfloat16), requires_grad=False)

        qkv = (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim
        self.attn_norm, self.mlp_norm = norm(), norm()
        self.wqkv = weight(qkv, cfg.hidden)
        self.wo = weight(cfg.hidden, cfg.heads * cfg.head_dim)
        # gate and up rows interleaved as gemm_silu_mul takes them (both kernels read it so)
        self.w_gate_up = torch.nn.Parameter(
            ptxdsl.torch.interleave_gate_up(weight(2 * cfg.ffn, cfg.hidden)), requires_grad=False)
        self.w_down = weight(cfg.hidden, cfg.ffn)

    def share_weights(self, other: Block) -> Block:
        """This block with `other`'s weights (one copy on the GPU)."""
        for name, p in other.named_parameters():
            setattr(self, name, p)
        return self

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: Cache | None = None) -> torch.Tensor:
        """x (B, S, hidden) bf16: a prefill at positions 0 .. S - 1 (no cache), or each
        sequence's S newest tokens, which `cache.seqlens` already counts; cos and sin the
        rope tables (a row per position)."""
        c, kn = self.cfg, self.kernels
        b, s, _ = x.shape
        hd, nh, nkv = c.head_dim, c.heads, c.kv_heads
        h = kn.rms_norm(x, self.attn_norm, c.eps)
        qkv = kn.linear(h.view(b * s, c.hidden), self.wqkv).view(b, s, nh + 2 * nkv, hd)
        q, k, v = qkv.split([nh, nkv, nkv], dim=2)
        if cache is None:
            cos, sin = cos[:s], sin[:s]
        else:  # each sequence at its own length (out of the table only past a bad length)
            at = new_positions(cache, s).clamp(0, cos.shape[0] - 1)  # as the ops clamp
            cos, sin = cos[at], sin[at]
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if cache is not None:
            kn.append(k, v, cache)
        if cache is not None and s <= MAX_NEW:
            o = kn.decode(q, cache)
        else:  # a prefill: within x
            o = kn.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            o = o.transpose(1, 2)
        o = o.reshape(b * s, nh * hd)
        x = kn.linear(o, self.wo, x.reshape(b * s, c.hidden))
        h = kn.rms_norm(x, self.mlp_norm, c.eps)
        return kn.linear(kn.gate_up(h, self.w_gate_up), self.w_down, x).view(b, s, c.hidden)


def max_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| over max |want|."""
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


def history(cfg: Config, lengths: list[int], max_len: int, page_size: int = 64,
            seed: int = 0) -> tuple[PagedKVCache, KVCache]:
    """The same random history of each sequence's first lengths[b] - 1 keys in a paged cache
    (ptxdsl's) and a contiguous one (PyTorch's), lengths[b] counting one new token each."""
    ref = KVCache.empty(cfg, len(lengths), max_len)
    g = torch.Generator(device="cuda").manual_seed(seed)
    ref.k.normal_(generator=g)
    ref.v.normal_(generator=g)
    ref.seqlens.copy_(torch.tensor(lengths, dtype=torch.int32))
    return PagedKVCache.of(ref, page_size, seed), ref


def main() -> None:
    cfg = Config()
    ours = Block(cfg)
    ref = Block(cfg, TORCH).share_weights(ours)
    cos, sin = rope_tables(cfg, 4096)
    x = torch.randn(2, 1000, cfg.hidden, device="cuda").to(torch.bfloat16)
    print(f"prefill 2 x 1000: max error {max_error(ours(x, cos, sin), ref(x, cos, sin)):.2e}")
    lengths = [700, 1, 4096, 2500, 33, 1000, 64, 129]
    cache, ref_cache = history(cfg, lengths, 4096)
    x = torch.randn(8, 1, cfg.hidden, device="cuda").to(torch.bfloat16)
    err = max_error(ours(x, cos, sin, cache), ref(x, cos, sin, ref_cache))
    print(f"decode 8 x 1 at lengths {lengths} (pages of 64): max error {err:.2e}")
    compiled = torch.compile(ours, fullgraph=True)
    err = max_error(compiled(x, cos, sin, cache), ours(x, cos, sin, cache))
    print(f"compiled (fullgraph) decode against eager ptxdsl: max error {err:.2e}")


if __name__ == "__main__":
    main()
