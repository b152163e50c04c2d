"""Entry points: `run` a kernel over a grid on numpy arrays, `run_sample` on the dict that a
sample's `example(rng)` returns; and the pieces `ranks.run_ranks` shares with them (checking
the kernel, binding arguments, the scheduler that sets spinning CTAs aside)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from math import prod
from typing import Any

import numpy as np

from .. import ir
from .. import types as T
from ..errors import Diagnostic, LaunchError
from ..lower import lower
from ..runtime.dtypes import compatible, ml_float, scalar_of
from ..target import target
from . import scalar
from .cluster import Cluster
from .cta import CTA
from .errors import InterpError
from .gorder import GridOrder, communicates
from .gwrites import GlobalWrites
from .memory import GlobalMemory
from .program import Program
from .tensormap import TensorMapModel, short_box_message, short_boxes

DEFAULT_MAX_STEPS = 1_000_000

_programs: dict[tuple[int, str | None], tuple[ir.Kernel, Program]] = {}


def run(kernel: Any, grid: int | tuple[int, ...], args: dict[str, Any], *, seed: int = 0,
        max_steps: int = DEFAULT_MAX_STEPS, arch: str | None = None) -> None:
    """Run `kernel` (an ir.Kernel, or a @ptxdsl.kernel / one-kernel module) over `grid` CTAs.

    `args` maps every parameter name to its value: a numpy array for a `ptr<T>` (written in
    place), a `TensorMapModel` for a `tmap<T, rank>`, a Python number for a scalar. CTAs run
    one after another, in launch order for seed 0 and shuffled by other seeds (one spinning
    on global memory for another CTA is set aside until global memory changes: `run_grid`),
    or, when they talk through global memory (atomics, flags), interleaved, with plain
    global accesses checked against the atomics' release/acquire orders (`gorder.py`); two
    CTAs' stores to the same element race unless such an order (or, in a cluster, the
    cluster barrier) puts one after the other (`gwrites.py`);
    inside a CTA the threads and the asynchronous copies interleave in an order drawn from
    `seed` (same seed, same schedule). `max_steps` bounds the work of one CTA. Raises
    InterpError on a deadlock, race, missing fence or other kernel bug, and LaunchError when
    the arguments do not fit the kernel. `arch` names the target the kernel runs as compiled
    for (`ptxdsl.target`; "sm_80": cp.async in place of bulk and tensor copies)."""
    k, prog = prepare(kernel, arch)
    dims = grid_dims(grid)
    gmem = GlobalMemory()
    params = bind(k, args, gmem.add)
    warned: set[int] = set()
    if prod(dims) > 1:
        gmem.writes = GlobalWrites()
    cl = k.cluster if k.cluster is not None else (1, 1, 1)
    if prod(cl) > 1:
        run_clusters(prog, cl, dims, gmem, params, seed, max_steps, warned)
        return
    run_grid(prog, dims, gmem, params, seed, max_steps, warned)


def prepare(kernel: Any, arch: str | None) -> tuple[ir.Kernel, Program]:
    """The kernel and its compiled program; LaunchError when a CTA cannot get its shared
    memory."""
    k = _kernel_of(kernel)
    prog = _program(k, arch)
    t = target(arch)
    if prog.layout.request_bytes > t.smem_bytes:
        raise LaunchError(Diagnostic(
            f"kernel '{k.name}' needs {prog.layout.request_bytes} bytes of shared memory "
            f"(layout {prog.layout.size} plus alignment slack); a CTA has at most "
            f"{t.smem_bytes} on {t.name}", k.loc))
    return k, prog


def run_grid(prog: Program, dims: tuple[int, int, int], gmem: GlobalMemory, params: list[Any],
             seed: int, max_steps: int, warned: set[int]) -> None:
    """CTAs one after another, in launch order for seed 0 and in an order drawn from the
    seed otherwise, through `run_parked`; a grid whose CTAs talk through global memory
    (atomics, flags) together, interleaved (`Grid`)."""
    order = launch_order(dims)
    if seed:  # the hardware promises no launch order: other seeds start CTAs shuffled
        random.Random(seed).shuffle(order)
    if len(order) > 1 and communicates(prog.kernel):
        gmem.order = GridOrder(len(order), prog.kernel.nthreads + sum(
            max(n, 1) for _, n in prog.barriers))
        Grid([CTA(prog, ctaid, dims, gmem, params, seed, max_steps, warned)
              for ctaid in order], seed).run()
        return
    run_parked(("", CTA(prog, ctaid, dims, gmem, params, seed, max_steps, warned))
               for ctaid in order)


class Grid:
    """The CTAs of a grid that talk through global memory, run together: each scheduling
    step goes to a CTA with work drawn from a seeded stream, so a semaphore's last CTA, a
    flag's waiter and the partial stores they read interleave in different orders under
    different seeds (`gorder.py` checks which of those orders the kernel guarantees)."""

    def __init__(self, ctas: list[CTA], seed: int):
        self.ctas = ctas
        self.rng = random.Random(seed * 7_927 + 1)

    def run(self) -> None:
        gmem = self.ctas[0].gmem
        busy, wakes = self._busy(), gmem.wakes
        while busy:
            # a write that woke a spinning CTA brings it back, though the others still run
            if not self.rng.choice(busy).step() or gmem.wakes != wakes:
                busy, wakes = self._busy(), gmem.wakes
        live = [c for c in self.ctas if c.live]
        if live:
            raise InterpError("deadlock", [d for c in live for d in c.deadlock().diagnostics])

    def _busy(self) -> list[CTA]:
        return [c for c in self.ctas if c.runnable or c.inflight]


def launch_order(dims: tuple[int, int, int]) -> list[tuple[int, int, int]]:
    """The CTA ids of a grid, x fastest, as the hardware numbers them."""
    return [(x, y, z) for z in range(dims[2]) for y in range(dims[1]) for x in range(dims[0])]


def run_parked(launches: Iterable[tuple[str, CTA | Cluster]]) -> None:
    """Run CTAs (or clusters) one after another, in the order `launches` yields them (a
    generator creates each as it starts). A CTA whose live threads all wait, some of them
    spinning on global memory (a grid semaphore, a flag), is set aside and resumed once
    another CTA writes global memory; when only such CTAs are left, they are deadlocked.
    The string paired with a CTA starts every diagnostic about it ("rank 2: " under
    `run_ranks`, "" otherwise)."""
    parked: list[tuple[str, CTA | Cluster]] = []

    def resume() -> None:
        woken = next((p for p in parked if p[1].runnable or p[1].inflight), None)
        while woken is not None:
            parked.remove(woken)
            if not _advance(*woken):
                parked.append(woken)
            woken = next((p for p in parked if p[1].runnable or p[1].inflight), None)

    for prefix, cta in launches:
        if not _advance(prefix, cta):
            parked.append((prefix, cta))
        resume()
    if parked:
        raise InterpError("deadlock", [prefixed(p, d) for p, c in parked
                                       for d in c.deadlock().diagnostics])


def _advance(prefix: str, cta: CTA | Cluster) -> bool:
    """`cta.advance()`, its errors' diagnostics starting with `prefix`."""
    try:
        return cta.advance()
    except InterpError as e:
        if prefix:  # keep the raising frame: PTXDSL_DEBUG shows where the kernel went wrong
            e.diagnostics = [prefixed(prefix, d) for d in e.diagnostics]
            e.args = (e.render(),)
        raise


def prefixed(prefix: str, d: Diagnostic) -> Diagnostic:
    """`d` with its message after `prefix` ("rank 2: ")."""
    return replace(d, message=prefix + d.message) if prefix else d


def run_clusters(prog: Program, cl: tuple[int, int, int], dims: tuple[int, int, int],
                 gmem: GlobalMemory, params: list[Any], seed: int, max_steps: int,
                 warned: set[int]) -> None:
    """Clusters one after another, through `run_parked` (a cluster spinning on global memory
    waits for another); the CTAs of a cluster together, started in a seeded order some steps
    apart and interleaved (`cluster.Cluster`)."""
    k = prog.kernel
    if any(d % c for d, c in zip(dims, cl, strict=True)):
        raise LaunchError(Diagnostic(f"grid {dims} is not divisible by the cluster shape {cl} "
                                     f"of kernel '{k.name}'", k.loc))
    def clusters() -> Iterator[tuple[str, Any]]:
        for cz in range(0, dims[2], cl[2]):
            for cy in range(0, dims[1], cl[1]):
                for cx in range(0, dims[0], cl[0]):
                    ctas = [CTA(prog, (cx + x, cy + y, cz + z), dims, gmem, params, seed,
                                max_steps, warned, cl)
                            for z in range(cl[2]) for y in range(cl[1]) for x in range(cl[0])]
                    yield "", Cluster(ctas, seed, cx + dims[0] * (cy + dims[1] * cz), k)

    run_parked(clusters())


def run_sample(kernel: Any, example: dict[str, Any], seed: int = 0,
               arch: str | None = None, max_steps: int = DEFAULT_MAX_STEPS
               ) -> dict[str, np.ndarray]:
    """Run the dict a sample's `example(rng)` returns and return its outputs.

    The dict follows `ptxdsl.tools.runner`: "grid", "inputs", "outputs" (templates, poisoned with
    0xFF bytes so unwritten elements show), "tensor_maps" ({param: TensorMapModel options},
    wrapping the array of the same name), and "kernel" to pick one kernel of a module.
    Arrays are copied, so `example` is left as it was. The result holds the outputs and any
    input that `expected` names (updated in place, as a reduction's target is). `max_steps`:
    as `run`'s."""
    k = _kernel_of(kernel, example.get("kernel"))
    copies: dict[int, np.ndarray] = {}  # one copy per array: parameters may share one
    arrays = {n: copies.setdefault(id(v), v.copy()) if isinstance(v, np.ndarray) else v
              for n, v in example.get("inputs", {}).items()}
    outputs = {}
    for n, v in example.get("outputs", {}).items():
        template = np.ascontiguousarray(v)
        outputs[n] = np.full(template.nbytes, 0xFF, np.uint8).view(template.dtype).reshape(
            template.shape)
    arrays.update(outputs)
    types = {p.name: p.type for p in k.params}
    for n, opts in example.get("tensor_maps", {}).items():
        t = types.get(n)
        elem = t.elem if isinstance(t, T.TensorMap) else None
        if opts.get("interleave", "none") != "none":
            raise LaunchError(f"tensor map '{n}': the interpreter models no interleaved layout "
                              f"(interleave={opts['interleave']!r}); ptxdsl run does")
        # l2_promotion is a cache hint only
        opts = {o: v for o, v in opts.items() if o not in ("l2_promotion", "interleave")}
        arrays[n] = TensorMapModel(arrays[n], dtype=elem, **opts)
    run(k, example["grid"], arrays, seed=seed, arch=arch, max_steps=max_steps)
    # inputs a kernel updates in place (a reduction's target) are results too
    updated = {n: getattr(arrays[n], "array", arrays[n]) for n in example.get("expected", {})
               if n in arrays and n not in outputs}
    return {**updated, **outputs}


def _kernel_of(kernel: Any, name: str | None = None) -> ir.Kernel:
    if isinstance(kernel, ir.Module):
        if name is None and len(kernel.kernels) != 1:
            raise LaunchError("this module has several kernels; name one")
        try:
            return kernel.kernel(name)
        except KeyError:
            raise LaunchError(f"the module has no kernel '{name}'") from None
    k = getattr(kernel, "ir", kernel)
    if not isinstance(k, ir.Kernel):
        raise LaunchError(f"expected a kernel, got {type(kernel).__name__}")
    return k


def _program(k: ir.Kernel, arch: str | None = None) -> Program:
    """The kernel with pipelines and roles lowered to the base IR, compiled (cached)."""
    # Keyed by identity: equal kernels from different sources must keep their own spans.
    hit = _programs.get((id(k), arch))
    if hit is None or hit[0] is not k:
        if len(_programs) > 64:
            _programs.clear()
        lowered = lower(ir.Module(kernels=(k,), loc=k.loc), arch, checks=False).kernels[0]
        hit = _programs[(id(k), arch)] = (k, Program(lowered))
    return hit[1]


def grid_dims(grid: int | tuple[int, ...]) -> tuple[int, int, int]:
    """`grid` as (x, y, z); LaunchError unless it is 1 to 3 positive integers."""
    if not isinstance(grid, (int, tuple, list)):
        raise LaunchError(f"grid takes 1 to 3 positive integers, got {grid!r}")
    dims = (grid,) if isinstance(grid, int) else tuple(grid)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, int) and d >= 1 for d in dims):
        raise LaunchError(f"grid takes 1 to 3 positive integers, got {grid!r}")
    return (dims + (1, 1))[:3]  # type: ignore[return-value]


def _holds(elem: T.Scalar, dtype: np.dtype) -> bool:
    """Whether numpy data of `dtype` may stand for elements of `elem`."""
    if dtype == T.numpy_dtype(elem) or (elem == T.bf16 and dtype == np.uint16):
        return True  # bf16 as bfloat16, or as uint16 bit patterns
    try:
        return compatible(elem, scalar_of(dtype))
    except LaunchError:
        return False


def bind(k: ir.Kernel, args: dict[str, Any],
         place: Callable[[str, np.ndarray], int]) -> list[Any]:
    """Parameter values in register form: `place(name, array)` gives the virtual address of
    a pointer argument (`GlobalMemory.add`, or a placement several launches share). Every
    problem with the arguments is reported at once."""
    problems: list[str] = []
    values: list[Any] = []
    for p in k.params:
        t, v = p.type, args.get(p.name)
        if p.name not in args:
            problems.append(f"missing argument '{p.name}' ({t})")
        elif isinstance(t, T.Ptr):
            if not isinstance(v, np.ndarray) or not v.flags.c_contiguous or not v.flags.writeable:
                problems.append(f"argument '{p.name}' ({t}) must be a writable C-contiguous "
                                f"numpy array, got {type(v).__name__}")
            elif not _holds(t.elem, v.dtype):
                problems.append(f"argument '{p.name}' is a {v.dtype} array; {t} needs "
                                f"{T.numpy_dtype(t.elem)}")
            else:
                values.append(place(p.name, v))
                continue
        elif isinstance(t, T.TensorMap):
            if isinstance(v, np.ndarray):  # a twin without its tensor_maps entry, often
                problems.append(f"argument '{p.name}' ({t}) is a numpy array; a tensor map "
                                f"wraps one: TensorMapModel(array, box=...), or the entry "
                                f"\"{p.name}\": {{\"box\": (...)}} of a twin's tensor_maps")
            elif not isinstance(v, TensorMapModel):
                problems.append(f"argument '{p.name}' ({t}) must be a TensorMapModel, got "
                                f"{type(v).__name__}")
            elif v.array.ndim != t.rank or not (compatible(t.elem, v.elem)
                                                or _holds(t.elem, v.array.dtype)):
                problems.append(f"argument '{p.name}' is a rank-{v.array.ndim} map of {v.elem}; "
                                f"{t} needs rank {t.rank} and {t.elem} elements")
            else:
                values.append(v)
                continue
        else:
            assert isinstance(t, T.Scalar)
            value = _scalar_arg(p.name, t, v, problems)
            if value is not None:
                values.append(value)
                continue
        values.append(None)
    for name in args:
        if all(p.name != name for p in k.params):
            problems.append(f"kernel '{k.name}' has no parameter '{name}'")
    if problems:
        raise LaunchError([Diagnostic(m) for m in problems])
    short = [Diagnostic(short_box_message(f"tensor map '{p.name}'", v, s), s.loc)
             for p, v in zip(k.params, values, strict=True) if isinstance(v, TensorMapModel)
             for s in short_boxes(k, p.name, v)]
    if short:
        raise LaunchError(short)
    return values


def _scalar_arg(name: str, t: T.Scalar, v: Any, problems: list[str]) -> Any:
    if t.is_pred:
        if isinstance(v, (bool, np.bool_)):
            return bool(v)
    elif t.is_float:
        ml_number = isinstance(v, np.generic) and ml_float(v.dtype)  # ml_dtypes' bf16 / fp8
        if ml_number or isinstance(v, (int, float, np.integer, np.floating)) and \
                not isinstance(v, bool):
            return scalar.normaliser(t)(float(v))
    elif isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
        lo, hi = scalar.int_range(t)
        if t.kind == "b":
            lo = -(1 << (t.nbits - 1))  # bit types take either signedness
        if lo <= int(v) <= hi:
            return scalar.wrapper(t)(int(v))
        problems.append(f"argument '{name}' = {v} does not fit in {t} (range [{lo}, {hi}])")
        return None
    problems.append(f"argument '{name}' ({t}) must be a {'bool' if t.is_pred else 'number'}, "
                    f"got {type(v).__name__}")
    return None
