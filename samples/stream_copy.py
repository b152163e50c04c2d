"""The pipelined streaming copy with the Python API (twin of stream_copy.ptxdsl).

`make_stream_copy(stages)` builds the kernel for any stage count; the module-level kernel is
the 4-stage one that the .ptxdsl file spells out."""

import numpy as np

import ptxdsl
from ptxdsl import bf16, s32, tmap, u32

ROWS, COLS = 32, 256  # the box: 16 KiB of bf16 per stage


def make_stream_copy(stages: int = 4, rows: int = ROWS) -> ptxdsl.KernelDef:
    """The copy with `stages` stages of [rows, 256] bf16 boxes (rows <= 256)."""

    @ptxdsl.kernel(threads=64)
    def stream_copy(k, src: tmap(bf16, 2), dst: tmap(bf16, 2), ntiles: u32):
        ring = k.pipeline("ring", stages, tile=(bf16, [rows, COLS], 128))
        with k.role("producer", 0, 1):
            with k.if_(k.elect()):
                with k.for_("t", k.ctaid.x, ntiles, k.nctaid.x) as t:
                    k.acquire(ring)
                    k.tma_load(ring.tile, src, [0, (t * rows).to(s32)])
                    k.commit(ring)
        with k.role("consumer", 1, 2):
            with k.if_(k.elect()):
                with k.for_("t", k.ctaid.x, ntiles, k.nctaid.x) as t:
                    k.wait(ring)
                    k.tma_store(dst, [0, (t * rows).to(s32)], ring.tile)
                    k.release(ring)

    return stream_copy


stream_copy = make_stream_copy(4)


# example() sizes small enough for the CPU interpreter (ptxdsl interp, tests)
SMALL = {"ntiles": 12}


def example(rng: np.random.Generator, ntiles: int = 96) -> dict:
    """A [ntiles * 32, 256] bf16 tensor (as uint16 bit patterns), copied whole."""
    src = rng.integers(0, 1 << 16, size=(ntiles * ROWS, COLS), dtype=np.uint16)
    return {"grid": 8, "inputs": {"src": src, "ntiles": ntiles},
            "tensor_maps": {"src": {"box": (ROWS, COLS)}, "dst": {"box": (ROWS, COLS)}},
            "outputs": {"dst": np.empty_like(src)}, "expected": {"dst": src.copy()}}
