"""Column sums through a TMA reduction, with the Python API (twin of colsum.ptxdsl)."""

import numpy as np

import ptxdsl
from ptxdsl import f32, s32, tmap, u32

ROWS, COLS = 32, 256  # one pipeline tile: 32 rows of a 256-column block (32 KiB of f32)


@ptxdsl.kernel(threads=288)
def colsum(k, x: tmap(f32, 2), out: tmap(f32, 1), ntiles: u32):
    ring = k.pipeline("ring", 4, tile=(f32, [ROWS, COLS], 128))
    sums = k.shared("sums", f32, [COLS], align=128)
    with k.role("producer", 0, 1):
        with k.if_(k.elect()):
            with k.for_("t", k.ctaid.y, ntiles, k.nctaid.y) as t:
                k.acquire(ring)
                k.tma_load(ring.tile, x, [(k.ctaid.x * COLS).to(s32), (t * ROWS).to(s32)])
                k.commit(ring)
    with k.role("consumer", 1, 9):
        c = k.let("c", k.tid.x - 32)
        acc = k.let("acc", 0.0, type=f32)
        with k.for_("t", k.ctaid.y, ntiles, k.nctaid.y):
            k.wait(ring)
            with k.for_("r", 0, ROWS, unroll=True) as r:
                k.assign(acc, acc + ring.tile[r, c])
            k.release(ring)
        sums[c] = acc
        k.fence_proxy_async()
        k.role_sync()
        with k.if_(c == 0):
            k.tma_reduce_add(out, [(k.ctaid.x * COLS).to(s32)], sums)
            k.bulk_commit()
            k.bulk_wait(0)


# example() sizes small enough for the CPU interpreter (ptxdsl interp, tests)
SMALL = {"rows": 128, "cols": 512, "splits": 2}


def example(rng: np.random.Generator, rows: int = 16384, cols: int = 4096,
            splits: int = 8) -> dict:
    """x is [rows, cols] f32; `out` starts random (the kernel adds into it), so the result
    shows both the accumulation and every split's contribution."""
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    out = rng.standard_normal(cols).astype(np.float32)
    expected = (out.astype(np.float64) + x.astype(np.float64).sum(axis=0)).astype(np.float32)
    return {"grid": (cols // COLS, splits), "inputs": {"x": x, "out": out, "ntiles": rows // ROWS},
            "tensor_maps": {"x": {"box": (ROWS, COLS)}, "out": {"box": (COLS,)}},
            "expected": {"out": expected}, "rtol": 1e-4, "atol": 1e-3}
