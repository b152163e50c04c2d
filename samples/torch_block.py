"""A Llama-style decoder block in PyTorch whose kernels are ptxdsl ops.

    python samples/torch_block.py           # checks it against eager PyTorch on the GPU

RMSNorm (`torch.ops.ptxdsl.rms_norm`), the fused QKV, output, gate-up and down projections
(`torch.ops.ptxdsl.gemm`, x @ W^T), and causal attention with grouped KV heads
(`torch.ops.ptxdsl.attention`) run ptxdsl's kernels; the rotary embedding, SiLU-and-multiply
and the residual adds stay PyTorch (torch.compile fuses them). The same `Block` runs on
PyTorch's own kernels with `Block(cfg, kernels=TORCH)`: that is the reference, eager or
compiled.

Prefill: `block(x, pos)` with x (B, S, hidden) at positions 0 .. S - 1 attends causally
within x. Decode: `block(x, pos, cache)` with a `KVCache` writes the new keys and values at
positions pos .. pos + S - 1 of the cache and attends to all of it up to there (the causal
mask aligned to the end: a decode step S = 1 sees every cached key)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import ptxdsl.torch  # noqa: F401  (registers torch.ops.ptxdsl)


@dataclass(frozen=True)
class Config:
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    ffn: int = 14336
    eps: float = 1e-5
    rope_theta: float = 500000.0


class Kernels:
    """The three kernels the block calls, ptxdsl's or PyTorch's."""

    def rms_norm(self, x, w, eps):
        return torch.ops.ptxdsl.rms_norm(x, w, eps)

    def linear(self, x, w):
        return torch.ops.ptxdsl.gemm(x, w)

    def attention(self, q, k, v):
        """q (B, H, S, D), k and v (B, KVH, S_kv, D), causal aligned to the end."""
        return torch.ops.ptxdsl.attention(q, k, v, True)


class TorchKernels(Kernels):
    def rms_norm(self, x, w, eps):
        return F.rms_norm(x, (x.shape[-1],), w, eps)

    def linear(self, x, w):
        return F.linear(x, w)

    def attention(self, q, k, v):
        s, skv = q.shape[2], k.shape[2]
        if s == skv or s == 1:  # SDPA's causal mask aligns to the start
            return F.scaled_dot_product_attention(q, k, v, is_causal=s > 1, enable_gqa=True)
        mask = torch.ones(s, skv, dtype=torch.bool, device=q.device).tril(skv - s)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


PTXDSL, TORCH = Kernels(), TorchKernels()


@dataclass
class KVCache:
    """Keys and values of every position so far: (B, KVH, max_len, D) each."""

    k: torch.Tensor
    v: torch.Tensor

    @classmethod
    def empty(cls, cfg: Config, batch: int, max_len: int, device="cuda") -> KVCache:
        shape = (batch, cfg.kv_heads, max_len, cfg.head_dim)
        return cls(torch.zeros(shape, dtype=torch.bfloat16, device=device),
                   torch.zeros(shape, dtype=torch.bfloat16, device=device))


def rope_tables(cfg: Config, max_len: int, device="cuda") -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (max_len, head_dim) of the rotary embedding, f32."""
    inv = cfg.rope_theta ** (-torch.arange(0, cfg.head_dim, 2, device=device) / cfg.head_dim)
    angles = torch.outer(torch.arange(max_len, device=device, dtype=torch.float32), inv)
    angles = torch.cat([angles, angles], -1)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, S, heads, D) rotated by the (S, D) tables, in f32, back to x's dtype."""
    xf = x.float()
    half = x.shape[-1] // 2
    turned = torch.cat([-xf[..., half:], xf[..., :half]], -1)
    return (xf * cos[:, None] + turned * sin[:, None]).to(x.dtype)


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
        self.w_gate_up = weight(2 * cfg.ffn, cfg.hidden)
        self.w_down = weight(cfg.hidden, cfg.ffn)

    def share_weights(self, other: Block) -> Block:
        """This block with `other`'s weights (one copy on the GPU)."""
        for name, p in other.named_parameters():
            setattr(self, name, p)
        return self

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: KVCache | None = None, pos: int = 0) -> torch.Tensor:
        """x (B, S, hidden) bf16 at positions pos .. pos + S - 1; cos and sin the rope tables
        (at least pos + S rows)."""
        c, kn = self.cfg, self.kernels
        b, s, _ = x.shape
        hd, nh, nkv = c.head_dim, c.heads, c.kv_heads
        h = kn.rms_norm(x, self.attn_norm, c.eps)
        qkv = kn.linear(h.view(b * s, c.hidden), self.wqkv).view(b, s, nh + 2 * nkv, hd)
        q, k, v = qkv.split([nh, nkv, nkv], dim=2)
        cos, sin = cos[pos:pos + s], sin[pos:pos + s]
        q, k = rotate(q, cos, sin).transpose(1, 2), rotate(k, cos, sin).transpose(1, 2)
        v = v.transpose(1, 2)
        if cache is not None:
            cache.k[:, :, pos:pos + s] = k
            cache.v[:, :, pos:pos + s] = v
            k, v = cache.k[:, :, :pos + s], cache.v[:, :, :pos + s]
        o = kn.attention(q, k, v).transpose(1, 2).reshape(b * s, nh * hd)
        x = x + kn.linear(o, self.wo).view(b, s, c.hidden)
        h = kn.rms_norm(x, self.mlp_norm, c.eps).view(b * s, c.hidden)
        gate, up = kn.linear(h, self.w_gate_up).chunk(2, dim=-1)
        return x + kn.linear(F.silu(gate) * up, self.w_down).view(b, s, c.hidden)


def max_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| over max |want|."""
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


def main() -> None:
    cfg = Config()
    ours = Block(cfg)
    ref = Block(cfg, TORCH).share_weights(ours)
    cos, sin = rope_tables(cfg, 4096)
    x = torch.randn(2, 1000, cfg.hidden, device="cuda").to(torch.bfloat16)
    print(f"prefill 2 x 1000: max error {max_error(ours(x, cos, sin), ref(x, cos, sin)):.2e}")
    cache, ref_cache = KVCache.empty(cfg, 8, 4096), KVCache.empty(cfg, 8, 4096)
    cache.k[:, :, :700].normal_()  # 700 positions of history, the same in both
    cache.v[:, :, :700].normal_()
    ref_cache.k.copy_(cache.k)
    ref_cache.v.copy_(cache.v)
    x = torch.randn(8, 1, cfg.hidden, device="cuda").to(torch.bfloat16)
    err = max_error(ours(x, cos, sin, cache, 700), ref(x, cos, sin, ref_cache, 700))
    print(f"decode 8 x 1 at position 700: max error {err:.2e}")
    compiled = torch.compile(ours, fullgraph=True)
    err = max_error(compiled(x, cos, sin), ours(x, cos, sin))
    print(f"compiled (fullgraph) against eager ptxdsl: max error {err:.2e}")


if __name__ == "__main__":
    main()
