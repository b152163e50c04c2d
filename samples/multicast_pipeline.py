"""multicast_pipeline with the Python API (twin of multicast_pipeline.ptxdsl).

`build()` makes the sample's kernel; its options make the variants the GPU tests run:
`cluster` (CTAs per cluster, 1D, or a 2D shape), `mask` ("all": the whole cluster shares
each tile; "row": each cluster row shares its own tiles, a subset multicast) and `copy`
("tma": 2D tensor tiles, x a tensor map; "bulk": 1D bulk copies, x a pointer)."""

import numpy as np

import ptxdsl
from ptxdsl import f32, ptr, tmap, u32

ROWS, COLS = 32, 64  # a tile


def build(cluster=4, mask: str = "all", copy: str = "tma") -> ptxdsl.KernelDef:
    nx, ny = (cluster, 1) if isinstance(cluster, int) else cluster
    group = nx if mask == "row" else nx * ny
    part_rows = ROWS // group

    xtype = tmap(f32, 2) if copy == "tma" else ptr(f32)

    def multicast_pipeline(k, x: xtype, out: ptr(f32), ntiles: u32):
        ring = k.pipeline("ring", 3, tile=(f32, [group, part_rows, COLS], 128))
        with k.role("producer", 0, 1):
            with k.if_(k.elect()):
                if mask == "row":
                    part = k.let("part", k.cluster_ctaid.x)
                    first = k.let("first", (k.clusterid.x * ny + k.cluster_ctaid.y) * ntiles)
                else:
                    part = k.let("part", k.cluster_ctarank)
                    first = k.clusterid.x * ntiles
                with k.for_("t", 0, ntiles) as t:
                    k.acquire(ring)
                    group_mask = k.cluster_row_mask() if mask == "row" else k.cluster_mask()
                    row = (first + t) * ROWS + part * part_rows
                    if copy == "tma":
                        k.tma_load_multicast(ring.tile[part], x, [0, row], group_mask)
                    else:
                        k.bulk_load_multicast(ring.tile[part], x[row * COLS], group_mask)
                    k.commit(ring)
        with k.role("consumers", 1, 3):
            j = k.let("j", k.tid.x - 32)
            acc = k.let("acc", 0.0, type=f32)
            with k.for_("t", 0, ntiles):
                k.wait(ring)
                with k.for_("p", 0, group) as p:
                    with k.for_("i", 0, part_rows) as i:
                        k.assign(acc, acc + ring.tile[p, i, j])
                k.release(ring)
            cta = k.ctaid.x if ny == 1 else k.ctaid.y * k.nctaid.x + k.ctaid.x
            out[cta * COLS + j] = acc * (k.cluster_ctarank + 1).to(f32)

    return ptxdsl.kernel(multicast_pipeline, threads=96,
                         cluster=cluster if isinstance(cluster, int) else (nx, ny),
                         nonportable=nx * ny > 8)


multicast_pipeline = build()

# example() sizes small enough for the CPU interpreter (ptxdsl interp, tests)
SMALL = {"nclusters": 2, "ntiles": 4}


def example(rng: np.random.Generator, nclusters: int = 16, ntiles: int = 64, cluster=4,
            mask: str = "all", copy: str = "tma") -> dict:
    """Inputs, grid and reference: out[cta, j] = (rank + 1) * column sums of its tiles."""
    nx, ny = (cluster, 1) if isinstance(cluster, int) else cluster
    groups = nclusters * (ny if mask == "row" else 1)  # CTA groups that share tiles
    x = rng.integers(-8, 8, size=(groups * ntiles * ROWS, COLS)).astype(np.float32)
    sums = x.reshape(groups, ntiles * ROWS, COLS).sum(axis=1)
    out = np.zeros((nclusters * nx * ny, COLS), np.float32)
    for cx in range(nclusters):
        for y in range(ny):
            for xr in range(nx):
                rank = y * nx + xr
                g = cx * ny + y if mask == "row" else cx
                out[y * nclusters * nx + cx * nx + xr] = (rank + 1) * sums[g]
    part_rows = ROWS // (nx if mask == "row" else nx * ny)
    ex = {"grid": (nclusters * nx, ny), "inputs": {"x": x.reshape(-1) if copy == "bulk" else x,
                                                  "ntiles": ntiles},
          "outputs": {"out": np.empty(out.size, np.float32)}, "expected": {"out": out.reshape(-1)}}
    if copy == "tma":
        ex["tensor_maps"] = {"x": {"box": (part_rows, COLS)}}
    return ex
