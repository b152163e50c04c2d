"""The rest of the CUDA guide's asynchronous-copy kernels with the Python API (twin of
cuda_pipeline.ptxdsl): cuda::pipeline as a ptxdsl pipeline, cuda::barrier as an mbarrier."""

import numpy as np

import ptxdsl
from ptxdsl import ptr, s32, u32

BLOCK = 256


@ptxdsl.kernel(threads=BLOCK)
def with_single_stage(k, global_in: ptr(s32), global_out: ptr(s32), nbatch: u32):
    ring = k.pipeline("ring", 1, buf=(s32, [BLOCK], 128))
    tid = k.let("tid", k.tid.x)
    grid_size = k.let("grid_size", k.nctaid.x * BLOCK)
    with k.for_("batch", 0, nbatch) as batch:
        g = k.let("g", k.ctaid.x * BLOCK + grid_size * batch)
        with k.if_(tid == 0):
            k.acquire(ring)
            k.bulk_load(ring.buf, global_in[g])
            k.commit(ring)
        k.wait(ring)
        global_out[g + tid] = ring.buf[tid] * 3 + 1
        k.release(ring)


@ptxdsl.kernel(threads=BLOCK)
def with_staging_role(k, global_in: ptr(s32), global_out: ptr(s32), nbatch: u32):
    ring = k.pipeline("ring", 2, buf=(s32, [BLOCK], 128))
    with k.role("block", 0, BLOCK // 32):
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
def with_partitioned_staging(k, global_in: ptr(s32), global_out: ptr(s32), nbatch: u32):
    per_batch = BLOCK * 2  # 4 elements for each of the 128 producer threads
    ring = k.pipeline("ring", 2, buf=(s32, [BLOCK // 2, 4], 128))
    with k.role("block", 0, BLOCK // 32):
        tid = k.let("tid", k.tid.x)
        idx = k.let("idx", tid >> 1)
        producer = k.let("producer", (tid & 1) == 0)
        first = k.let("first", k.ctaid.x * per_batch + idx * 4)
        batch_size = k.let("batch_size", k.nctaid.x * per_batch)
        fetch = k.let("fetch", 0, type=u32)
        with k.for_("batch", 0, nbatch) as batch:
            with k.while_((fetch < nbatch) & (fetch < batch + 2)):
                with k.if_(producer):
                    k.acquire(ring)
                    k.bulk_load(ring.buf[idx], global_in[batch_size * fetch + first])
                    k.commit(ring)
                k.assign(fetch, fetch + 1)
            with k.if_(~producer):
                k.wait(ring)
                with k.for_("j", 0, 4, unroll=True) as j:
                    global_out[batch_size * batch + first + j] = ring.buf[idx, j] * 3 + 1
                k.release(ring)


@ptxdsl.kernel(threads=BLOCK)
def split_arrive_wait(k, global_in: ptr(s32), global_out: ptr(s32), iterations: u32):
    sh = k.shared("sh", s32, [2, BLOCK], align=16)
    bar = k.mbarrier("bar", count=BLOCK)
    tid = k.let("tid", k.tid.x)
    with k.if_(tid == 0):
        k.mbarrier_init(bar)
        k.fence_mbarrier_init()
    k.bar_sync(0)
    g = k.let("g", k.ctaid.x * BLOCK + tid)
    grid_size = k.let("grid_size", k.nctaid.x * BLOCK)
    acc = k.let("acc", 0, type=s32)
    with k.for_("i", 0, iterations) as i:
        sh[i & 1, tid] = global_in[grid_size * i + g]
        k.mbarrier_arrive(bar)
        k.assign(acc, acc * 3)
        k.mbarrier_wait(bar, i & 1)
        k.assign(acc, acc + sh[i & 1, (tid + 1) % BLOCK])
    global_out[g] = acc


@ptxdsl.kernel(threads=BLOCK)
def add_one_barrier(k, src: ptr(s32), dst: ptr(s32)):
    smem_data = k.shared("smem_data", s32, [1024], align=16)
    bar = k.mbarrier("bar", count=BLOCK)
    tid = k.let("tid", k.tid.x)
    offset = k.let("offset", k.ctaid.x * 1024)
    with k.if_(tid == 0):
        k.mbarrier_init(bar)
        k.fence_mbarrier_init()
    k.bar_sync(0)
    with k.if_(tid == 0):
        k.bulk_load(smem_data, src[offset], bar)
        k.mbarrier_arrive_expect_tx(bar, k.sizeof(smem_data))
    with k.else_():
        k.mbarrier_arrive(bar)
    k.mbarrier_wait(bar, 0)
    with k.for_("i", 0, 4) as i:
        smem_data[tid + i * BLOCK] = smem_data[tid + i * BLOCK] + 1
    k.fence_proxy_async()
    k.bar_sync(0)
    with k.if_(tid == 0):
        k.bulk_store(dst[offset], smem_data)
        k.bulk_commit()
        k.bulk_wait_read(0)
        k.mbarrier_inval(bar)


# example() sizes small enough for the CPU interpreter (ptxdsl interp, tests)
SMALL = {"nctas": 2, "nbatch": 5}


def example(rng: np.random.Generator, kernel: str = "with_single_stage", nctas: int = 132,
            nbatch: int = 64) -> dict:
    """Inputs, grid and reference of one kernel: nbatch batches (iterations) of every CTA."""
    x = rng.integers(-(1 << 20), 1 << 20, size=nctas * BLOCK * 4 * nbatch, dtype=np.int32)
    if kernel == "add_one_barrier":
        x = x[:nctas * 1024]
        return {"grid": nctas, "inputs": {"src": x}, "outputs": {"dst": np.empty_like(x)},
                "expected": {"dst": x + 1}}
    if kernel == "split_arrive_wait":
        x = x[:nctas * BLOCK * nbatch].reshape(nbatch, nctas, BLOCK)
        acc = np.zeros((nctas, BLOCK), np.int64)
        for i in range(nbatch):  # acc = 3 acc + the right neighbour's value, in s32
            acc = (acc * 3 + np.roll(x[i], -1, axis=1)) % (1 << 32)
        want = acc.astype(np.uint32).view(np.int32).reshape(-1)
        return {"grid": nctas, "inputs": {"global_in": x.reshape(-1), "iterations": nbatch},
                "outputs": {"global_out": np.empty_like(want)}, "expected": {"global_out": want}}
    per_cta = 2 * BLOCK if kernel == "with_partitioned_staging" else BLOCK
    x = x[:nctas * per_cta * nbatch]
    return {"grid": nctas, "inputs": {"global_in": x, "nbatch": nbatch},
            "outputs": {"global_out": np.empty_like(x)}, "expected": {"global_out": x * 3 + 1}}
