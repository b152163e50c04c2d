"""ptxdsl kernels as PyTorch custom ops (needs torch; `import ptxdsl` never imports it).

    import ptxdsl.torch                       # registers the ops
    c = torch.ops.ptxdsl.gemm(a, b)           # bf16 a (M x K) @ b (N x K)^T
    c = torch.ops.ptxdsl.gemm(a, b, r)        # ... + r (M x N), fused at decode
    y = torch.ops.ptxdsl.gemm_silu_mul(a, interleave_gate_up(w_gate_up))  # silu(gate) * up
    y = torch.ops.ptxdsl.rms_norm(x, w, 1e-5)
    c = torch.ops.ptxdsl.scaled_mm_fp8(a8, b8, sa, sb)   # e4m3 in, bf16 sa * sb * a8 @ b8^T
    c = torch.ops.ptxdsl.scaled_mm_fp8_block(a8, b8, sa, sb)  # 1 x 128 / 128 x 128 scales
    y = torch.ops.ptxdsl.layer_norm(x, w, b, 1e-5)
    p = torch.ops.ptxdsl.softmax(x)           # over the last dimension
    o = torch.ops.ptxdsl.attention(q, k, v, causal=True)  # bf16 (B, H, S, D), GQA, KV cache
    o.backward(do)                            # ptxdsl's backward kernels (attention_backward)
    o = torch.ops.ptxdsl.attention_fp8(q8, k8, v8, qd, kd, vd, causal=True)  # e4m3, descales
    o = torch.ops.ptxdsl.decode_attention(q, k_cache, v_cache, lens, block_table)  # split-KV
    torch.ops.ptxdsl.kv_append(k_new, v_new, k_cache, v_cache, lens, block_table)  # in place
    c = torch.ops.ptxdsl.grouped_mm(a, b, offs)  # experts: a (T x K), b (E x N x K), int32 ends
    c = torch.ops.ptxdsl.grouped_mm_fp8(a8, b8, sa, sb, offs)  # e4m3, DeepGEMM's block scales
    c = torch.ops.ptxdsl.grouped_mm_fp8_masked(a8, b8, sa, sb, counts)  # a8 (E x C x K)

All work under torch.compile(fullgraph=True) and CUDA graph capture; call an op once eagerly
with a signature before capturing it (the first call loads its kernels and tunes them, which a
capture cannot). Each launch config is autotuned per shape on first use and cached on disk (see
ptxdsl.tools.autotune for the switches).
"""

from .attention import attention
from .attention_fp8 import attention_fp8
from .decode import decode_attention
from .fp8 import scaled_mm_fp8, scaled_mm_fp8_block
from .gemm import gemm
from .gemm_silu import gemm_silu_mul, interleave_gate_up
from .grouped import grouped_mm
from .grouped_fp8 import grouped_mm_fp8, grouped_mm_fp8_masked
from .kv_append import kv_append
from .norms import layer_norm, rms_norm, softmax

__all__ = ["attention", "attention_fp8", "decode_attention", "gemm", "gemm_silu_mul",
           "grouped_mm", "grouped_mm_fp8", "grouped_mm_fp8_masked", "interleave_gate_up",
           "kv_append", "layer_norm", "rms_norm", "scaled_mm_fp8", "scaled_mm_fp8_block",
           "softmax"]
