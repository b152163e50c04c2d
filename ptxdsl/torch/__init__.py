"""ptxdsl kernels as PyTorch custom ops (needs torch; `import ptxdsl` never imports it).

    import ptxdsl.torch                       # registers the ops
    c = torch.ops.ptxdsl.gemm(a, b)           # bf16 a (M x K) @ b (N x K)^T
    y = torch.ops.ptxdsl.rms_norm(x, w, 1e-5)

Both work under torch.compile(fullgraph=True) and CUDA graph capture. Each launch config is
autotuned per shape on first use and cached on disk (see ptxdsl.autotune for the switches).
"""

from .gemm import gemm
from .norms import rms_norm

__all__ = ["gemm", "rms_norm"]
