"""Run norm kernels once each at full size (16384 x 8192), for `ncu` to profile.

    python -m bench.profile_norm SPEC [SPEC ...]

SPEC is kind:dtype:impl[:key=value,...], impl one of
  row     the one-row-per-CTA form (ptxdsl/kernels/norms.py make_norm_row; keys warps, minctas),
          one CTA per row;
  tma     the TMA ring form (make_norm; keys stages, warps), every CTA resident;
  triton  the one-row-per-program Triton kernels of bench/refs.py (key warps).
The ptxdsl kernels are named prof_<kind>_<dtype>_<impl>_..., Triton's rms, smax and lnorm:
`ncu -k regex:'prof_|rms|smax|lnorm'` selects them all."""

from __future__ import annotations

import argparse

from . import refs
from .common import resident

ROWS, N = 16384, 8192


def run(spec: str) -> None:
    import torch

    import ptxdsl
    from ptxdsl.kernels import norms

    kind, dt, impl, *rest = spec.split(":")
    opts = {k: int(v) for k, v in (kv.split("=") for kv in rest[0].split(","))} if rest else {}
    tdt = {"bf16": torch.bfloat16, "f32": torch.float32}[dt]
    x = torch.randn(ROWS, N, device="cuda").to(tdt)
    w = torch.ones(N, device="cuda", dtype=tdt)
    b = torch.zeros_like(w)
    y = torch.empty_like(x)
    if impl == "triton":
        refs.triton_norms()(kind, x, w, b, y, 1e-5, opts.get("warps", 16))
        torch.cuda.synchronize()
        return
    dtype = ptxdsl.types.SCALARS[dt]
    name = f"prof_{kind}_{dt}_{impl}_" + "_".join(f"{k}{v}" for k, v in opts.items())
    if impl == "tma":
        kd = norms.make_norm(kind, N, dtype, opts.get("stages", 3), opts.get("warps", 8),
                             name=name)
    elif impl == "row":
        kd = norms.make_norm_row(kind, N, dtype, opts.get("warps", 8), name=name,
                                 minctas=opts.get("minctas"))
    else:
        raise SystemExit(f"unknown impl {impl!r}: row, tma or triton")
    k = kd.program().kernel()
    grid = ROWS if impl == "row" else resident(k)
    args = {"rmsnorm": (x, w, y, ROWS), "softmax": (x, y, ROWS),
            "layernorm": (x, w, b, y, ROWS)}[kind]
    k[grid](*args)
    torch.cuda.synchronize()
    print(f"{name}: grid {grid}", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_norm", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("spec", nargs="*", default=["rmsnorm:bf16:row"],
                    help="kind:dtype:impl[:key=value,...]")
    for s in ap.parse_args(argv).spec:
        run(s)


if __name__ == "__main__":
    main()
