"""Peer access between GPUs, and the check that a GPU can reach a given address.

`enable_peer_access(device, peer)` lets kernels on `device` read and write `cuMemAlloc`
memory of `peer` (one direction; `enable_all_peer_access()` does every pair). VMM memory
needs no peer access: `cuMemSetAccess` grants it per device (see vmm.py).

`check_reachable(address, device)` answers, before a launch, whether GPU `device` may touch
`address`: its own memory always; VMM memory when it is mapped for `device`; another GPU's
`cuMemAlloc` memory once peer access from `device` to that GPU is enabled (by ptxdsl, or
by `enable_peer_access` finding it already enabled). A kernel that touches memory it cannot
reach faults with a sticky `CUDA_ERROR_ILLEGAL_ADDRESS`; the check turns that into an error
naming both GPUs and the call that fixes it.
"""

from __future__ import annotations

import threading
from typing import Any

from ..errors import LaunchError
from .driver import (
    check,
    device_context,
    device_ordinal,
    driver,
    keeping_current,
    make_current,
)

_lock = threading.Lock()
_enabled: set[tuple[int, int]] = set()  # (accessor, owner) pairs with peer access on


class PeerAccessError(LaunchError):
    """A GPU cannot reach the memory it was given."""


def _count() -> int:
    from .driver import device_count

    return device_count()


def peer_problem(device: int, peer: int, count: int, can_access: bool | None) -> str | None:
    """Why `device` cannot get peer access to `peer` (None when it can); pure, for tests."""
    if device == peer:
        return f"peer access from GPU {device} to itself: a GPU always reaches its own memory"
    if count == 0:
        return "no CUDA device is visible, so there is no peer access to enable"
    for d in (device, peer):
        if d >= count:
            return (
                f"GPU {d} does not exist: this process sees {count} device(s) "
                f"(ordinals 0..{count - 1})"
            )
    if can_access is False:
        return (
            f"GPU {device} cannot access GPU {peer}'s memory: cuDeviceCanAccessPeer({device}, "
            f"{peer}) is 0 (no NVLink or PCIe peer-to-peer path between them); copy through "
            f"the host, or run the kernel on GPU {peer}"
        )
    return None


def can_access_peer(device: Any, peer: Any) -> bool:
    """cuDeviceCanAccessPeer: whether kernels on `device` can reach memory of `peer`."""
    d, p = device_ordinal(device), device_ordinal(peer, "peer")
    problem = peer_problem(d, p, _count(), None)
    if problem is not None:
        raise PeerAccessError(problem)
    dc, pc = device_context(d), device_context(p)
    return bool(
        check(driver().cuDeviceCanAccessPeer(dc.device, pc.device), "cuDeviceCanAccessPeer")
    )


def enable_peer_access(device: Any, peer: Any) -> None:
    """Let kernels on GPU `device` access `cuMemAlloc` memory of GPU `peer` (idempotent).

    Raises PeerAccessError when the ordinals are bad, equal, or the GPUs cannot reach each
    other."""
    d, p = device_ordinal(device), device_ordinal(peer, "peer")
    if (d, p) in _enabled:
        return
    problem = peer_problem(d, p, _count(), can_access_peer(d, p) if d != p else None)
    if problem is not None:
        raise PeerAccessError(problem)
    drv = driver()
    with _lock, keeping_current():
        make_current(device_context(d))
        err = drv.cuCtxEnablePeerAccess(device_context(p).handle, 0)[0]
        if err not in (0, drv.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED):
            check((err,), f"cuCtxEnablePeerAccess(GPU {d} -> GPU {p})")
        _enabled.add((d, p))


def disable_peer_access(device: Any, peer: Any) -> None:
    """Undo `enable_peer_access(device, peer)` (a no-op when it is not enabled)."""
    d, p = device_ordinal(device), device_ordinal(peer, "peer")
    drv = driver()
    with _lock, keeping_current():
        make_current(device_context(d))
        err = drv.cuCtxDisablePeerAccess(device_context(p).handle)[0]
        if err not in (0, drv.CUresult.CUDA_ERROR_PEER_ACCESS_NOT_ENABLED):
            check((err,), f"cuCtxDisablePeerAccess(GPU {d} -> GPU {p})")
        _enabled.discard((d, p))


def enable_all_peer_access(devices: Any = None) -> list[int]:
    """Enable peer access in both directions between every pair of `devices` (default:
    every visible GPU); returns the ordinals."""
    devs = list(range(_count())) if devices is None else [device_ordinal(d) for d in devices]
    for d in devs:
        for p in devs:
            if d != p:
                enable_peer_access(d, p)
    return devs


def peer_enabled(device: int, peer: int) -> bool:
    """Whether ptxdsl enabled (or found enabled) peer access from `device` to `peer`."""
    return device == peer or (device, peer) in _enabled


# ----------------------------------------------------------------------------- reachability


def owner_of(address: int) -> int:
    """The ordinal of the GPU whose memory holds `address`: the device of the context that
    allocated it (CU_POINTER_ATTRIBUTE_CONTEXT), else CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL.

    Raises PeerAccessError for an address CUDA does not know."""
    from . import driver as rd

    drv = driver()
    attrs = drv.CUpointer_attribute
    err, ctx = drv.cuPointerGetAttribute(attrs.CU_POINTER_ATTRIBUTE_CONTEXT, address)
    if err == 0 and int(ctx):
        for c in list(rd._contexts.values()):
            if int(c.handle) == int(ctx):
                return c.ordinal
        # another library's context (torch's primary context, say): ask it for its device;
        # CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL reads 0 for such memory on an H100 pair
        if drv.cuCtxPushCurrent(ctx)[0] == 0:
            try:
                err, dev = drv.cuCtxGetDevice()
            finally:
                drv.cuCtxPopCurrent()
            if err == 0:
                return int(dev)
    err, ordinal = drv.cuPointerGetAttribute(attrs.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, address)
    if err != 0:
        raise PeerAccessError(
            f"0x{address:x} is not GPU memory that CUDA knows in this process "
            "(freed, or never allocated)"
        )
    return int(ordinal)


def vmm_access(address: int, device: int) -> tuple[int, bool] | None:
    """For VMM memory (cuMemCreate, or imported from another process): the GPU holding it
    and whether `device` may read and write it through this address; None for other memory."""
    from .vmm import mapping_of

    mine = mapping_of(address)  # ptxdsl's own mappings (any address inside them)
    if mine is not None:
        return mine.device, device in mine.access
    drv = driver()
    err, handle = drv.cuMemRetainAllocationHandle(address)
    if err != 0:  # not mapped from a generic allocation handle: not VMM memory
        return None
    try:
        prop = check(
            drv.cuMemGetAllocationPropertiesFromHandle(handle),
            "cuMemGetAllocationPropertiesFromHandle",
        )
        owner = int(prop.location.id)
    finally:
        drv.cuMemRelease(handle)
    loc = drv.CUmemLocation()
    loc.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    loc.id = device
    err, flags = drv.cuMemGetAccess(loc, address)
    rw = err == 0 and int(flags) == int(drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
    return owner, rw


def reach_problem(
    address: int, device: int, owner: int, vmm: bool | None, peer_on: bool, what: str
) -> str | None:
    """Why GPU `device` cannot reach `address` on GPU `owner` (None when it can); pure."""
    where = f"{what} at 0x{address:x} is memory of GPU {owner}"
    if vmm is not None:
        if vmm:
            return None
        return (
            f"{where} (a VMM allocation), but its mapping at this address is not granted "
            f"to GPU {device}; grant it with allocation.set_access([{device}]), or use a "
            f"mapping made for GPU {device}"
        )
    if owner == device or peer_on:
        return None
    return (
        f"{where}, but GPU {device} has no peer access to GPU {owner}; call "
        f"ptxdsl.runtime.enable_peer_access({device}, {owner}) first, or build it for "
        f"device={owner}"
    )


def check_reachable(obj: Any, device: Any, what: str = "the memory") -> None:
    """Raise PeerAccessError unless kernels on GPU `device` can reach `obj` (a device array,
    DevicePointer or int address)."""
    from .interop import as_device_pointer

    d = device_ordinal(device)
    address = as_device_pointer(obj).address
    with keeping_current():
        make_current(device_context(d))
        vmm = vmm_access(address, d)
        owner, mapped = (owner_of(address), None) if vmm is None else vmm
    problem = reach_problem(address, d, owner, mapped, peer_enabled(d, owner), what)
    if problem is not None:
        raise PeerAccessError(problem)
