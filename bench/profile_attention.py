"""One-shot attention launches for a profiler: a warm-up launch and a measured one of the
sample kernel, then cuDNN's SDPA once.

    ncu --kernel-name regex:attention ... python -m bench.profile_attention D S [--causal]"""

from __future__ import annotations

import argparse

from .attention import HEADS, TOKENS, launcher
from .common import twin


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_attention", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ds", type=int, nargs="*", default=[128, 8192], help="D S")
    ap.add_argument("--causal", action="store_true")
    a = ap.parse_args(argv)
    if len(a.ds) != 2:
        ap.error("give D S")
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    d, s = a.ds
    b = TOKENS // s
    q, k, v = (torch.randn(b, HEADS, s, d, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    o = torch.empty_like(q)
    lse = torch.empty(b, HEADS, s, device="cuda", dtype=torch.float32)
    launch = launcher(twin("attention").make_attention(d, a.causal), q, k, v, o, lse)
    launch()
    launch()
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        F.scaled_dot_product_attention(q, k, v, is_causal=a.causal)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
