"""ptxdsl kernels as PyTorch custom ops (needs torch; `import ptxdsl` never imports it).

    import ptxdsl.torch                       # registers the ops
    c = torch.ops.ptxdsl.gemm(a, b)           # bf16 a (M x K) @ b (N x K)^T
    y = torch.ops.ptxdsl.rms_norm(x, w, 1e-5)
    c = torch.ops.ptxdsl.scaled_mm_fp8(a8, b8, sa, sb)   # e4m3 in, bf16 sa * sb * a8 @ b8^T
    y = torch.ops.ptxdsl.layer_norm(x, w, b, 1e-5)
    p = torch.ops.ptxdsl.softmax(x)           # over the last dimension
    o = torch.ops.ptxdsl.attention(q, k, v, causal=True)  # bf16 (B, H, S, D), GQA, KV cache
    o.backward(do)                            # ptxdsl's backward kernels (attention_backward)
    o = torch.ops.ptxdsl.attention_fp8(q8, k8, v8, qd, kd, vd, causal=True)  # e4m3, descales
    o = torch.ops.ptxdsl.decode_attention(q, k_cache, v_cache, lens, block_table)  # split-KV
    torch.ops.ptxdsl.kv_append(k_new, v_new, k_cache, v_cache, lens, block_table)  # in place
    c = torch.ops.ptxdsl.grouped_mm(a, b, offs)  # experts: a (T x K), b (E x N x K), int32 ends

All work under torch.compile(fullgraph=True) and CUDA graph capture. Each launch config is
autotuned per shape on first use and cached on disk (see ptxdsl.tools.autotune for the switches).
"""

from .attention import attention
from .attention_fp8 import attention_fp8
from .decode import decode_attention
from .fp8 import scaled_mm_fp8
from .gemm import gemm
from .grouped import grouped_mm
from .kv_append import kv_append
from .norms import layer_norm, rms_norm, softmax

__all__ = ["attention", "attention_fp8", "decode_attention", "gemm", "grouped_mm", "kv_append",
           "layer_norm", "rms_norm", "scaled_mm_fp8", "softmax"]
