"""One-shot GEMM launches for a profiler (`ncu --kernel-name regex:gemm ... python
samples/profile_gemm.py M N K [--cluster]`): a warm-up launch and a measured one of the
sample kernel (or of its 2 x 1 cluster form, which multicasts B)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gemm import _twin, gemm_launcher  # noqa: E402

cluster = 2 if "--cluster" in sys.argv else 1
sizes = [int(x) for x in sys.argv[1:] if x.isdigit()]
m, n, k = sizes if len(sizes) == 3 else (4096, 4096, 4096)
a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
twin = _twin()
kdef = twin.make_gemm(cluster=(2, 1, 1)) if cluster > 1 else twin.gemm
launch = gemm_launcher(kdef, a, b, c, cluster=cluster)
launch()
launch()
torch.matmul(a, b.T)
torch.cuda.synchronize()
