"""VMM memory: physical memory on one GPU, mapped at one address for several GPUs, and
shareable with another process through a POSIX file descriptor.

    a = vmm_alloc(1 << 20, device=0, access=[0, 1])   # lives on GPU 0, reachable from 0 and 1
    x = a.array((1 << 18,), "u32")                    # a DeviceArray view (kernel argument)
    h = a.export()                                    # needs shareable=True; picklable
    b = import_handle(h, access=[1])                  # in another process: same memory

A `ShareableHandle` names the exporting process and its descriptor; the importer takes a
copy of the descriptor with `pidfd_getfd` (Linux >= 5.6), so no socket is needed: the
handle travels as a small picklable value (e.g. through torch.distributed, see
distributed.py). The exporter must keep the allocation alive until every importer has
imported it. No multicast objects are created here.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from ..errors import DeviceError, LaunchError
from .driver import check, device_context, device_ordinal, driver, make_current
from .dtypes import scalar_of
from .resource import Resource

_SYS_PIDFD_GETFD = 438  # x86_64 and aarch64
_PR_SET_PTRACER, _PR_SET_PTRACER_ANY = 0x59616D61, ctypes.c_ulong(-1)
_lock = threading.Lock()
_live: weakref.WeakValueDictionary[int, VmmAllocation] = weakref.WeakValueDictionary()


def mapping_of(address: int) -> VmmAllocation | None:
    """The live VmmAllocation of this process whose mapping contains `address`, if any."""
    with _lock:
        allocs = list(_live.values())
    for a in allocs:
        if a.ptr <= address < a.ptr + a.size:
            return a
    return None


@dataclass(frozen=True, slots=True)
class ShareableHandle:
    """What another process needs to map a VMM allocation: the exporter's pid and
    descriptor, the allocation's size and the GPU that holds it. Picklable."""

    pid: int
    fd: int
    size: int
    nbytes: int
    device: int

    def __post_init__(self) -> None:
        for name in ("pid", "fd", "size", "nbytes", "device"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise LaunchError(f"ShareableHandle.{name} must be an int >= 0, got {v!r}")
        if self.nbytes > self.size:
            raise LaunchError(
                f"ShareableHandle.nbytes ({self.nbytes}) exceeds its size ({self.size})"
            )


def granularity(device: Any) -> int:
    """The recommended VMM granularity of `device` in bytes (2 MiB on an H200)."""
    drv = driver()
    prop = _prop(device_ordinal(device), shareable=False)
    flag = drv.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
    return int(
        check(drv.cuMemGetAllocationGranularity(prop, flag), "cuMemGetAllocationGranularity")
    )


def _prop(device: int, shareable: bool) -> Any:
    drv = driver()
    prop = drv.CUmemAllocationProp()
    prop.type = drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device
    if shareable:
        prop.requestedHandleTypes = (
            drv.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        )
    return prop


class VmmAllocation(Resource):
    """VMM memory mapped into this process: `ptr` (its address here), `size` (bytes, a
    multiple of the granularity), `nbytes` (bytes asked for), `device` (the GPU holding
    it), `access` (GPUs that may use `ptr`). `free()` (or `close()`, the end of a `with`
    block, garbage collection) unmaps it; the memory itself lives on while another process
    still maps it."""

    noun, released = "VMM allocation", "freed"

    def __init__(
        self,
        ptr: int,
        size: int,
        nbytes: int,
        device: int,
        handle: Any,
        shareable: bool,
        imported_from: int | None = None,
    ):
        self.ptr, self.size, self.nbytes, self.device = ptr, size, nbytes, device
        self.handle = handle
        self.shareable = shareable
        self.imported_from = imported_from  # the exporter's pid for an imported allocation
        self.access: tuple[int, ...] = ()
        with _lock:
            _live[ptr] = self
        Resource.__init__(self)

    def set_access(self, devices: Any) -> None:
        """Let kernels on each of `devices` read and write the memory (adds to `access`)."""
        self._check_open()
        devs = sorted({device_ordinal(d) for d in devices})
        for d in devs:
            device_context(d)  # a clear error for an ordinal that does not exist
        drv = driver()
        descs = []
        for d in devs:
            a = drv.CUmemAccessDesc()  # one object per device: `[desc] * n` would alias
            a.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            a.location.id = d
            a.flags = drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            descs.append(a)
        if descs:
            check(
                drv.cuMemSetAccess(self.ptr, self.size, descs, len(descs)),
                f"cuMemSetAccess(GPUs {devs})",
            )
        self.access = tuple(sorted(set(self.access) | set(devs)))

    def export(self) -> ShareableHandle:
        """A handle another process can import (the allocation must be `shareable`)."""
        self._check_open()
        if not self.shareable:
            raise LaunchError(
                "this VMM allocation was not made shareable; allocate it with "
                "vmm_alloc(..., shareable=True) to export it"
            )
        if self._fd is None:
            drv = driver()
            kind = drv.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
            fd = check(
                drv.cuMemExportToShareableHandle(self.handle, kind, 0),
                "cuMemExportToShareableHandle",
            )
            self._fd = int(fd)
            allow_handle_import()
        return ShareableHandle(os.getpid(), self._fd, self.size, self.nbytes, self.device)

    _fd: int | None = None

    def array(
        self, shape: Any = None, dtype: Any = "u8", device: Any = None, offset: int = 0
    ) -> Any:
        """A DeviceArray view of the memory (no copy) for kernels on `device` (default: the
        first GPU in `access`); it keeps the allocation alive."""
        from math import prod

        from .memory import DeviceArray, _shape_of

        self._check_open()
        elem = scalar_of(dtype)
        if shape is None:
            shape = ((self.nbytes - offset) // elem.nbytes,)
        shape_t = _shape_of(shape)
        need = prod(shape_t) * elem.nbytes
        if offset < 0 or offset % 16 or offset + need > self.size:
            raise LaunchError(
                f"a view of {need} bytes at offset {offset} does not fit the "
                f"{self.size}-byte allocation (offsets are multiples of 16)"
            )
        dev = (
            device_ordinal(device)
            if device is not None
            else (self.access[0] if self.access else self.device)
        )
        return DeviceArray(self.ptr + offset, shape_t, elem, owned=False, device=dev, owner=self)

    def free(self) -> None:
        """Unmap and release, same as `close()` (views made by `array` must not be used
        afterwards)."""
        self.close()

    def _release(self) -> None:
        ptr, self.ptr = self.ptr, 0
        with _lock:
            _live.pop(ptr, None)
        drv = driver()
        make_current(
            device_context(
                self.device if self.imported_from is None else (self.access or (self.device,))[0]
            )
        )
        check(drv.cuMemUnmap(ptr, self.size), "cuMemUnmap")
        check(drv.cuMemAddressFree(ptr, self.size), "cuMemAddressFree")
        check(drv.cuMemRelease(self.handle), "cuMemRelease")
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __repr__(self) -> str:
        src = "" if self.imported_from is None else f", imported from pid {self.imported_from}"
        return (
            f"VmmAllocation(0x{self.ptr:x}, {self.nbytes} bytes on GPU {self.device}, "
            f"access={list(self.access)}{src})"
        )


def vmm_alloc(
    nbytes: int, device: Any, access: Any = None, shareable: bool = False
) -> VmmAllocation:
    """`nbytes` of VMM memory on GPU `device`, mapped for each GPU in `access` (default:
    just `device`); `shareable` lets `export()` hand it to another process."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
        raise LaunchError(f"nbytes must be a positive int, got {nbytes!r}")
    dev = device_ordinal(device)
    make_current(device_context(dev))
    gran = granularity(dev)
    size = -(-nbytes // gran) * gran
    drv = driver()
    handle = check(drv.cuMemCreate(size, _prop(dev, shareable), 0), "cuMemCreate")
    alloc = _map(handle, size, nbytes, dev, shareable, None)
    alloc.set_access([dev] if access is None else access)
    return alloc


def _map(
    handle: Any, size: int, nbytes: int, device: int, shareable: bool, pid: int | None
) -> VmmAllocation:
    drv = driver()
    try:
        va = int(check(drv.cuMemAddressReserve(size, 0, 0, 0), "cuMemAddressReserve"))
    except DeviceError:
        drv.cuMemRelease(handle)
        raise
    try:
        check(drv.cuMemMap(va, size, 0, handle, 0), "cuMemMap")
    except DeviceError:
        drv.cuMemAddressFree(va, size)
        drv.cuMemRelease(handle)
        raise
    return VmmAllocation(va, size, nbytes, device, handle, shareable, pid)


class StackedMapping(VmmAllocation):
    """Several VMM allocations of one size mapped back to back at one address range: piece i
    (allocation i's memory, on whichever GPU holds it) starts at `ptr + i * stride`. Made by
    `stack()`; kernels on `device` see every piece through one pointer or tensor map.
    `free()` unmaps the range; the allocations themselves stay as they were."""

    noun = "stacked VMM mapping"

    def __init__(self, ptr: int, stride: int, count: int, device: int):
        VmmAllocation.__init__(self, ptr, stride * count, stride * count, device, None, False)
        self.stride, self.count = stride, count

    def export(self) -> ShareableHandle:
        raise LaunchError("a stacked mapping cannot be exported; export its allocations")

    def _release(self) -> None:
        ptr, self.ptr = self.ptr, 0
        with _lock:
            _live.pop(ptr, None)
        drv = driver()
        make_current(device_context(self.device))
        check(drv.cuMemUnmap(ptr, self.size), "cuMemUnmap(stacked)")
        check(drv.cuMemAddressFree(ptr, self.size), "cuMemAddressFree(stacked)")

    def __repr__(self) -> str:
        return (f"StackedMapping(0x{self.ptr:x}, {self.count} x {self.stride} bytes, "
                f"for GPU {self.device})")


def stack(allocations: Any, device: Any) -> StackedMapping:
    """Map `allocations` (VmmAllocations of one size, e.g. every rank's memory of a
    SymmetricBuffer) back to back into a fresh address range, for kernels on `device`: one
    pointer or tensor map then reaches them all (piece i at `i * size` bytes)."""
    allocs = list(allocations)
    if not allocs or not all(isinstance(a, VmmAllocation) for a in allocs):
        raise LaunchError("stack() takes a non-empty list of VmmAllocations")
    sizes = {a.size for a in allocs}
    if len(sizes) != 1:
        raise LaunchError(f"stack() needs allocations of one size, got sizes {sorted(sizes)}")
    for a in allocs:
        a._check_open()
    dev = device_ordinal(device)
    make_current(device_context(dev))
    size = sizes.pop()
    drv = driver()
    total = size * len(allocs)
    va = int(check(drv.cuMemAddressReserve(total, 0, 0, 0), "cuMemAddressReserve(stacked)"))
    done = 0
    try:
        for i, a in enumerate(allocs):
            check(drv.cuMemMap(va + i * size, size, 0, a.handle, 0), f"cuMemMap(piece {i})")
            done += 1
    except DeviceError:
        for i in range(done):
            drv.cuMemUnmap(va + i * size, size)
        drv.cuMemAddressFree(va, total)
        raise
    m = StackedMapping(va, size, len(allocs), dev)
    try:
        m.set_access([dev])
    except DeviceError:
        m.free()
        raise
    return m


def import_handle(h: ShareableHandle, access: Any) -> VmmAllocation:
    """Map the memory behind another process's `ShareableHandle` into this one, for each
    GPU in `access`.

    Raises DeviceError naming the exporter when it has exited or closed the handle, or
    when this process may not take its descriptor."""
    if not isinstance(h, ShareableHandle):
        raise LaunchError(f"import_handle takes a ShareableHandle, got {type(h).__name__}")
    devs = [device_ordinal(d) for d in access]
    if not devs:
        raise LaunchError("import_handle needs at least one GPU in access=")
    fd = fd_from_process(h.pid, h.fd)
    try:
        drv = driver()
        make_current(device_context(devs[0]))
        kind = drv.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        handle = check(
            drv.cuMemImportFromShareableHandle(fd, kind),
            f"cuMemImportFromShareableHandle(handle of pid {h.pid})",
        )
    finally:
        os.close(fd)
    alloc = _map(handle, h.size, h.nbytes, h.device, False, h.pid)
    alloc.set_access(devs)
    return alloc


def fd_from_process(pid: int, fd: int) -> int:
    """A descriptor in this process for descriptor `fd` of process `pid` (pidfd_getfd)."""
    if pid == os.getpid():
        try:
            return os.dup(fd)
        except OSError as e:
            raise DeviceError(
                f"this process has no open handle descriptor {fd} "
                f"({e.strerror}): the allocation was freed"
            ) from None
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        raise DeviceError(
            f"the process that exported the handle (pid {pid}) has exited; its "
            "memory is gone with it (export from a process that stays alive "
            "until every importer has imported)"
        ) from None
    except OSError as e:
        raise DeviceError(f"cannot open process {pid}: {e.strerror}") from None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        got = libc.syscall(_SYS_PIDFD_GETFD, pidfd, fd, 0)
        if got < 0:
            err = ctypes.get_errno()
            if err == errno.ESRCH:
                raise DeviceError(
                    f"the process that exported the handle (pid {pid}) has "
                    "exited; its memory is gone with it"
                )
            if err == errno.EBADF:
                raise DeviceError(
                    f"process {pid} has no open descriptor {fd}: it freed the "
                    "allocation (or the handle is stale)"
                )
            if err == errno.EPERM:
                raise DeviceError(
                    f"not permitted to take descriptor {fd} of process {pid} "
                    "(pidfd_getfd needs ptrace rights: same user, and the "
                    "exporter calls export(), which allows it under Yama)"
                )
            raise DeviceError(f"pidfd_getfd({pid}, {fd}) failed: {os.strerror(err)}")
        return int(got)
    finally:
        os.close(pidfd)


def allow_handle_import() -> None:
    """Let other processes of this user take this process's descriptors (Yama
    ptrace_scope 1 allows it only to ancestors otherwise). Called by `export()`."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PTRACER, _PR_SET_PTRACER_ANY, 0, 0, 0)  # EINVAL without Yama: fine
    except OSError:
        pass
