"""How many clusters of a kernel fit on the device at once: the persistent grid of a
cluster kernel (a grid of more clusters runs in waves; a loop over work items then splits
them unevenly); and what a persistent grid's walk asks of a launch: its grid over a tile
space, and for a stream-K walk (`schedule ... streamk`, builder/schedule.py) the shared tiles,
the most parts one is cut into and the workspace, by the walk's own arithmetic
(tests/interp/test_schedule.py holds them against the interpreter's walk)."""

from __future__ import annotations

from math import prod
from typing import Any

from ..errors import DeviceError
from .driver import check, device_info, driver, ensure_current, make_current
from .launch import Kernel, _launch_config, plan_launch


def max_active_clusters(kernel: Kernel, cluster: Any = None) -> int:
    """`cuOccupancyMaxActiveClusters` for `kernel` launched with its cluster shape (or
    `cluster`), its block and its dynamic shared memory."""
    if kernel.function is None:
        raise DeviceError(f"kernel '{kernel.info.name}' is not loaded on a device")
    info = kernel.info
    shape = cluster if cluster is not None else (info.cluster or (1, 1, 1))
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    plan = plan_launch(info, prod(dims), cluster=dims)
    if kernel.context is None:
        ensure_current()
    else:  # the function's attributes are set in its own context
        make_current(kernel.context)
    kernel.function.prepare(plan, info.name, kernel.device)
    cfg = _launch_config(plan, 0)
    return int(check(driver().cuOccupancyMaxActiveClusters(kernel.function.handle, cfg),
                     f"cuOccupancyMaxActiveClusters({info.name})"))


def resident_ctas(kernel: Kernel, cluster: int = 1, device: Any = None) -> int:
    """CTAs of a persistent kernel (one CTA an SM) resident at once: an SM each, or with
    clusters as many whole clusters as the GPCs hold (not SMs / cluster)."""
    if cluster > 1:
        return max_active_clusters(kernel) * cluster
    return device_info(device).sm_count


def tile_grid(resident: int, m: int, n: int, bm: int, bn: int, cluster: int = 1) -> int:
    """The grid of a persistent GEMM over M x N in bm x bn tiles (with a cluster, tiles stacked
    along M in groups of `cluster`): one CTA a tile, at most `resident`, whole clusters."""
    items = -(-m // (bm * cluster)) * -(-n // bn)
    return min(resident // cluster, items) * cluster


def streamk_shared(tiles: int, workers: int) -> int:
    """The tiles a stream-K walk over `workers` shares out K step by K step (tile numbers 0 ..
    this - 1): the partial wave plus one full wave, every tile when there is less than a
    wave, none when the waves come out even."""
    if tiles % workers == 0:
        return 0
    return tiles if tiles < workers else tiles % workers + workers


def streamk_parts(tiles: int, ksteps: int, workers: int) -> int:
    """The most parts (consecutive workers) a stream-K walk cuts any shared tile of `ksteps`
    K steps into; 1 when no tile is shared. K step i of the shared run belongs to worker
    ((i + 1) * V - 1) / iters, V workers sharing iters K steps."""
    sk = streamk_shared(tiles, workers)
    iters = sk * ksteps
    v = max(min(workers, iters), 1)

    def worker(i: int) -> int:
        return ((i + 1) * v - 1) // max(iters, 1)

    return max([worker((u + 1) * ksteps - 1) - worker(u * ksteps) + 1 for u in range(sk)]
               or [1])


def streamk_workspace(m: int, n: int, k: int, workers: int, bm: int = 128, bn: int = 256,
                      bk: int = 64, consumers: int = 2) -> tuple[int, int, int]:
    """(f32 elements of the workspace, u32 semaphores, slots) of a stream-K GEMM over M x N x K
    in bm x bn x bk tiles walked by `workers` (ptxdsl/kernels/gemm.py `make_gemm(streamk=True)`): a
    slot per part of each shared tile, a semaphore per consumer warpgroup of each shared tile
    (zero before the first launch; each launch leaves them zero), at least one of each (a
    launch takes no empty array)."""
    tiles, ksteps = -(-m // bm) * -(-n // bn), -(-k // bk)
    sk, slots = streamk_shared(tiles, workers), streamk_parts(tiles, ksteps, workers)
    return max(sk * slots, 1) * bm * bn, max(sk, 1) * consumers, slots
