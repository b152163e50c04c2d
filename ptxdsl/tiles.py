"""Host-side arithmetic of the tile schedules (`schedule ... streamk`, builder/schedule.py):
what a launch sizes (workspace slots, semaphores) by the same rules the walk follows on the
GPU. tests/test_schedule.py holds these against the interpreter's walk."""

from __future__ import annotations


def streamk_shared(tiles: int, workers: int) -> int:
    """The tiles a stream-K walk over `workers` shares out K step by K step (tile numbers 0 ..
    this - 1): the partial wave plus one full wave, every tile when there is less than a
    wave, none when the waves come out even."""
    if tiles % workers == 0:
        return 0
    return tiles if tiles < workers else tiles % workers + workers


def streamk_parts(tiles: int, ksteps: int, workers: int) -> int:
    """The most parts (consecutive workers) a stream-K walk cuts any shared tile of `ksteps`
    K steps into; 1 when no tile is shared. K step i of the shared run belongs to worker
    ((i + 1) * V - 1) / iters, V workers sharing iters K steps."""
    sk = streamk_shared(tiles, workers)
    iters = sk * ksteps
    v = max(min(workers, iters), 1)

    def worker(i: int) -> int:
        return ((i + 1) * v - 1) // max(iters, 1)

    return max([worker((u + 1) * ksteps - 1) - worker(u * ksteps) + 1 for u in range(sk)]
               or [1])


def streamk_workspace(m: int, n: int, k: int, workers: int, bm: int = 128, bn: int = 256,
                      bk: int = 64, consumers: int = 2) -> tuple[int, int, int]:
    """(f32 elements of the workspace, u32 semaphores, slots) of a stream-K GEMM over M x N x K
    in bm x bn x bk tiles walked by `workers` (samples/gemm.py `make_gemm(streamk=True)`): a
    slot per part of each shared tile, a semaphore per consumer warpgroup of each shared tile
    (zero before the first launch; each launch leaves them zero), at least one of each (a
    launch takes no empty array)."""
    tiles, ksteps = -(-m // bm) * -(-n // bn), -(-k // bk)
    sk, slots = streamk_shared(tiles, workers), streamk_parts(tiles, ksteps, workers)
    return max(sk * slots, 1) * bm * bn, max(sk, 1) * consumers, slots
