"""The two-stage producer/consumer ring, written with the Python API (twin of pipeline.ptxdsl)."""

import numpy as np

import ptxdsl
from ptxdsl import f32, f32x4, ptr, u32

TILE = 512  # f32 elements per stage (2 KiB)


@ptxdsl.kernel(threads=256)
def pipeline_sum(k, src: ptr(f32), out: ptr(f32), ntiles: u32):
    stage = k.shared("stage", f32, [2, TILE], align=128)
    full = k.mbarrier("full", count=1, n=2)
    empty = k.mbarrier("empty", count=128, n=2)

    tid = k.let("tid", k.tid.x)
    with k.if_(tid == 0):
        with k.for_("s", 0, 2) as s:
            k.mbarrier_init(full[s])
            k.mbarrier_init(empty[s])
        k.fence_mbarrier_init()
    k.bar_sync(0)

    first = k.let("first", k.ctaid.x * ntiles)
    with k.if_(k.warp == 0):
        with k.if_(k.elect()):
            with k.for_("t", 0, ntiles) as t:
                s = k.let("s", t & 1)
                k.mbarrier_wait(empty[s], ((t >> 1) & 1) ^ 1)
                k.mbarrier_arrive_expect_tx(full[s], k.sizeof(stage[s]))
                k.bulk_load(stage[s], src[(first + t) * TILE], full[s])
    with k.else_():
        with k.if_(tid >= 128):
            c = k.let("c", (tid - 128) * 4)
            acc = k.let("acc", k.f32x4(0.0, 0.0, 0.0, 0.0), type=f32x4)
            with k.for_("t", 0, ntiles) as t:
                s = k.let("s", t & 1)
                k.mbarrier_wait(full[s], (t >> 1) & 1)
                v = k.let("v", k.vload(stage[s, c], 4), type=f32x4)
                k.assign(acc, k.f32x4(acc[0] + v[0], acc[1] + v[1], acc[2] + v[2],
                                      acc[3] + v[3]))
                k.mbarrier_arrive(empty[s])
            out[k.ctaid.x * TILE + c] = acc


# example() sizes small enough for the CPU interpreter (ptxdsl interp, tests)
SMALL = {"nctas": 2, "ntiles": 5}


def example(rng: np.random.Generator, nctas: int = 8, ntiles: int = 37) -> dict:
    """Inputs, launch grid and numpy reference for a run of pipeline_sum."""
    src = rng.standard_normal(nctas * ntiles * TILE).astype(np.float32)
    want = src.reshape(nctas, ntiles, TILE).astype(np.float64).sum(axis=1).astype(np.float32)
    return {"grid": nctas, "inputs": {"src": src, "ntiles": ntiles},
            "outputs": {"out": np.empty(nctas * TILE, np.float32)},
            "expected": {"out": want.reshape(-1)}, "rtol": 1e-4,
            "atol": 1e-4}
