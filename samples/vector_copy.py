"""The vectorised streaming copy with the Python API (twin of vector_copy.ptxdsl).

`make_vector_copy(threads, unroll)` builds it for any CTA size and number of 16-byte loads in
flight per thread; the module-level kernel is the 256-thread, 4-deep one of the .ptxdsl file.
`load` / `store` add PTX qualifiers to the loads and stores (e.g. ".nc.L1::no_allocate",
".L2::256B", ".cs"), written through `asm`, for the benchmark to measure what they are worth."""

import numpy as np

import ptxdsl
from ptxdsl import ptr, u32, u32x4


def chunk_words(threads: int = 256, unroll: int = 4) -> int:
    """u32 words one CTA copies per loop iteration."""
    return threads * unroll * 4


def make_vector_copy(threads: int = 256, unroll: int = 4, load: str = "", store: str = "",
                     name: str = "vector_copy") -> ptxdsl.KernelDef:
    words = chunk_words(threads, unroll)

    def vector_copy(k, src: ptr(u32), dst: ptr(u32), nchunks: u32):
        with k.for_("c", k.ctaid.x, nchunks, k.nctaid.x) as c:
            base = k.let("base", c * words + k.tid.x * 4)
            offs = [base if j == 0 else base + j * threads * 4 for j in range(unroll)]
            if not (load or store):
                vs = [k.let(f"v{j}", k.vload(src[o], 4), type=u32x4) for j, o in enumerate(offs)]
                for o, v in zip(offs, vs, strict=True):
                    dst[o] = v
                return
            regs = [[k.let(f"w{j}_{e}", 0, type=u32) for e in range(4)] for j in range(unroll)]
            for o, w in zip(offs, regs, strict=True):
                k.asm(f"ld.global{load}.v4.u32 {{{{0}}, {{1}}, {{2}}, {{3}}}}, [{{4}}];", w,
                      [src + o])
            for o, w in zip(offs, regs, strict=True):
                k.asm(f"st.global{store}.v4.u32 [{{0}}], {{{{1}}, {{2}}, {{3}}, {{4}}}};", [],
                      [dst + o, *w])

    return ptxdsl.kernel(vector_copy, threads=threads, name=name)


vector_copy = make_vector_copy()


# example() sizes small enough for the CPU interpreter (ptxdsl interp, tests)
SMALL = {"nchunks": 3}


def example(rng: np.random.Generator, nchunks: int = 37) -> dict:
    """nchunks * 4096 random u32 words (not a multiple of the grid), copied whole."""
    src = rng.integers(0, 1 << 32, size=nchunks * chunk_words(), dtype=np.uint32)
    return {"grid": 8, "inputs": {"src": src, "nchunks": nchunks},
            "outputs": {"dst": np.empty_like(src)}, "expected": {"dst": src.copy()}}
