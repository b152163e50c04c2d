"""The kernel library: the production kernel families behind the torch ops and benchmarks
(dense, split-K and stream-K GEMM; fp8 GEMMs; grouped GEMM; attention and split-KV decode
attention; norms and softmax; the fused all-gather / reduce-scatter GEMMs). Each family is a
module with `FAMILY` (`ptxdsl.kernels.family.Family`) and a factory that builds its kernel
for a configuration; the `.ptxdsl` text twins ship beside them as package data. Import a
family as a module (`from ptxdsl.kernels import gemm`); `families()` lists them all."""

from __future__ import annotations

import importlib
import pkgutil

from .family import Family

_NOT_FAMILIES = {"family", "wgmma"}  # helpers shared by the families


def families() -> dict[str, Family]:
    """Every family of the library by name, in name order (importing each module once)."""
    out: dict[str, Family] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_") or info.name in _NOT_FAMILIES:
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        fam = getattr(mod, "FAMILY", None)
        if isinstance(fam, Family):
            out[fam.name] = fam
    return out


__all__ = ["Family", "families"]
