"""What a kernel family of the library says about itself: its name, one line on what it
computes, the factory that builds a kernel for a configuration, the parameters it takes with
their defaults, and the `.ptxdsl` text twin shipped beside it (if it has one).

Each module of `ptxdsl.kernels` that is a family defines `FAMILY = Family(...)`; the registry
(`ptxdsl.kernels.families()`) finds them, and `ptxdsl kernels` lists and builds them."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from ..compiler import KernelDef


@dataclass(frozen=True, slots=True, kw_only=True)
class Family:
    """A kernel family: `factory(**defaults)` builds its default kernel."""

    name: str
    summary: str  # one line: what the kernels compute
    factory: Callable[..., KernelDef]
    defaults: dict[str, Any] = field(default_factory=dict)  # the default build's arguments
    source: str | None = None  # file name of the text twin in ptxdsl/kernels/, e.g. "gemm.ptxdsl"

    def parameters(self) -> dict[str, Any]:
        """The factory's keyword parameters and their defaults (the default build's where it
        names them)."""
        sig = inspect.signature(self.factory)
        out = {n: p.default for n, p in sig.parameters.items()
               if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
        out.update(self.defaults)
        return out

    def build(self, **overrides: Any) -> KernelDef:
        """The kernel of the default configuration, with `overrides` applied."""
        return self.factory(**{**self.defaults, **overrides})

    def source_text(self) -> str | None:
        """The `.ptxdsl` text twin, read from the installed package (works from a wheel)."""
        if self.source is None:
            return None
        return resources.files(__package__).joinpath(self.source).read_text()
