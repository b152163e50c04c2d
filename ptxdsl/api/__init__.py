"""The Python API: build kernels with ordinary Python, through the same KernelBuilder as the
text frontend.

    @ptxdsl.kernel(threads=256)
    def add_one(k, src: ptxdsl.ptr(ptxdsl.f32), dst: ptxdsl.ptr(ptxdsl.f32)):
        tile = k.shared("tile", ptxdsl.f32, [2048])
        ...

Every call records the user's own source line, so errors point there. `values` holds the
symbolic Value and the parameter types, `context` the kernel context and build_kernel.
"""

from .context import KernelContext, build_kernel
from .values import Value, _diag, array, ptr, tmap, user_span

__all__ = ["KernelContext", "Value", "_diag", "array", "build_kernel", "ptr", "tmap",
           "user_span"]
