"""ptxdsl: a PTX-emitting language for NVIDIA Hopper asynchronous-copy kernels.

Write kernels as .ptxdsl text or with the Python API (`@ptxdsl.kernel`); both build one IR,
which is checked and emitted as PTX. The GPU is touched only on the first launch.
"""

from . import ops  # noqa: F401  (registers every operation definition)
from .api import KernelContext, Value, array, ptr, tmap
from .compiler import KernelDef, Program, compile, compile_module, kernel
from .errors import CompileError, DeviceError, LaunchError, PtxdslError
from .frontend import parse, parse_file
from .printer import print_kernel, print_module
from .types import (
    b16,
    b32,
    b64,
    bf16,
    e4m3,
    e5m2,
    f16,
    f32,
    f64,
    pred,
    s8,
    s16,
    s32,
    s64,
    u8,
    u16,
    u32,
    u64,
)

__version__ = "0.1.0"

__all__ = [
    "CompileError", "DeviceError", "KernelContext", "KernelDef", "LaunchError", "Program",
    "PtxdslError", "Value", "array", "b16", "b32", "b64", "bf16", "compile", "compile_module",
    "e4m3", "e5m2", "f16",
    "f32", "f64", "kernel", "parse", "parse_file", "pred", "print_kernel", "print_module", "ptr",
    "s8", "s16", "s32", "s64", "tmap", "u8", "u16", "u32", "u64",
]  # fmt: skip


_RUNTIME = {"to_device", "empty", "zeros", "TensorMap", "DevicePointer", "DeviceArray",
            "synchronize", "Stream", "Event", "benchmark", "capture", "Graph"}


def __getattr__(name: str):
    """Runtime names (ptxdsl.to_device, ptxdsl.TensorMap, ...), imported on first use, and
    vector types by name: ptxdsl.f32x4, ptxdsl.bf16x8, ..."""
    if name in _RUNTIME:
        from . import runtime

        return getattr(runtime, name)
    from .types import Vector, parse_type_name

    t = parse_type_name(name)
    if isinstance(t, Vector):
        return t
    raise AttributeError(f"module 'ptxdsl' has no attribute '{name}'")
