"""Grid dependency control (programmatic dependent launch, sm_90): a kernel launched right
after another on a stream may start before that one ends, when it waits for it itself.

`griddep_wait()` waits until the grids this launch depends on have completed and their
memory is visible; a kernel that uses it is launched with programmatic stream serialization
(KernelInfo.pdl, derived), so its CTAs may be scheduled early, up to the wait.
`griddep_launch_dependents()` lets the next such kernel be scheduled once every CTA of this
grid has issued it (or exited). Both are no-ops without programmatic launch, and dropped on
sm_80.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .core import Op


@dataclass(frozen=True, slots=True, kw_only=True)
class GridDepWait(Op):
    """`griddepcontrol.wait`: wait for the grids this one depends on, and their memory."""

    syntax: ClassVar[str] = "griddep_wait"


@dataclass(frozen=True, slots=True, kw_only=True)
class GridDepLaunch(Op):
    """`griddepcontrol.launch_dependents`: the next grid may be scheduled (a hint; the first
    issue in a CTA counts)."""

    syntax: ClassVar[str] = "griddep_launch_dependents"


__all__ = ["GridDepLaunch", "GridDepWait"]
