"""peer_copy in two processes, one per GPU (started by torchrun):

    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 2 samples/peer_copy_dist.py

Each rank allocates a symmetric VMM buffer; ptxdsl.runtime.distributed exchanges the handles
(torch.distributed) and maps every peer's buffer here. Then, for the bulk and the tile
copy: every rank pushes its data into its slot of the peer's buffer, and pulls the peer's
slot of the peer's buffer into local memory; each result is checked against numpy data
regenerated from the writer's seed. Prints one line per check; exits 1 on a mismatch.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import peer_copy as pc  # noqa: E402

from ptxdsl import runtime as rt  # noqa: E402
from ptxdsl.runtime.distributed import SymmetricBuffer, local_device, report  # noqa: E402

NCHUNKS = 48  # 768 KiB a slot


def data(seed: int, step: str, words: int) -> np.ndarray:
    rng = np.random.default_rng([seed, sum(map(ord, step))])
    return rng.integers(0, 1 << 32, size=words, dtype=np.uint32)


def copy(form: str, dev: int, src, dst, words: int) -> None:
    if form == "bulk":
        k = pc.peer_copy_bulk.program().kernel(device=dev)
        pc.bulk_copy(k, src, dst, words * 4, grid=8)
    else:
        k = pc.peer_copy_tile.program().kernel(device=dev)
        rows = words // pc.COLS
        maps = [rt.TensorMap(rt.DevicePointer(rt.as_device_pointer(a).address),
                             (pc.ROWS, pc.COLS), dtype="f32", shape=(rows, pc.COLS), device=dev)
                for a in (src, dst)]
        pc.tile_copy(k, maps[0], maps[1], rows, grid=8)


def main() -> int:
    dist.init_process_group(os.environ.get("PTXDSL_DIST_BACKEND", "gloo"))
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = local_device()
    words = NCHUNKS * pc.CHUNK
    buf = SymmetricBuffer(world * words * 4, "u32", device=dev)  # slot r: written by rank r
    peer = (rank + 1) % world
    failures = 0

    def slot(arr, r):
        return rt.DevicePointer(arr.ptr + r * words * 4, "u32")

    for form in pc.FORMS:
        # push: my data -> my slot in the peer's buffer
        mine = rt.to_device(data(rank, f"push-{form}", words), device=dev)
        rt.check_reachable(buf.peer(peer), dev, f"rank {peer}'s buffer")
        copy(form, dev, mine, slot(buf.peer(peer), rank), words)
        buf.barrier()
        got = buf.local.copy_to_host()[peer * words:(peer + 1) * words]
        ok = np.array_equal(got, data(peer, f"push-{form}", words))
        failures += not ok
        print(f"rank {rank} (GPU {dev}): push {form}: rank {peer} -> my memory "
              f"{'ok' if ok else 'MISMATCH'}", flush=True)
        # pull: the peer's data in the peer's own slot -> my local memory
        own = buf.local
        own_host = np.array(own.copy_to_host())
        own_host[rank * words:(rank + 1) * words] = data(rank, f"pull-{form}", words)
        own.copy_from_host(own_host)
        buf.barrier()
        out = rt.zeros(words, "u32", device=dev)
        copy(form, dev, slot(buf.peer(peer), peer), out, words)
        rt.synchronize(device=dev)
        ok = np.array_equal(out.copy_to_host(), data(peer, f"pull-{form}", words))
        failures += not ok
        print(f"rank {rank} (GPU {dev}): pull {form}: rank {peer}'s memory -> mine "
              f"{'ok' if ok else 'MISMATCH'}", flush=True)
        buf.barrier()
        mine.free()
        out.free()

    # a tensor map for a GPU the imported mapping was not granted to is refused
    try:
        rt.TensorMap(rt.DevicePointer(buf.peer(peer).ptr), (pc.ROWS, pc.COLS), dtype="f32",
                     shape=(words // pc.COLS, pc.COLS), device=peer)
        print(f"rank {rank}: expected a PeerAccessError", flush=True)
        failures += 1
    except rt.PeerAccessError as e:
        print(f"rank {rank}: refused as expected: {e}", flush=True)

    code = report(failures)
    buf.free()
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    raise SystemExit(main())
