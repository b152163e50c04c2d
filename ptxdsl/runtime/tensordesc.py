"""The sm_80 stand-in for a tensor map: a 128-byte tensor descriptor in the same parameter.

A kernel compiled for sm_80 copies tensor tiles with cp.async (see `ptxdsl.lower.sm80`), so
where sm_90a passes a CUtensorMap it reads the tensor's base address, shape, strides and
swizzle from this descriptor (layout in `ptxdsl.ops.sm80`). The same Python call works for
both builds: a `TensorMap` argument is turned into a descriptor from its own fields, and a
device array (torch, cupy, DeviceArray) may be passed directly.
"""

from __future__ import annotations

import struct
from typing import Any

from .. import types as T
from ..codegen.abi import DESC_BASE, DESC_DIMS, DESC_STRIDES, DESC_SWIZZLE, TMAP_BYTES
from ..errors import LaunchError
from ..kernelinfo import ParamInfo
from ..swizzle import mask, tma_swizzle_bytes
from .dtypes import compatible
from .interop import describe
from .tensormap import TensorMap

MAX_RANK = 5


def pack_desc(address: int, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int,
              swizzle: str = "none") -> bytes:
    """The 128 descriptor bytes; `shape` and byte `strides` in numpy order (outermost first)."""
    buf = bytearray(TMAP_BYTES)
    rank = len(shape)
    struct.pack_into("<Q", buf, DESC_BASE, address)
    for i in range(rank):
        dim, stride = shape[rank - 1 - i], strides[rank - 1 - i]
        if stride % itemsize:
            raise LaunchError(f"stride {stride} bytes is not a whole number of elements")
        struct.pack_into("<I", buf, DESC_DIMS + 4 * i, dim)
        struct.pack_into("<Q", buf, DESC_STRIDES + 8 * i, stride // itemsize)
    struct.pack_into("<I", buf, DESC_SWIZZLE, mask(tma_swizzle_bytes(swizzle)))
    return bytes(buf)


def desc_converter(p: ParamInfo):
    """Converter of a `tmap` parameter of an sm_80 kernel: TensorMap or device array ->
    descriptor bytes."""
    want = f"tmap<{p.dtype}, {p.rank}>"
    ok = frozenset(name for name, s in T.SCALARS.items() if compatible(p.dtype, s))

    def conv(v: Any) -> bytes:
        if type(v) is TensorMap:
            s = v.spec
            if s.mode != "tiled":
                raise LaunchError(f"argument '{p.name}': an {s.mode} tensor map has no sm_80 "
                                  "form")
            if s.oob_fill != "zero":
                raise LaunchError(f"argument '{p.name}': the tensor map fills out-of-bounds "
                                  f"elements with {s.oob_fill}; on sm_80 cp.async zero-fills "
                                  "them")
            addr, shape, strides, elem, swz = s.address, s.shape, s.strides, s.elem, s.swizzle
        else:
            d = describe(v, f"argument '{p.name}' ({want})")
            addr, shape, strides, elem, swz = d.ptr, d.shape, d.strides, d.elem, "none"
        if elem.name not in ok or len(shape) != p.rank:
            raise LaunchError(f"argument '{p.name}' is a tensor of {elem} with rank "
                              f"{len(shape)}; the kernel expects {want}")
        return pack_desc(addr, tuple(shape), tuple(strides), elem.nbytes, swz)

    return conv
