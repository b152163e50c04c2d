"""The GPU runtime of ptxdsl: compile PTX with nvJitLink, load it, build tensor maps, launch.

Importing this package neither imports `cuda.bindings.driver` nor touches the GPU; the
driver is initialised by the first call that needs it (`load`, `empty`, `TensorMap`, ...).

    m = load(ptx_module)                      # PtxModule from the compiler
    k = m["my_kernel"]
    x = to_device(np.arange(1024, dtype=np.float32))
    k[8](x, 1024)                             # grid 8; block, cluster, smem from KernelInfo
    synchronize()
"""

from .compile import CacheStats, ptx_to_cubin
from .compile import stats as compile_stats
from .driver import (
    Context,
    DeviceInfo,
    check,
    context,
    device_attribute,
    device_info,
    gpu_available,
    synchronize,
)
from .dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from .graphs import Graph, capture
from .interop import DevicePointer, as_device_pointer
from .launch import Kernel, LaunchPlan, plan_launch
from .memory import DeviceArray, empty, to_device, zeros
from .module import LoadedModule, load
from .streams import Event, Stream
from .tensormap import TensorMap, clear_encode_cache, encode_cache_info
from .timing import benchmark, launch_overhead_us

__all__ = [
    "CacheStats",
    "Context",
    "DeviceArray",
    "DeviceInfo",
    "DevicePointer",
    "Event",
    "Graph",
    "Kernel",
    "LaunchPlan",
    "LoadedModule",
    "Stream",
    "TensorMap",
    "as_device_pointer",
    "benchmark",
    "capture",
    "bf16_bits_to_f32",
    "check",
    "clear_encode_cache",
    "compile_stats",
    "context",
    "device_attribute",
    "device_info",
    "empty",
    "encode_cache_info",
    "f32_to_bf16_bits",
    "gpu_available",
    "launch_overhead_us",
    "load",
    "plan_launch",
    "ptx_to_cubin",
    "synchronize",
    "to_device",
    "zeros",
]
