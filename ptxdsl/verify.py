"""Static checks on IR that need the whole kernel (run on every compile; `ptxdsl check`).

Every problem is reported at once, each located, with notes at the related site.
"""

from __future__ import annotations

from . import ir
from .errors import CompileError, Diagnostic, DiagnosticBag


def verify_kernel(k: ir.Kernel, diags: DiagnosticBag) -> None:
    """Append every problem found in `k` to `diags`."""
    _check_smem_budget(k, diags)


def _check_smem_budget(k: ir.Kernel, diags: DiagnosticBag) -> None:
    from .builder import MAX_SMEM_BYTES
    from .codegen.layout import layout_kernel

    layout = layout_kernel(k)
    if layout.request_bytes > MAX_SMEM_BYTES:
        diags.error(f"kernel '{k.name}' needs {layout.request_bytes} bytes of shared memory "
                    f"(layout {layout.size} plus alignment slack); a CTA has at most "
                    f"{MAX_SMEM_BYTES}", k.loc)


def verify_module(m: ir.Module) -> list[Diagnostic]:
    """Raise CompileError with every error of every kernel; return the warnings."""
    diags = DiagnosticBag()
    for k in m.kernels:
        verify_kernel(k, diags)
    diags.raise_if_any(CompileError)
    return [d for d in diags.items if d.severity != "error"]
