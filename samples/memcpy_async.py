"""The asynchronous-copy kernels of NVIDIA's CUDA guide, with the Python API (twin of
memcpy_async.ptxdsl); every kernel compiles for sm_80 and sm_90a."""

import numpy as np

import ptxdsl
from ptxdsl import ptr, s32, u32

BLOCK = 256


@ptxdsl.kernel(threads=BLOCK)
def with_memcpy_async(k, global_in: ptr(s32), global_out: ptr(s32), nbatch: u32):
    sh = k.shared("sh", s32, [BLOCK], align=128)
    tid = k.let("tid", k.tid.x)
    grid_size = k.let("grid_size", k.nctaid.x * BLOCK)
    with k.for_("batch", 0, nbatch) as batch:
        g = k.let("g", k.ctaid.x * BLOCK + grid_size * batch)
        k.cp_async(sh[tid], global_in[g + tid], 4)
        k.cp_async_commit()
        k.cp_async_wait(0)
        k.bar_sync(0)
        global_out[g + tid] = sh[tid] * 3 + 1
        k.bar_sync(0)


@ptxdsl.kernel(threads=BLOCK)
def with_barrier(k, global_in: ptr(s32), global_out: ptr(s32), nbatch: u32):
    sh = k.shared("sh", s32, [BLOCK], align=128)
    bar = k.mbarrier("bar", count=BLOCK)
    tid = k.let("tid", k.tid.x)
    with k.if_(tid == 0):
        k.mbarrier_init(bar)
        k.fence_mbarrier_init()
    k.bar_sync(0)
    grid_size = k.let("grid_size", k.nctaid.x * BLOCK)
    with k.for_("batch", 0, nbatch) as batch:
        g = k.let("g", k.ctaid.x * BLOCK + grid_size * batch)
        with k.if_(tid == 0):
            k.mbarrier_expect_tx(bar, k.sizeof(sh))
            k.bulk_load(sh, global_in[g], bar)
        k.mbarrier_arrive(bar)
        k.mbarrier_wait(bar, batch & 1)
        global_out[g + tid] = sh[tid] * 3 + 1
        k.bar_sync(0)


@ptxdsl.kernel(threads=BLOCK)
def with_staging(k, global_in: ptr(s32), global_out: ptr(s32), nbatch: u32):
    ring = k.pipeline("ring", 2, buf=(s32, [BLOCK], 128))
    tid = k.let("tid", k.tid.x)
    grid_size = k.let("grid_size", k.nctaid.x * BLOCK)
    fetch = k.let("fetch", 0, type=u32)
    with k.for_("batch", 0, nbatch) as batch:
        with k.while_((fetch < nbatch) & (fetch < batch + 2)):
            with k.if_(tid == 0):
                k.acquire(ring)
                k.bulk_load(ring.buf, global_in[k.ctaid.x * BLOCK + grid_size * fetch])
                k.commit(ring)
            k.assign(fetch, fetch + 1)
        k.wait(ring)
        global_out[k.ctaid.x * BLOCK + grid_size * batch + tid] = ring.buf[tid] * 3 + 1
        k.release(ring)


@ptxdsl.kernel(threads=BLOCK)
def with_specialized_staging(k, global_in: ptr(s32), global_out: ptr(s32), nbatch: u32):
    half = BLOCK // 2
    sh = k.shared("sh", s32, [2, half], align=128)
    full = k.mbarrier("full", count=half, n=2)
    empty = k.mbarrier("empty", count=half, n=2)
    tid = k.let("tid", k.tid.x)
    idx = k.let("idx", tid >> 1)
    producer = k.let("producer", (tid & 1) == 0)
    with k.if_(tid == 0):
        with k.for_("s", 0, 2) as s:
            k.mbarrier_init(full[s])
            k.mbarrier_init(empty[s])
        k.fence_mbarrier_init()
    k.bar_sync(0)
    first = k.let("first", k.ctaid.x * half + idx)
    batch_size = k.let("batch_size", k.nctaid.x * half)
    fetch = k.let("fetch", 0, type=u32)
    with k.for_("batch", 0, nbatch) as batch:
        with k.while_((fetch < nbatch) & (fetch < batch + 2)):
            with k.if_(producer):
                s = k.let("s", fetch & 1)
                k.mbarrier_wait(empty[s], ((fetch >> 1) & 1) ^ 1)
                k.cp_async(sh[s, idx], global_in[batch_size * fetch + first], 4)
                k.cp_async_mbarrier_arrive_noinc(full[s])
            k.assign(fetch, fetch + 1)
        with k.if_(~producer):
            s = k.let("s", batch & 1)
            k.mbarrier_wait(full[s], (batch >> 1) & 1)
            global_out[batch_size * batch + first] = sh[s, idx] * 3 + 1
            k.mbarrier_arrive(empty[s])


# example() sizes small enough for the CPU interpreter (ptxdsl interp, tests)
SMALL = {"nctas": 2, "nbatch": 5}


def example(rng: np.random.Generator, kernel: str = "with_memcpy_async", nctas: int = 132,
            nbatch: int = 64) -> dict:
    """Inputs, grid and reference: out = 3 * in + 1 over nbatch batches of every CTA."""
    per_cta = BLOCK // 2 if kernel == "with_specialized_staging" else BLOCK
    x = rng.integers(-(1 << 20), 1 << 20, size=nctas * per_cta * nbatch, dtype=np.int32)
    return {"grid": nctas, "inputs": {"global_in": x, "nbatch": nbatch},
            "outputs": {"global_out": np.empty_like(x)}, "expected": {"global_out": x * 3 + 1}}
