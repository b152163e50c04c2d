"""Several GPUs in one interpreter run: `run_ranks` launches a kernel once per rank, as each
process of a multi-GPU job launches it on its own GPU, and runs all those CTAs over one
global memory, so kernels that signal each other through peer memory (flags released by one
rank and spun on by another, tensor copies into another rank's buffer) can be checked on a
CPU with 2, 4 or 8 ranks."""

from __future__ import annotations

import random
from collections.abc import Callable
from math import prod
from typing import Any

import numpy as np

from ..errors import Diagnostic, LaunchError
from .cta import CTA
from .gorder import GridOrder, communicates
from .gwrites import GlobalWrites
from .memory import GlobalMemory
from .run import DEFAULT_MAX_STEPS, bind, grid_dims, launch_order, prefixed, prepare, run_parked


def run_ranks(kernel: Any, grid: int | tuple[int, ...], args_per_rank: list[dict[str, Any]], *,
              seed: int = 0, max_steps: int = DEFAULT_MAX_STEPS, arch: str | None = None) -> None:
    """Run one launch of `kernel` per rank, all at once, over one global memory: rank r
    launches `grid` CTAs with `args_per_rank[r]`, a dict exactly as `run` takes it.

    Memory: a numpy array passed to several ranks (or as several parameters) is one region
    that every rank reads and writes, in place, as peer memory is; so is the array of
    several `TensorMapModel`s. A view of an array (`stacked[r]`) is a region of its own,
    bounds-checked on its own, over the same bytes: writes through it land in `stacked`
    and are seen through every other view. Each pointer argument must be C-contiguous.
    When the kernel has atomics or ordered accesses, a plain load or store of a byte that
    another CTA (of any rank) stored must follow an acquire of a release of that CTA's after
    the store, or it is a race (`gorder.py`, as within one grid); whatever the kernel, two
    CTAs (of one rank or two) storing the same element must be so ordered (`gwrites.py`).

    Scheduling: the CTAs of every rank go through one scheduler (`run.run_parked`): those
    of rank 0 in launch order, then rank 1's, and so on for seed 0; shuffled across ranks
    by other seeds. A CTA spinning on global memory (`while ld_acquire(flag[i], sys) != v
    {}`) is set aside until some CTA of any rank writes global memory. When only such CTAs
    are left, InterpError("deadlock") lists each of them, its diagnostics starting with
    "rank r: "; so does every other error found in a CTA of rank r. Each rank's CTAs draw
    their interleaving from their own stream (rank 0's, under seed 0, as `run`'s).

    Refused with LaunchError: a kernel with clusters (a cluster runs to its end and cannot
    be set aside while it waits for another rank), and arguments that do not fit the
    kernel, every problem of every rank reported at once, each starting with "rank r: ".
    """
    k, prog = prepare(kernel, arch)
    cl = k.cluster if k.cluster is not None else (1, 1, 1)
    if prod(cl) > 1:
        raise LaunchError(Diagnostic(
            f"run_ranks cannot run kernel '{k.name}': it has clusters of {prod(cl)} CTAs "
            f"{cl}, and the interpreter runs each cluster to its end, so a cluster spinning on "
            "a flag another rank writes would never let that rank run", k.loc))
    dims = grid_dims(grid)
    if not isinstance(args_per_rank, (list, tuple)) or not args_per_rank:
        raise LaunchError("run_ranks takes a non-empty list of argument dicts, one per rank, "
                          f"got {_describe(args_per_rank)}")
    gmem = GlobalMemory()
    place = _shared_placement(gmem)
    params: list[list[Any]] = []
    problems: list[Diagnostic] = []
    for r, args in enumerate(args_per_rank):
        if not isinstance(args, dict):
            problems.append(Diagnostic(f"rank {r}: the arguments must be a dict of parameter "
                                       f"values, got {type(args).__name__}"))
            continue
        try:
            params.append(bind(k, args, place))
        except LaunchError as e:
            problems += [prefixed(f"rank {r}: ", d) for d in e.diagnostics]
    if problems:
        raise LaunchError(problems)
    world = len(params)
    launches = [(r, ctaid) for r in range(world) for ctaid in launch_order(dims)]
    if seed:  # the ranks' launches are not synchronised: CTAs of all ranks start in any order
        random.Random(seed).shuffle(launches)
    warned: set[int] = set()
    per_rank = prod(dims)
    if world * per_rank > 1:  # stores of one element by two CTAs race (gwrites.py)
        gmem.writes = GlobalWrites(per_rank)
    if communicates(k):  # plain accesses across ranks follow releases (gorder.py)
        gmem.order = GridOrder(world * per_rank, k.nthreads + sum(
            max(n, 1) for _, n in prog.barriers))
    run_parked((f"rank {r}: ", CTA(prog, ctaid, dims, gmem, params[r], seed * world + r,
                                   max_steps, warned,
                                   index=r * per_rank + ctaid[0] + dims[0] * (
                                       ctaid[1] + dims[1] * ctaid[2])))
               for r, ctaid in launches)


def _shared_placement(gmem: GlobalMemory) -> Callable[[str, np.ndarray], int]:
    """`bind`'s `place` for launches that share `gmem`: an array object seen before gets
    the address it got then, so every rank reaches the same region."""
    # Keeping each array alive keeps its id from being reused by another object.
    placed: dict[int, tuple[np.ndarray, int]] = {}

    def place(name: str, array: np.ndarray) -> int:
        hit = placed.get(id(array))
        if hit is None:
            hit = placed[id(array)] = (array, gmem.add(name, array))
        return hit[1]

    return place


def _describe(v: Any) -> str:
    return "an empty list" if isinstance(v, (list, tuple)) else type(v).__name__
