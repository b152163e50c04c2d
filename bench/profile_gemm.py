"""One-shot GEMM launches for a profiler: a warm-up launch and a measured one of the sample
kernel (or of its 2 x 1 cluster form, which multicasts B, or of its stream-K walk), then
cuBLAS once.

    ncu --kernel-name regex:gemm ... python -m bench.profile_gemm M N K [--cluster | --streamk]"""

from __future__ import annotations

import argparse

from .common import twin
from .gemm import gemm_launcher


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_gemm", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mnk", type=int, nargs="*", default=[4096, 4096, 4096], help="M N K")
    form = ap.add_mutually_exclusive_group()
    form.add_argument("--cluster", action="store_true", help="the 2 x 1 cluster form")
    form.add_argument("--streamk", action="store_true", help="the stream-K walk")
    a = ap.parse_args(argv)
    if len(a.mnk) != 3:
        ap.error("give M N K")
    import torch

    m, n, k = a.mnk
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    t = twin("gemm")
    kdef = (t.make_gemm(cluster=(2, 1, 1)) if a.cluster else
            t.make_gemm(streamk=True) if a.streamk else t.gemm)
    launch = gemm_launcher(kdef, x, y, c, cluster=2 if a.cluster else 1, streamk=a.streamk)
    launch()
    launch()
    torch.matmul(x, y.T)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
