"""How many clusters of a kernel fit on the device at once: the persistent grid of a
cluster kernel (a grid of more clusters runs in waves; a loop over work items then splits
them unevenly)."""

from __future__ import annotations

from math import prod
from typing import Any

from ..errors import DeviceError
from .driver import check, device_info, driver, ensure_current
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
    ensure_current()
    kernel.function.prepare(plan, info.name)
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
