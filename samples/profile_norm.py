"""Run one norm kernel once at full size (for `ncu` to profile)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import norms  # noqa: E402

kind = sys.argv[1] if len(sys.argv) > 1 else "rmsnorm"
x = torch.randn(16384, 8192, device="cuda").to(torch.bfloat16)
w = torch.ones(8192, device="cuda", dtype=torch.bfloat16)
b = torch.zeros_like(w)
y = torch.empty_like(x)
k = norms.KERNELS[kind].program().kernel()
args = {"rmsnorm": (x, w, y, 16384), "softmax": (x, y, 16384), "layernorm": (x, w, b, y, 16384)}
k[132 * 3](*args[kind])
torch.cuda.synchronize()
