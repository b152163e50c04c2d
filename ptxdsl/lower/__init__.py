"""Lowering: every step between the IR that the frontends build and the PTX emitter.

`PASSES` lists them in order for each target. A rewrite returns the kernel in a smaller IR; a
check reads it and reports. After each step every kernel has run it, and their errors are
raised together (a CompileError); warnings go to the caller.

sm_90a (and sm_90):
  0. turns (`turns.py`): `turn { }` blocks become the named barriers of a rotation among
     their role's warpgroups.
  1. pipelines (`pipelines.py`): pipelines, roles and one-shot async loads (`oneshot.py`)
     become mbarriers, branches and loops, with every arrival and byte count derived; cluster
     pipelines (`multicast.py`) arm and release the stages of their multicast group.
  2. verify (`ptxdsl.verify`): the barrier, copy, memory, cluster and wgmma checks on that
     form, which is the form the emitter prints.
sm_80: 0, 1 and 2, then
  3. sm80 (`sm80.py`): bulk and tensor copies become cp.async, Hopper-only statements drop
     or become their Ampere forms, and barrier arrival counts are re-derived.
  4. verify_sm80 (`ptxdsl.verify.ampere`): arrival counts, waits and the cp.async rules on
     the rewritten form.

`threads.py` evaluates which threads run a statement, for the passes that need to know.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from .. import ir
from ..errors import CompileError, Diagnostic, DiagnosticBag
from ..verify import verify_kernel
from ..verify.ampere import verify_sm80_kernel
from .pipelines import lower_kernel
from .sm80 import lower_sm80_kernel
from .turns import lower_turns


@dataclass(frozen=True)
class Pass:
    """One step: a rewrite returns the kernel's next form, a check (`check`) returns None.
    Either reports its problems to the DiagnosticBag it is given."""

    name: str
    run: Callable[[ir.Kernel, DiagnosticBag], ir.Kernel | None]
    check: bool = False


TURNS = Pass("turns", lower_turns)
PIPELINES = Pass("pipelines", lower_kernel)
VERIFY = Pass("verify", verify_kernel, check=True)
SM80 = Pass("sm80", lower_sm80_kernel)
VERIFY_SM80 = Pass("verify_sm80", verify_sm80_kernel, check=True)

PASSES: dict[str, tuple[Pass, ...]] = {
    "sm_90a": (TURNS, PIPELINES, VERIFY),
    "sm_80": (TURNS, PIPELINES, VERIFY, SM80, VERIFY_SM80),
}


def target(arch: str | None) -> str:
    """The pass list an architecture uses: sm_80's, or Hopper's for every other target."""
    return "sm_80" if arch == "sm_80" else "sm_90a"


def lower(module: ir.Module, arch: str | None = None, *, checks: bool = True,
          warn: Callable[[Diagnostic], None] | None = None) -> ir.Module:
    """The module after every pass of `arch`'s list, checks skipped when `checks` is False
    (the interpreter runs what the verifier would reject, to show it happen). Raises
    CompileError with every error of the first step that has any; `warn` gets each warning
    as its step finishes."""
    for step in PASSES[target(arch)]:
        if step.check and not checks:
            continue
        diags = DiagnosticBag()
        kernels = []
        for k in module.kernels:
            out = step.run(k, diags)
            kernels.append(k if out is None else out)
        diags.raise_if_any(CompileError)
        if warn is not None:
            for d in diags.items:
                if d.severity != "error":
                    warn(d)
        if not step.check:
            module = dataclasses.replace(module, kernels=tuple(kernels))
    return module
