"""Kernel recipes, and building many at once in worker processes.

A `Recipe` names a kernel factory of a module (a family of the kernel library,
`ptxdsl.kernels.gemm`; or a Python file by path, such as a user's twin) and its keyword
arguments. It is plain data, so another process can build it; `build()` gives its KernelDef,
one per recipe per process. `precompile(recipes)` builds the recipes not built yet in worker
processes: each traces its kernels, emits their PTX and assembles their cubins (nvJitLink),
and sends them back; this process adopts them (the KernelDefs with their PTX, the cubins in
the in-memory compile cache; the workers write the disk cache as a build here would). The
builds of a batch overlap; what tuning costs beyond them (loading and timing each candidate)
does not change.

Workers are interpreters running `ptxdsl.tools.precompile._main` (not multiprocessing: that would
re-import the caller's `__main__`), started on first use and kept until this process exits,
so their imports are paid once; the cache settings of the environment go with every batch.
They import ptxdsl and the factories' modules, never torch, and touch no GPU.
`PTXDSL_COMPILE_WORKERS` sets how many (default: the CPU count, at most one per recipe); 0 or
1, or fewer than MIN_RECIPES recipes, builds in this process. A recipe that fails in a worker
is left unbuilt (and every recipe, if the workers fail): building it here raises the error
where the caller can see it."""

from __future__ import annotations

import atexit
import importlib
import os
import pickle
import struct
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from ..compiler import KernelDef, compile_module
from ..kernelinfo import PtxModule
from ..runtime.compile import ptx_to_cubin, remember
from .runner import import_twin

_ROOT = Path(__file__).resolve().parents[2]  # the directory holding the ptxdsl package
_built: dict[Recipe, KernelDef] = {}
_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class Recipe:
    """`<module>.<factory>(**kwargs)`: a kernel that any process can build."""

    module: str  # a module name (ptxdsl.kernels.gemm), or the path of a Python file (x.py)
    factory: str
    kwargs: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, module: str | Path, factory: str, **kwargs: Any) -> Recipe:
        return cls(str(module), factory, tuple(sorted(kwargs.items())))

    def build(self) -> KernelDef:
        with _lock:
            kd = _built.get(self)
        if kd is None:
            kd = getattr(_module(self.module), self.factory)(**dict(self.kwargs))
            with _lock:
                kd = _built.setdefault(self, kd)
        return kd

    def built(self) -> bool:
        with _lock:
            return self in _built


def _module(name: str) -> ModuleType:
    """The module a recipe names: imported by name, or a .py file by path (once either way)."""
    if name.endswith(".py"):
        return import_twin(name)
    return importlib.import_module(name)


MIN_RECIPES = 3  # fewer are built here: a round trip to the workers costs about one build


def workers(count: int) -> int:
    """How many processes build `count` recipes (0: build them here)."""
    env = os.environ.get("PTXDSL_COMPILE_WORKERS")
    n = int(env) if env and env.isdigit() else (os.cpu_count() or 1)
    return min(n, count) if count >= MIN_RECIPES and n > 1 else 0


# (IR, PTX, cubin or None where only the assembly failed) or an error
Result = tuple[Any, PtxModule, tuple[bytes, str] | None] | str
# what the workers read from the environment, sent with every batch (it may have changed)
_ENV = ("PTXDSL_CACHE", "PTXDSL_CACHE_DIR")


def _build_here(recipe: Recipe) -> Result:
    try:
        kd = recipe.build()
        ptx = compile_module(kd.module)
    except Exception as e:  # reported to the parent, which builds it again to raise
        return f"{type(e).__name__}: {e}"
    try:
        cubin: tuple[bytes, str] | None = ptx_to_cubin(ptx.ptx, ptx.arch,
                                                       [k.name for k in ptx.kernels])
    except Exception:  # the parent assembles it again, and raises there
        cubin = None
    return kd.ir, ptx, cubin


def _send(stream: Any, obj: Any) -> None:
    data = pickle.dumps(obj)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _receive(stream: Any) -> Any:
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("the worker closed its pipe")
    (size,) = struct.unpack("<Q", head)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the worker closed its pipe mid-message")
    return pickle.loads(data)


class _Pool:
    """Worker processes kept for the life of this one: each started once (its imports paid
    once), then sent batches of recipes over its stdin, answering on its stdout."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []
        self.lock = threading.Lock()
        atexit.register(self.close)

    def _grow(self, n: int) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        while len(self.procs) < n:
            self.procs.append(subprocess.Popen(
                [sys.executable, "-c", "from ptxdsl.tools.precompile import _main; _main()"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                env=env))

    def run(self, batches: list[list[Recipe]]) -> list[list[Result]]:
        env = {k: os.environ.get(k) for k in _ENV}
        with self.lock:
            self._grow(len(batches))
            procs = self.procs[:len(batches)]
            try:
                for proc, batch in zip(procs, batches, strict=True):
                    _send(proc.stdin, (env, batch))
                return [_receive(proc.stdout) for proc in procs]
            except BaseException:
                self.close(kill=True)  # a worker died or is out of step: start afresh
                raise

    def close(self, kill: bool = False) -> None:
        """End the workers: at exit, by closing their input; after a failure, at once."""
        for proc in self.procs:
            if kill:
                proc.kill()
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        self.procs = []


_pool = _Pool()


def precompile(recipes: Sequence[Recipe]) -> dict[Recipe, str]:
    """Build the recipes not built yet, in worker processes, and adopt what they return.
    Returns the errors of the recipes that failed (they stay unbuilt)."""
    todo = list(dict.fromkeys(r for r in recipes if not r.built()))
    n = workers(len(todo))
    if n <= 1:
        return {}
    batches = [todo[i::n] for i in range(n)]
    try:
        outcomes = _pool.run(batches)
    except Exception as e:  # the workers failed: the caller builds everything here
        return {r: f"{type(e).__name__}: {e}" for r in todo}
    errors: dict[Recipe, str] = {}
    for batch, results in zip(batches, outcomes, strict=True):
        for recipe, result in zip(batch, results, strict=True):
            if isinstance(result, str):
                errors[recipe] = result
                continue
            kernel_ir, ptx, cubin = result
            kd = KernelDef(kernel_ir)
            kd.adopt(ptx)
            if cubin is not None:
                remember(ptx.ptx, ptx.arch, cubin)
            with _lock:
                _built.setdefault(recipe, kd)
    return errors


def _main() -> None:
    """A worker: build each batch that arrives on stdin, answer on stdout, until EOF. The
    answers go to a copy of stdout; stdout itself is pointed at stderr, so that a factory
    that prints cannot break the messages."""
    inp = sys.stdin.buffer
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    while True:
        try:
            env, batch = _receive(inp)
        except EOFError:
            return
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _send(out, [_build_here(r) for r in batch])
