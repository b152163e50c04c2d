"""add_one through a 1D bulk copy, written with the Python API (twin of add_one.ptxdsl)."""

import numpy as np

import ptxdsl
from ptxdsl import f32, ptr

CHUNK = 2048  # f32 elements per CTA (8 KiB)


@ptxdsl.kernel(threads=256)
def add_one(k, src: ptr(f32), dst: ptr(f32)):
    tile = k.shared("tile", f32, [CHUNK], align=128)
    bar = k.mbarrier("bar", count=1)

    tid = k.let("tid", k.tid.x)
    leader = k.let("leader", tid == 0)
    chunk = k.let("chunk", k.ctaid.x * CHUNK)

    with k.if_(leader):
        k.mbarrier_init(bar)
        k.fence_mbarrier_init()
    k.bar_sync(0)

    with k.if_(leader):
        k.mbarrier_arrive_expect_tx(bar, k.sizeof(tile))
        k.bulk_load(tile, src[chunk], bar)
    k.mbarrier_wait(bar, 0)

    with k.for_("i", 0, 2) as i:
        j = k.let("j", tid * 8 + i * 4)
        v = k.let("v", k.vload(tile[j], 4), type=ptxdsl.f32x4)
        tile[j] = k.f32x4(v[0] + 1.0, v[1] + 1.0, v[2] + 1.0, v[3] + 1.0)

    k.fence_proxy_async()
    k.bar_sync(0)

    with k.if_(leader):
        k.bulk_store(dst[chunk], tile)
        k.bulk_commit()
        k.bulk_wait_read(0)
        k.mbarrier_inval(bar)


# example() sizes small enough for the CPU interpreter (ptxdsl interp, tests)
SMALL = {"nchunks": 3}


def example(rng: np.random.Generator, nchunks: int = 64) -> dict:
    """Inputs, launch grid and numpy reference for a run of add_one."""
    src = rng.standard_normal(nchunks * CHUNK).astype(np.float32)
    return {"grid": nchunks, "inputs": {"src": src},
            "outputs": {"dst": np.empty_like(src)}, "expected": {"dst": src + 1.0}}
