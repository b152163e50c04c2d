"""The GPU runtime of ptxdsl: compile PTX with nvJitLink, load it, build tensor maps, launch.

Importing this package neither imports `cuda.bindings.driver` nor touches the GPU; the
driver is initialised by the first call that needs it (`load`, `empty`, `TensorMap`, ...).

    m = load(ptx_module)                      # PtxModule from the compiler
    k = m["my_kernel"]
    x = to_device(np.arange(1024, dtype=np.float32))
    k[8](x, 1024)                             # grid 8; block, cluster, smem from KernelInfo
    synchronize()

Several GPUs: `device=` on load/empty/to_device/Stream/TensorMap (or `with use_device(1):`),
`enable_peer_access`, VMM memory (`vmm_alloc`, `import_handle`) and, across processes,
`ptxdsl.runtime.distributed`.
"""

from .compile import CacheStats, ptx_to_cubin
from .compile import stats as compile_stats
from .driver import (
    Context,
    DeviceInfo,
    check,
    context,
    current_device,
    device_attribute,
    device_count,
    device_info,
    gpu_available,
    synchronize,
    use_device,
)
from .dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from .graphs import Graph, capture
from .interop import DevicePointer, as_device_pointer
from .launch import Kernel, LaunchPlan, plan_launch
from .memory import DeviceArray, empty, to_device, zeros
from .module import LoadedModule, load
from .peer import (
    PeerAccessError,
    can_access_peer,
    check_reachable,
    disable_peer_access,
    enable_all_peer_access,
    enable_peer_access,
)
from .streams import Event, Stream
from .tensormap import TensorMap, clear_encode_cache, encode_cache_info
from .timing import benchmark, launch_overhead_us
from .vmm import ShareableHandle, VmmAllocation, import_handle, vmm_alloc

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
    "PeerAccessError",
    "ShareableHandle",
    "Stream",
    "TensorMap",
    "VmmAllocation",
    "as_device_pointer",
    "benchmark",
    "capture",
    "bf16_bits_to_f32",
    "can_access_peer",
    "check_reachable",
    "check",
    "clear_encode_cache",
    "compile_stats",
    "context",
    "current_device",
    "device_attribute",
    "device_count",
    "device_info",
    "disable_peer_access",
    "empty",
    "enable_all_peer_access",
    "enable_peer_access",
    "encode_cache_info",
    "f32_to_bf16_bits",
    "gpu_available",
    "import_handle",
    "launch_overhead_us",
    "load",
    "plan_launch",
    "ptx_to_cubin",
    "synchronize",
    "to_device",
    "use_device",
    "vmm_alloc",
    "zeros",
]
