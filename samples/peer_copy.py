"""TMA copies between GPUs (twin of peer_copy.ptxdsl), and the helpers that run them.

`make_bulk_copy(chunk_words, stages)` and `make_tile_copy(rows, stages)` build the copies for
any chunk or box size; the module-level kernels are the ones the .ptxdsl file spells out.
Which GPU's memory a pointer or tensor map addresses is the runtime's business
(ptxdsl.runtime.peer / vmm / distributed); `push`/`pull` below only launch.

    python samples/peer_copy.py        # every direction and memory kind on GPUs 0 and 1
"""

from __future__ import annotations

import numpy as np

import ptxdsl
from ptxdsl import f32, ptr, s32, tmap, u32

CHUNK = 4096  # u32 words per bulk chunk (16 KiB)
COLS, ROWS = 256, 16  # the f32 tile box: 16 KiB


def make_bulk_copy(chunk_words: int = CHUNK, stages: int = 4) -> ptxdsl.KernelDef:
    """The 1D bulk copy with `stages` stages of `chunk_words` u32 each."""
    name = "peer_copy_bulk" if (chunk_words, stages) == (CHUNK, 4) else \
        f"peer_copy_bulk_{chunk_words * 4}B_{stages}s"

    @ptxdsl.kernel(threads=64, name=name)
    def peer_copy_bulk(k, src: ptr(u32), dst: ptr(u32), nchunks: u32):
        ring = k.pipeline("ring", stages, chunk=(u32, [chunk_words], 128))
        with k.role("producer", 0, 1):
            with k.if_(k.elect()):
                with k.for_("t", k.ctaid.x, nchunks, k.nctaid.x) as t:
                    k.acquire(ring)
                    k.bulk_load(ring.chunk, src[t * chunk_words])
                    k.commit(ring)
        with k.role("consumer", 1, 2):
            with k.if_(k.elect()):
                with k.for_("t", k.ctaid.x, nchunks, k.nctaid.x) as t:
                    k.wait(ring)
                    k.bulk_store(dst[t * chunk_words], ring.chunk)
                    k.release(ring)

    return peer_copy_bulk


def make_tile_copy(rows: int = ROWS, stages: int = 4) -> ptxdsl.KernelDef:
    """The 2D tensor-map copy with `stages` stages of [rows, 256] f32 boxes."""
    name = "peer_copy_tile" if (rows, stages) == (ROWS, 4) else \
        f"peer_copy_tile_{rows}r_{stages}s"

    @ptxdsl.kernel(threads=64, name=name)
    def peer_copy_tile(k, src: tmap(f32, 2), dst: tmap(f32, 2), ntiles: u32):
        ring = k.pipeline("ring", stages, tile=(f32, [rows, COLS], 128))
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

    return peer_copy_tile


peer_copy_bulk = make_bulk_copy()
peer_copy_tile = make_tile_copy()


@ptxdsl.kernel(threads=256)
def sm_copy(k, src: ptr(u32), dst: ptr(u32), n16: u32):
    stride = k.let("stride", k.nctaid.x * 256)
    with k.for_("i", k.ctaid.x * 256 + k.tid.x, n16, stride) as i:
        v = k.let("v", k.vload(src[i * 4], 4), type=ptxdsl.u32x4)
        dst[i * 4] = v


# ----------------------------------------------------------------------------- launching


def bulk_copy(kernel, src, dst, nbytes: int, *, grid: int, stream=None,
              chunk_words: int = CHUNK) -> None:
    """Copy `nbytes` (a multiple of the chunk) from `src` to `dst` with a bulk-copy kernel
    loaded on the GPU that issues it (`prog.kernel(device=d)`)."""
    chunk = chunk_words * 4
    if nbytes % chunk:
        raise ptxdsl.LaunchError(f"the bulk copy moves whole {chunk}-byte chunks; "
                                 f"{nbytes} bytes is not a multiple")
    n = nbytes // chunk
    kernel[max(1, min(grid, n)), None, stream](src, dst, n)


def tile_copy(kernel, src_map, dst_map, rows: int, *, grid: int, stream=None,
              box_rows: int = ROWS) -> None:
    """Copy `rows` rows of 256 f32 between two tensor maps (box [box_rows, 256])."""
    if rows % box_rows:
        raise ptxdsl.LaunchError(f"rows must be a multiple of {box_rows}, got {rows}")
    n = rows // box_rows
    kernel[max(1, min(grid, n)), None, stream](src_map, dst_map, n)


# ----------------------------------------------------------------------------- one GPU

# example() sizes small enough for the CPU interpreter (ptxdsl interp, tests)
SMALL = {"n": 6}


def example(rng: np.random.Generator, kernel: str = "peer_copy_bulk", n: int = 96) -> dict:
    """A copy on one GPU (both pointers local): `n` chunks, tiles or 4-KiB blocks."""
    if kernel == "peer_copy_tile":
        src = rng.standard_normal((n * ROWS, COLS)).astype(np.float32)
        return {"kernel": kernel, "grid": 8, "inputs": {"src": src, "ntiles": n},
                "tensor_maps": {"src": {"box": (ROWS, COLS)}, "dst": {"box": (ROWS, COLS)}},
                "outputs": {"dst": np.empty_like(src)}, "expected": {"dst": src.copy()}}
    words = n * (CHUNK if kernel == "peer_copy_bulk" else 1024)
    src = rng.integers(0, 1 << 32, size=words, dtype=np.uint32)
    count = {"nchunks": n} if kernel == "peer_copy_bulk" else {"n16": words // 4}
    return {"kernel": kernel, "grid": 8 if kernel == "peer_copy_bulk" else 4,
            "inputs": {"src": src, **count},
            "outputs": {"dst": np.empty_like(src)}, "expected": {"dst": src.copy()}}


# ----------------------------------------------------------------------------- two GPUs

KINDS = ("peer", "vmm", "imported")  # cuMemAlloc + peer access, VMM on both, imported handle
DIRECTIONS = ("push", "pull")  # local -> peer, peer -> local (the issuing GPU's view)
FORMS = ("bulk", "tile")


def remote_buffer(kind: str, words: int, home: int, issuer: int):
    """`words` u32 on GPU `home` that kernels on `issuer` reach: (array for the issuer,
    array for host copies, things to free)."""
    from ptxdsl import runtime as rt

    if kind == "peer":
        rt.enable_peer_access(issuer, home)
        arr = rt.empty(words, "u32", device=home)
        return arr, arr, [arr]
    if kind == "vmm":
        a = rt.vmm_alloc(words * 4, home, access=[home, issuer])
        return a.array(words, "u32", device=issuer), a.array(words, "u32", device=home), [a]
    if kind == "imported":  # exported and imported again: the path a second process takes
        a = rt.vmm_alloc(words * 4, home, access=[home], shareable=True)
        b = rt.import_handle(a.export(), access=[issuer])
        return b.array(words, "u32", device=issuer), a.array(words, "u32", device=home), [b, a]
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def run_case(form: str, kind: str, direction: str, issuer: int, home: int,
             rng: np.random.Generator, n: int | None = None, grid: int = 8) -> tuple:
    """One copy between GPU `issuer` (runs the kernel, holds the local buffer) and memory of
    `kind` on GPU `home`; returns (got, want) as u32 arrays."""
    from ptxdsl import runtime as rt

    n = int(rng.integers(20, 80)) if n is None else n
    words = n * CHUNK  # n chunks of 16 KiB; as tiles: n [16, 256] f32 boxes
    want = rng.integers(0, 1 << 32, size=words, dtype=np.uint32)
    local = rt.to_device(np.zeros(words, np.uint32), device=issuer)
    far, far_host, owned = remote_buffer(kind, words, home, issuer)
    try:
        far_host.copy_from_host(want if direction == "pull" else np.zeros(words, np.uint32))
        if direction == "push":
            local.copy_from_host(want)
        src, dst = (local, far) if direction == "push" else (far, local)
        rt.check_reachable(far, issuer, f"the {kind} buffer on GPU {home}")
        if form == "bulk":
            k = peer_copy_bulk.program().kernel(device=issuer)
            bulk_copy(k, src, dst, words * 4, grid=grid)
        else:
            k = peer_copy_tile.program().kernel(device=issuer)
            shape, box = (n * ROWS, COLS), (ROWS, COLS)
            maps = [rt.TensorMap(rt.DevicePointer(a.ptr), box, dtype="f32", shape=shape,
                                 device=issuer) for a in (src, dst)]
            tile_copy(k, maps[0], maps[1], n * ROWS, grid=grid)
        rt.synchronize(device=issuer)
        got = (far_host if direction == "push" else local).copy_to_host()
    finally:
        local.free()
        for o in owned:
            o.free()
    return got, want


def main() -> int:
    """Every form, kind and direction, issued from each GPU, against numpy."""
    from ptxdsl import runtime as rt

    if rt.device_count() < 2:
        print("peer_copy needs two GPUs")
        return 1
    rng = np.random.default_rng(0)
    failures = 0
    for issuer, home in ((0, 1), (1, 0)):
        for form in FORMS:
            for kind in KINDS:
                for direction in DIRECTIONS:
                    got, want = run_case(form, kind, direction, issuer, home, rng)
                    bad = int(np.count_nonzero(got != want))
                    failures += bad != 0
                    print(f"GPU {issuer} {direction:4} {form:4} {kind:8} (memory on GPU {home}, "
                          f"{want.nbytes >> 10} KiB): {'ok' if not bad else f'{bad} words differ'}")
    print("all ok" if not failures else f"{failures} case(s) FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
