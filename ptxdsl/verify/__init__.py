"""Static checks on IR that need the whole kernel (run on every compile; `ptxdsl check`).

Every problem is reported at once, each located, with notes at the related sites. The checks
share one `Facts` per kernel: its shared-memory layout, a `Trace` of which threads run each
statement with the values of its operands (`threads.py`, `values.py`, whose unknown integers
carry the ranges and congruences of `absint.py`), and loops re-run iteration by iteration
where widening loses a ring's rotation (`unroll.py`); each check is a function in `CHECKS`.
What a check cannot decide is a warning or nothing, never an error.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import ir
from ..errors import CompileError, Diagnostic, DiagnosticBag
from ..target import Target, target
from .barriers import (
    check_arrival_counts,
    check_init_visibility,
    check_stage_rotation,
    check_waits,
)
from .cluster import check_clusters
from .copies import check_asm_reductions, check_bulk_stores, check_issuers
from .counts import check_phase_counts
from .expect_tx import check_expect_tx
from .facts import Facts, Report
from .flags import check_relaxed_counters, check_relaxed_flags, check_release_before_barrier
from .memory import check_alignment, check_smem_budget, check_tma_boxes
from .named import check_named_counts
from .order import check_inval, check_stage_order
from .overlap import check_tile_overlap
from .phases import check_early_waits
from .registers import check_register_arrays, check_register_indices
from .rings import check_indices, check_ring_phases
from .sm80 import check_cp_async
from .wgmma import (
    check_wgmma_hazards,
    check_wgmma_issuers,
    check_wgmma_operands,
)

# Role and setmaxnreg checks (legal register counts, their sum within the register file,
# every warp of a warpgroup in one role) go here as one more function: they read `Role` and
# `SetMaxNReg` statements from `facts.kernel` and the role of each thread from the trace.
CHECKS: tuple[Callable[[Facts, Report], None], ...] = (
    check_smem_budget,
    check_alignment,
    check_tma_boxes,
    check_expect_tx,
    check_init_visibility,
    check_arrival_counts,
    check_waits,
    check_stage_rotation,
    check_indices,
    check_ring_phases,
    check_early_waits,
    check_phase_counts,
    check_stage_order,
    check_inval,
    check_issuers,
    check_bulk_stores,
    check_tile_overlap,
    check_asm_reductions,
    check_relaxed_flags,
    check_relaxed_counters,
    check_release_before_barrier,
    check_cp_async,
    check_clusters,
    check_named_counts,
    check_register_indices,
    check_wgmma_hazards, check_wgmma_issuers, check_wgmma_operands, check_register_arrays,
)


def verify_kernel(k: ir.Kernel, diags: DiagnosticBag, t: Target) -> None:
    """Append every problem found in `k`, compiled for `t`, to `diags` (errors and warnings)."""
    facts = Facts(k, t)
    report = Report(diags)
    for check in CHECKS:
        check(facts, report)


def verify_module(m: ir.Module, arch: Target | str | None = None) -> list[Diagnostic]:
    """Raise CompileError with every error of every kernel compiled for `arch` (a Target or
    its name; None: the default compile's); return the warnings."""
    diags = DiagnosticBag()
    for k in m.kernels:
        verify_kernel(k, diags, target(arch))
    diags.raise_if_any(CompileError)
    return [d for d in diags.items if d.severity != "error"]
