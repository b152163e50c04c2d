"""dsmem_exchange with the Python API (twin of dsmem_exchange.ptxdsl); `build(n)` makes the
same kernel for clusters of n CTAs (the GPU tests use 2, 4, 8 and 16)."""

import numpy as np

import ptxdsl
from ptxdsl import f32, ptr

THREADS = 128


def build(cluster: int = 2) -> ptxdsl.KernelDef:
    def dsmem_exchange(k, src: ptr(f32), dst: ptr(f32)):
        box = k.shared("box", f32, [THREADS])
        tid = k.let("tid", k.tid.x)
        partner = k.let("partner", k.cluster_ctarank ^ 1)
        g = k.let("g", k.ctaid.x * THREADS + tid)
        k.cluster_sync()
        k.peer(box, partner)[tid] = src[g] * 2.0
        k.cluster_sync()
        dst[g] = box[tid]

    return ptxdsl.kernel(dsmem_exchange, threads=THREADS, cluster=cluster,
                         nonportable=cluster > 8)


dsmem_exchange = build(2)

# example() sizes small enough for the CPU interpreter (ptxdsl interp, tests)
SMALL = {"nctas": 4}


def example(rng: np.random.Generator, nctas: int = 64, cluster: int = 2) -> dict:
    """Inputs, launch grid and numpy reference: CTA c gets 2 * the data of CTA c ^ 1."""
    src = rng.standard_normal(nctas * THREADS).astype(np.float32)
    swapped = src.reshape(nctas, THREADS)[np.arange(nctas) ^ 1].reshape(-1)
    return {"grid": nctas, "inputs": {"src": src}, "outputs": {"dst": np.empty_like(src)},
            "expected": {"dst": swapped * 2.0}}
