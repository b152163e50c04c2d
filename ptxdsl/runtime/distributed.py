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
from functools import cache
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


def join_nccl() -> tuple[int, int]:
    """A torchrun process's start: its GPU (LOCAL_RANK) made torch's current device and the
    NCCL process group joined on it. Returns (rank, world size)."""
    import torch  # type: ignore[import-not-found]
    import torch.distributed as dist  # type: ignore[import-not-found]

    dev = local_device()
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=torch.device("cuda", dev))
    return dist.get_rank(), dist.get_world_size()


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


# ----------------------------------------------------------------------------- all-reduce


@cache
def _all_reduce_program(dtype: str, world: int, unroll: int, device: int,
                        watchdog_ms: int) -> Any:
    from ..compiler import compile
    from ..kernels.all_reduce import make_all_reduce

    return compile(make_all_reduce(dtype, world, unroll=unroll), device=device,
                   watchdog_ms=watchdog_ms)


def report(failures: int, group: Any = None) -> int:
    """A multi-rank check's end (a collective): every rank's count of failures gathered,
    rank 0 prints "all ok" or the ranks that failed; the exit status, the same on every
    rank (1 when any failed)."""
    dist = _dist()
    totals: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(totals, failures, group=group)
    if dist.get_rank(group) == 0:
        print("all ok" if not any(totals) else f"FAILED on ranks "
              f"{[r for r, f in enumerate(totals) if f]}", flush=True)
    return 1 if any(totals) else 0


def expect_named_hang(launch: Any, rank: int, absent: int = 1) -> int:
    """The watchdog check of a multi-rank kernel: rank `absent` never launches; every other
    rank calls `launch()` (a kernel built with a watchdog, waiting for the absent peer, and
    the caller's synchronize) and must end in the watchdog's named DeviceError. Returns 0
    when it did (or this is the absent rank), 1 when the launch returned without an error."""
    if rank == absent:
        print(f"rank {rank}: not launching", flush=True)
        return 0
    try:
        launch()
    except DeviceError as e:
        print(f"rank {rank}: named error: {e}", flush=True)
        return 0
    print(f"rank {rank}: the launch returned without an error", flush=True)
    return 1


def agree(dist: Any, group: Any, what: str, values: tuple) -> None:
    """Raise on every rank unless every rank passed the same `values` (a collective), so a
    mismatch is an error everywhere instead of a kernel waiting for peers that never come."""
    seen: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(seen, values, group=group)
    if any(v != seen[0] for v in seen):
        table = ", ".join(f"rank {r}: {v}" for r, v in enumerate(seen))
        raise LaunchError(f"{what} differ across ranks ({table}); every rank must build "
                          "the same plan")


def on_device(x: Any, device: int, what: str) -> None:
    """Refuse (LaunchError) an array on another GPU than a plan's `device` (a torch tensor's
    device, or a DeviceArray's ordinal; an array that says neither passes)."""
    dev = getattr(x, "device", None)
    index = getattr(dev, "index", dev)
    if isinstance(index, int) and index != device:
        raise LaunchError(f"{what} is on GPU {index}; this plan runs on GPU {device}")


def refuse_capture(device: int, stream: Any, what: str) -> int:
    """The raw handle of `stream` on `device`, refused (LaunchError) while it is capturing a
    CUDA graph: a plan whose flags compare a launch count passed as a launch argument would
    replay that count frozen, and a replay would read peers' slots before they are written."""
    from .driver import check, device_context, driver, make_current, stream_handle

    make_current(device_context(device))  # stream 0 is the current context's
    handle = stream_handle(stream)
    status = check(driver().cuStreamIsCapturing(handle), "cuStreamIsCapturing")
    if int(status) != 0:
        raise LaunchError(f"{what} cannot be captured in a CUDA graph: its launch count is a "
                          "launch argument, which a replay would repeat; call it eagerly (or "
                          "reduce with NCCL inside the graph)")
    return handle


def one_stream(first: int | None, handle: int, what: str) -> int:
    """The stream a plan runs on: `handle` on its first call (`first` None), refused
    (LaunchError) when a later call's differs (launches e and e + 1 could then run out of
    order, and the flags assume they do not)."""
    if first is not None and handle != first:
        raise LaunchError(f"{what} plans run on one stream: this one first ran on stream "
                          f"{first:#x}, now {handle:#x} (calls on two streams could run out "
                          "of order); build a plan per stream")
    return handle


class AllReduce:
    """A plan to sum `n` elements of `dtype` ("bf16" or "f32") over the ranks of `group`,
    every rank getting the same bits (ptxdsl/kernels/all_reduce.py: f32 sums in rank order
    over peer memory; one-shot below `TWO_SHOT_BYTES` or at two ranks, two-shot above).

        ar = AllReduce(n, "bf16")                 # a collective: every rank builds one
        ar(x)                                     # x (n elements, any shape) summed in place
        ar(x, out)                                # or into out
        ar.input(); ar(None, out)                  # no copy: the input in its slot

    The plan owns symmetric memory (two input slots, used by turns, and the flags) and
    counts its calls; every rank calls it the same number of times, in the same order, on
    one stream each (torch's current stream when None and torch is loaded). x and out are
    contiguous device arrays (torch tensors, DeviceArrays), 16-byte aligned. `shots` 1 or 2
    forces a mode (0: by size). With `watchdog_ms`, a peer that never launches ends in a
    named DeviceError instead of a hang. Refused: a call under CUDA graph capture (a replay
    would repeat the launch count the flags compare), a call on another stream than the
    first, an out overlapping the input slots. Write `input()` in the plan's stream order
    (torch's copy_ on its current stream), not with a synchronous copy of another stream."""

    def __init__(self, n: int, dtype: str = "bf16", *, device: Any = None, group: Any = None,
                 watchdog_ms: int = 0, shots: int = 0):
        import numpy as np

        from ..kernels import all_reduce as ar
        from .driver import device_info

        dist = _dist()
        if dtype not in ar.DTYPES:
            raise LaunchError(f"all_reduce sums {' or '.join(ar.DTYPES)} elements, not {dtype!r}")
        if n < 1 or shots not in (0, 1, 2):
            raise LaunchError(f"all_reduce needs n >= 1 and shots 0, 1 or 2, got n={n}, "
                              f"shots={shots}")
        self.n, self.dtype, self.group = n, dtype, group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.device = local_device() if device is None else device_ordinal(device)
        self.shots = shots or (2 if ar.two_shot(n, dtype, self.world) else 1)
        self.grid = ar.grid_for(n, dtype, self.world, device_info(self.device).sm_count,
                                shots=self.shots)
        # the build: more vectors a thread in flight where a thread has several to move
        self.unroll = ar.unroll_for(n, dtype, self.world, self.grid, shots=self.shots)
        agree(dist, group, "all-reduce plans (n, dtype, shots, grid, unroll)",
              (n, dtype, self.shots, self.grid, self.unroll))
        self.slot = ar.slot_elems(n, dtype)
        self.buf = SymmetricBuffer(2 * self.slot * ar.DTYPES[dtype].nbytes, dtype,
                                   device=self.device, group=group)
        words = ar.flag_words(self.grid, self.world)
        self.sig = SymmetricBuffer(words * 4, "u32", device=self.device, group=group)
        self.sig.local.copy_from_host(np.zeros(self.sig.local.shape, np.uint32))
        self.sig.barrier()  # every rank's flags are zero before any launch
        self._all = self.buf.stacked().array(dtype=dtype)
        self._sig_all = self.sig.stacked().array(dtype="u32")
        self.prog = _all_reduce_program(dtype, self.world, self.unroll, self.device,
                                        watchdog_ms)
        self.kernel = self.prog.kernel(device=self.device)
        self.epoch = 0
        self._checked: dict = {}
        self._stream: int | None = None  # the stream of the first call: every call's

    def input(self) -> Any:
        """The slot the next call reads when it is given no x: write the input there."""
        return self.buf.allocations[self.rank].array(
            (self.n,), self.dtype, device=self.device,
            offset=(self.epoch + 1) % 2 * self.slot * self._all.elem.nbytes)

    def _check(self, x: Any, what: str) -> None:
        from .interop import contiguous_strides, describe, layout_key

        key = layout_key(x)
        if key is not None and key in self._checked:
            return
        d = describe(x, what)
        count = 1
        for s in d.shape:
            count *= s
        if count != self.n or d.elem.name != self.dtype:
            raise LaunchError(f"{what} must hold {self.n} {self.dtype} elements, got {d.elem} "
                              f"{d.shape}")
        on_device(x, self.device, what)
        if d.strides != contiguous_strides(d.shape, d.elem.nbytes) or d.ptr % 16:
            raise LaunchError(f"{what} must be contiguous and 16-byte aligned (the kernel "
                              f"moves 16-byte vectors), got strides {d.strides} (bytes) at "
                              f"address {d.ptr:#x}")
        if key is not None:
            if len(self._checked) > 64:
                self._checked.clear()
            self._checked[key] = True

    def __call__(self, x: Any = None, out: Any = None, stream: Any = None) -> Any:
        """Sum x over the ranks into out (default: x itself; with no x, the input written into
        `input()`, summed into out). Returns out."""
        import sys

        from ..kernels.all_reduce import arguments

        if x is not None:
            self._check(x, "all_reduce input")
        out = x if out is None else out
        if out is None:
            raise LaunchError("all_reduce with no input (it is in input()) needs an out array")
        self._check(out, "all_reduce output")
        if stream is None and "torch" in sys.modules:
            import torch  # type: ignore[import-not-found]

            stream = torch.cuda.current_stream(self.device).cuda_stream
        self._refuse(stream, out)
        args = arguments(x, out, self._all, self.buf.stride // self._all.elem.nbytes, self.slot,
                         self._sig_all, self.sig.stride // 4, self.rank, self.n, self.epoch + 1,
                         self.shots)
        self.kernel[self.grid, None, stream](*args.values())  # positional: the fast path
        self.epoch += 1  # launches enqueued (a refused one does not count)
        return out

    def _refuse(self, stream: Any, out: Any) -> None:
        """What the flag protocol cannot take: a call captured in a CUDA graph
        (`refuse_capture`), and what `_apart` refuses."""
        from .interop import describe

        handle = refuse_capture(self.device, stream, "all_reduce")
        self._apart(handle, describe(out, "all_reduce output").ptr)

    def _apart(self, handle: int, out_ptr: int) -> None:
        """Refuse a call on another stream than the first (`one_stream`) and an out
        overlapping this rank's input slots (the kernel would write sums where peers are
        reading)."""
        self._stream = one_stream(self._stream, handle, "all_reduce")
        lo = self.buf.local.ptr
        end = out_ptr + self.n * self._all.elem.nbytes
        if out_ptr < lo + self.buf.nbytes and lo < end:
            raise LaunchError("all_reduce's output overlaps this rank's input slots (peers "
                              "read them while the kernel writes out): give an array of "
                              "its own")

    def free(self) -> None:
        """Release the symmetric memory (a collective)."""
        self.buf.free()
        self.sig.free()


_plans: dict[tuple, AllReduce] = {}


def all_reduce(x: Any, out: Any = None, *, group: Any = None, stream: Any = None) -> Any:
    """torch.distributed.all_reduce's sum, on symmetric memory: x (a contiguous bf16 or f32
    device array, 16-byte aligned) summed over the ranks of `group` into out (default: in
    place), every rank getting the same bits. The first call for a size, type and group
    builds its plan (a collective) and keeps it until `free_all_reduce_plans()`."""
    from .interop import describe

    d = describe(x, "all_reduce input")
    n = 1
    for s in d.shape:
        n *= s
    dev = getattr(x, "device", None)  # a torch device, or a DeviceArray's ordinal
    device = getattr(dev, "index", dev)
    device = device if isinstance(device, int) else local_device()
    # the group itself (not its id, which a collected group's successor may reuse) and
    # the stream: a plan runs on one stream
    key = (n, d.elem.name, device, group, _stream_of(stream, device))
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = AllReduce(n, d.elem.name, device=device, group=group)
    return plan(x, out, stream)


def _stream_of(stream: Any, device: int) -> int:
    """The raw stream a call runs on: `stream`, or torch's current one on `device` where
    torch is loaded (as AllReduce.__call__ picks it), else the legacy default stream."""
    import sys

    from .driver import stream_handle

    if stream is None and "torch" in sys.modules:
        import torch  # type: ignore[import-not-found]

        return int(torch.cuda.current_stream(device).cuda_stream)
    return stream_handle(stream)


def free_all_reduce_plans() -> None:
    """Free every plan `all_reduce` built (a collective: every rank calls it)."""
    for plan in _plans.values():
        plan.free()
    _plans.clear()
