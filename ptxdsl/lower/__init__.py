"""Lowering: every step between the IR that the frontends build and PTX, as each target lists
them (`Target.passes`, names of `STEPS`).

A rewrite returns the kernel in a smaller IR; a check reads it and reports. After each step
every kernel has run it, and their errors are raised together (a CompileError); warnings go
to the caller. `watch` sees the module after each step (PTXDSL_DUMP, `--emit ir --after`).

sm_90a (and sm_90):
  1. turns (`turns.py`): `turn { }` blocks become the named barriers of a rotation among
     their role's warpgroups.
  2. pipelines (`pipelines.py`): pipelines, roles and one-shot async loads (`oneshot.py`)
     become mbarriers, branches and loops, with every arrival and byte count derived; cluster
     pipelines (`multicast.py`) arm and release the stages of their multicast group.
  3. verify (`ptxdsl.verify`): the barrier, copy, memory, cluster and wgmma checks on that
     form, which is the form the emitter prints.
  4. emit (`ptxdsl.codegen.ptx`): the module's PTX and each kernel's launch contract.
sm_80: 1, 2 and 3, then
  4. sm80 (`sm80.py`): bulk and tensor copies become cp.async, Hopper-only statements drop
     or become their Ampere forms, and barrier arrival counts are re-derived.
  5. verify_sm80 (`ptxdsl.verify.sm80`): arrival counts, waits and the cp.async rules on
     the rewritten form.
  6. emit.

`threads.py` evaluates which threads run a statement, for the passes that need to know.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from .. import ir
from ..codegen.ptx import emit_module
from ..errors import CompileError, Diagnostic, DiagnosticBag
from ..kernelinfo import PtxModule
from ..target import Target, target
from ..verify import verify_kernel
from ..verify.sm80 import verify_sm80_kernel
from .pipelines import lower_kernel
from .sm80 import lower_sm80_kernel
from .turns import lower_turns

Watch = Callable[[int, str, ir.Module], None]


@dataclass(frozen=True)
class Pass:
    """One IR step: a rewrite returns the kernel's next form, a check (`check`) returns None.
    Either reports its problems to the DiagnosticBag it is given."""

    name: str
    run: Callable[[ir.Kernel, DiagnosticBag, Target], ir.Kernel | None]
    check: bool = False


@dataclass(frozen=True)
class Emit:
    """The last step of every list: the lowered module as PTX (`source_name` for its first
    line, `watchdog_ms` > 0 bounds its waits)."""

    name: str
    run: Callable[[ir.Module, Target, str | None, int], PtxModule]


def _any_target(rewrite: Callable[[ir.Kernel, DiagnosticBag], ir.Kernel | None]
                ) -> Callable[[ir.Kernel, DiagnosticBag, Target], ir.Kernel | None]:
    """A step that is the same for every target that lists it."""
    return lambda k, diags, _target: rewrite(k, diags)


STEPS: dict[str, Pass | Emit] = {s.name: s for s in (
    Pass("turns", _any_target(lower_turns)),
    Pass("pipelines", _any_target(lower_kernel)),
    Pass("verify", verify_kernel, check=True),
    Pass("sm80", lower_sm80_kernel),
    Pass("verify_sm80", verify_sm80_kernel, check=True),
    Emit("emit", emit_module),
)}


def steps(t: Target) -> tuple[Pass | Emit, ...]:
    """The target's list: its IR passes, the emitter last."""
    return tuple(STEPS[name] for name in t.passes)


def lower(module: ir.Module, arch: Target | str | None = None, *, until: str | None = None,
          checks: bool = True, warn: Callable[[Diagnostic], None] | None = None,
          watch: Watch | None = None) -> ir.Module:
    """The module after every IR pass of the list of `arch` (a Target or its name; None: the
    default compile's, see `ptxdsl.target.target`), or after the one named `until`
    (the emitter's name: the module it reads); checks skipped when `checks` is False (the
    interpreter runs what the verifier would reject, to show it happen). Raises CompileError
    with every error of the first step that has any; `warn` gets each warning as its step
    finishes, `watch` the step's place in the list (from 1), its name and the module after it."""
    t = target(arch)
    if until is not None and until not in t.passes:
        raise CompileError(f"no pass named {until!r} for {t.name}; its passes are "
                           f"{', '.join(t.passes)}")
    for index, step in enumerate(steps(t), 1):
        if isinstance(step, Emit):
            break
        if checks or not step.check:
            module = _run(step, module, t, warn)
            if watch is not None:
                watch(index, step.name, module)
        if step.name == until:
            break
    return module


def emit(module: ir.Module, t: Target, source_name: str | None = None,
         watchdog_ms: int = 0) -> PtxModule:
    """The PTX of a module `lower` returned: the last step of the target's list."""
    last = steps(t)[-1]
    assert isinstance(last, Emit), f"{t.name}'s pass list ends with {last.name}"
    return last.run(module, t, source_name, watchdog_ms)


def _run(step: Pass, module: ir.Module, t: Target,
         warn: Callable[[Diagnostic], None] | None) -> ir.Module:
    diags = DiagnosticBag()
    kernels = []
    for k in module.kernels:
        out = step.run(k, diags, t)
        kernels.append(k if out is None else out)
    diags.raise_if_any(CompileError)
    if warn is not None:
        for d in diags.items:
            if d.severity != "error":
                warn(d)
    if step.check:
        return module
    return dataclasses.replace(module, kernels=tuple(kernels))
