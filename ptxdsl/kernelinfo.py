"""What the runtime needs to know about an emitted kernel, independent of the IR."""

from __future__ import annotations

from dataclasses import dataclass

from . import types as T
from .codegen.abi import param_bytes

# The hang watchdog's report: eight .u32 words of host-mapped memory that the first thread to
# time out fills in: site + 1, parity, block, thread, barrier offset, and the kind of site
WATCH_SPIN = 1  # report word 5: a spin loop on global memory (0: an mbarrier wait)


@dataclass(frozen=True, slots=True)
class ParamInfo:
    """One kernel parameter as the driver sees it.

    kind: "scalar" (`.param .<type>`), "ptr" (`.param .u64`, a device address), or "tmap"
    (`.param .align 64 .b8 name[128]`, a CUtensorMap passed by value). For "ptr" `dtype` is the
    element type; for "tmap" it is the element type and `rank` the tensor rank."""

    name: str
    kind: str
    dtype: T.Scalar
    rank: int = 0
    # for "tmap": the swizzle (bytes, 0 = none) that the shared buffers it fills or drains
    # declare, which the tensor map passed at launch must use; None when unconstrained
    swizzle: int | None = None
    buffer: str = ""  # the buffer that declares it (for the launch error)
    # for "tmap": the alignment (bytes) of the least aligned shared tile its copies reach,
    # which a swizzled tensor map must not exceed (0: not known), and that tile's buffer
    tile_align: int = 0
    tile: str = ""

    @property
    def nbytes(self) -> int:
        return param_bytes(self.kind, self.dtype)


@dataclass(frozen=True, slots=True)
class KernelInfo:
    """A kernel's launch contract: parameters, CTA shape, cluster shape, dynamic smem.

    `smem_bytes` is the dynamic shared memory to request at launch: the compiler's layout
    plus the slack that lets the kernel align its base in-kernel."""

    name: str
    params: tuple[ParamInfo, ...]
    threads: tuple[int, int, int]
    cluster: tuple[int, int, int] | None
    smem_bytes: int
    arch: str
    # with the hang watchdog: one description per bounded wait (site i reports i + 1)
    watch_sites: tuple[str, ...] = ()
    watchdog_ms: int = 0
    # launched with programmatic stream serialization: the kernel waits for the grids before
    # it itself (griddep_wait), so it may be scheduled before they end
    pdl: bool = False


@dataclass(frozen=True, slots=True)
class PtxModule:
    """Emitted PTX text and the launch contract of each kernel in it."""

    ptx: str
    kernels: tuple[KernelInfo, ...]
    arch: str

    def kernel(self, name: str | None = None) -> KernelInfo:
        if name is None:
            return self.kernels[0]
        for k in self.kernels:
            if k.name == name:
                return k
        raise KeyError(name)
