"""Peer views across processes with torch.distributed: one process per GPU (torchrun).

    dist.init_process_group("gloo")                 # or "nccl"; torchrun sets the rest
    buf = ptxdsl.runtime.distributed.SymmetricBuffer(1 << 20, device=local_rank)
    buf.local                                       # this rank's memory (a DeviceArray)
    buf.peer(r)                                     # rank r's memory, mapped here

Every rank allocates VMM memory on its GPU, exports it (a POSIX descriptor), and the
handles travel with `all_gather_object`; each rank then imports the others' memory and maps
it for its own GPU. Kernels on this rank's GPU read and write a peer's memory through
`buf.peer(r)` (pointers or tensor maps); nothing else is needed. No multicast objects.

Ordering between ranks is the caller's: synchronise the GPU work, then `buf.barrier()`
(or any collective) before another rank reads what this one wrote.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import DeviceError, LaunchError
from .driver import device_ordinal
from .vmm import ShareableHandle, VmmAllocation, import_handle, vmm_alloc


def _dist() -> Any:
    try:
        import torch.distributed as dist  # type: ignore[import-not-found]
    except ImportError as e:
        raise DeviceError(f"ptxdsl.runtime.distributed needs torch.distributed: {e}") from None
    if not dist.is_available() or not dist.is_initialized():
        raise DeviceError(
            "torch.distributed is not initialised: start the processes with "
            "torchrun and call torch.distributed.init_process_group() first"
        )
    return dist


def local_device() -> int:
    """This process's GPU under torchrun: LOCAL_RANK (0 when unset)."""
    return device_ordinal(int(os.environ.get("LOCAL_RANK", "0")), "LOCAL_RANK")


def exchange(alloc: VmmAllocation, group: Any = None) -> list[VmmAllocation]:
    """Share `alloc` (shareable VMM memory of this rank) with every rank of `group` and map
    theirs here: returns one allocation per rank, this rank's own at its index. A
    collective: every rank of the group calls it."""
    dist = _dist()
    if not isinstance(alloc, VmmAllocation) or not alloc.shareable:
        raise LaunchError(
            "exchange() takes shareable VMM memory: vmm_alloc(nbytes, device, shareable=True)"
        )
    mine = alloc.export()
    rank = dist.get_rank(group)
    handles: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(handles, mine, group=group)
    out: list[VmmAllocation] = []
    local = alloc.access[0] if alloc.access else alloc.device
    error = None
    for r, h in enumerate(handles):
        if r == rank:
            out.append(alloc)
            continue
        if not isinstance(h, ShareableHandle):
            error = f"rank {r} sent {type(h).__name__}, not a ShareableHandle"
            break
        try:
            out.append(import_handle(h, access=[local]))
        except (DeviceError, LaunchError) as e:
            error = f"rank {rank} could not import rank {r}'s memory: {e}"
            break
    # everyone has imported (or failed) before any exporter may free its descriptor
    errors: list[Any] = [None] * len(handles)
    dist.all_gather_object(errors, error, group=group)
    bad = [f"{e}" for e in errors if e]
    if bad:
        for a in out:
            if a is not alloc:
                a.free()
        raise DeviceError("exchanging VMM handles failed:\n" + "\n".join(bad))
    return out


class SymmetricBuffer:
    """`nbytes` of VMM memory on every rank's GPU, each rank's mapped into every process.

    `local` is this rank's memory, `peer(r)` rank r's (r == rank gives `local`), both as
    DeviceArray views of `dtype` for kernels on `device`. A collective to create."""

    def __init__(self, nbytes: int, dtype: Any = "u8", device: Any = None, group: Any = None):
        dist = _dist()
        self.device = local_device() if device is None else device_ordinal(device)
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.nbytes = nbytes
        self.dtype = dtype
        self._alloc = vmm_alloc(nbytes, self.device, shareable=True)
        self.allocations = exchange(self._alloc, group)
        self.arrays = [a.array(dtype=dtype, device=self.device) for a in self.allocations]
        self._stacked: Any = None

    @property
    def stride(self) -> int:
        """Bytes between two ranks' memory in `stacked()` (the allocation size: `nbytes`
        rounded up to the VMM granularity)."""
        return self._alloc.size

    def stacked(self) -> Any:
        """Every rank's memory back to back at one address, for kernels on this GPU: rank
        r's at byte `r * stride` (a StackedMapping; `.array(shape, dtype)` views it). One
        tensor map over it with a rank dimension of stride `stride` reaches every peer, so
        a kernel written for any world size takes one argument, not one per rank. Made on
        first use (not a collective), freed by `free()`."""
        if self._stacked is None:
            from .vmm import stack

            self._stacked = stack(self.allocations, self.device)
        return self._stacked

    @property
    def local(self) -> Any:
        return self.arrays[self.rank]

    def peer(self, rank: int) -> Any:
        if not 0 <= rank < self.world_size:
            raise LaunchError(f"rank must be in [0, {self.world_size}), got {rank}")
        return self.arrays[rank]

    def barrier(self) -> None:
        """Wait for this GPU's work, then for every rank (so peers see what it wrote)."""
        from .driver import synchronize

        synchronize(device=self.device)
        _dist().barrier(group=self.group)

    def free(self) -> None:
        """Unmap every peer's memory and free this rank's (a collective: every rank calls
        it, so no rank frees memory another still writes)."""
        self.barrier()
        if self._stacked is not None:
            self._stacked.free()
            self._stacked = None
        for a in self.allocations:
            a.free()
        self.arrays = []
