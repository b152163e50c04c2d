"""One-shot GEMM launches for a profiler (`ncu --kernel-name gemm ... python
samples/profile_gemm.py M N K`): a warm-up launch and a measured one of the sample kernel."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gemm import _twin, gemm_launcher  # noqa: E402

m, n, k = (int(x) for x in sys.argv[1:4]) if len(sys.argv) > 3 else (4096, 4096, 4096)
a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
launch = gemm_launcher(_twin().gemm, a, b, c)
launch()
launch()
torch.matmul(a, b.T)
torch.cuda.synchronize()
