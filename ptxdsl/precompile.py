"""Kernel recipes, and building many at once in worker processes.

A `Recipe` names a kernel factory of a Python twin (samples/<x>.py) and its keyword
arguments. It is plain data, so another process can build it; `build()` gives its KernelDef,
one per recipe per process. `precompile(recipes)` builds the recipes not built yet in worker
processes: each traces its kernels, emits their PTX and assembles their cubins (nvJitLink),
and sends them back; this process adopts them (the KernelDefs with their PTX, the cubins in
the compile cache). Tuning 20 candidates then costs about the slowest of them, not their sum.

Workers are fresh interpreters running `python -m ptxdsl.precompile` (not multiprocessing:
that would re-import the caller's `__main__`). They import ptxdsl and the twin, never torch,
and touch no GPU. `PTXDSL_COMPILE_WORKERS` sets how many (default: the CPU count, at most one
per recipe, two recipes at least); 0 or 1 builds in this process. A recipe that fails in a
worker is left unbuilt: building it here raises the error where the caller can see it."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .compiler import KernelDef, compile_module
from .kernelinfo import PtxModule
from .runner import load_twin
from .runtime.compile import ptx_to_cubin, remember

TIMEOUT_S = 600
_ROOT = Path(__file__).resolve().parents[1]  # the directory holding the ptxdsl package
_built: dict[Recipe, KernelDef] = {}
_twins: dict[str, Any] = {}
_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class Recipe:
    """`<twin>.<factory>(**kwargs)`: a kernel that any process can build."""

    twin: str  # path of the Python twin
    factory: str
    kwargs: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, twin: str | Path, factory: str, **kwargs: Any) -> Recipe:
        return cls(str(twin), factory, tuple(sorted(kwargs.items())))

    def build(self) -> KernelDef:
        with _lock:
            kd = _built.get(self)
        if kd is None:
            twin = _twins.get(self.twin)
            if twin is None:
                twin = _twins.setdefault(self.twin, load_twin(self.twin))
            kd = getattr(twin, self.factory)(**dict(self.kwargs))
            with _lock:
                kd = _built.setdefault(self, kd)
        return kd

    def built(self) -> bool:
        with _lock:
            return self in _built


def workers(count: int) -> int:
    """How many processes build `count` recipes."""
    env = os.environ.get("PTXDSL_COMPILE_WORKERS")
    n = int(env) if env and env.isdigit() else (os.cpu_count() or 1)
    return min(n, count) if count > 1 else 0


Result = tuple[Any, PtxModule, tuple[bytes, str]] | str  # (IR, PTX, cubin) or an error


def _build_here(recipe: Recipe) -> Result:
    try:
        kd = recipe.build()
        ptx = compile_module(kd.module)
        cubin = ptx_to_cubin(ptx.ptx, ptx.arch, [k.name for k in ptx.kernels])
        return kd.ir, ptx, cubin
    except Exception as e:  # reported to the parent, which builds it again to raise
        return f"{type(e).__name__}: {e}"


def _run_worker(batch: list[Recipe]) -> list[Result]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-m", "ptxdsl.precompile"], input=pickle.dumps(batch),
                          capture_output=True, env=env, timeout=TIMEOUT_S, check=False)
    if proc.returncode != 0:
        return [f"worker exited {proc.returncode}: {proc.stderr.decode()[-500:]}"] * len(batch)
    results: list[Result] = pickle.loads(proc.stdout)
    return results


def precompile(recipes: Sequence[Recipe]) -> dict[Recipe, str]:
    """Build the recipes not built yet, in worker processes, and adopt what they return.
    Returns the errors of the recipes that failed (they stay unbuilt)."""
    todo = list(dict.fromkeys(r for r in recipes if not r.built()))
    n = workers(len(todo))
    if n <= 1:
        return {}
    batches = [todo[i::n] for i in range(n)]
    errors: dict[Recipe, str] = {}
    with ThreadPoolExecutor(n) as pool:
        try:
            outcomes = list(pool.map(_run_worker, batches))
        except (OSError, subprocess.SubprocessError) as e:
            return {r: f"{type(e).__name__}: {e}" for r in todo}
    for batch, results in zip(batches, outcomes, strict=True):
        for recipe, result in zip(batch, results, strict=True):
            if isinstance(result, str):
                errors[recipe] = result
                continue
            kernel_ir, ptx, cubin = result
            kd = KernelDef(kernel_ir)
            kd.adopt(ptx)
            remember(ptx.ptx, ptx.arch, cubin)
            with _lock:
                _built.setdefault(recipe, kd)
    return errors


def _main() -> None:
    batch: list[Recipe] = pickle.loads(sys.stdin.buffer.read())
    results = [_build_here(r) for r in batch]
    sys.stdout.buffer.write(pickle.dumps(results))


if __name__ == "__main__":
    _main()
