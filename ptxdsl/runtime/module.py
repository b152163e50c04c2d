"""`load`: PTX module -> cubin (nvJitLink) -> CUmodule -> one `Kernel` per KernelInfo.

Modules that resize registers per warp (`setmaxnreg`, see `compile.whole_program`) are still
checked by nvJitLink but loaded as PTX, so that the driver JIT compiles them as whole programs;
their `info_log` is then the JIT's (empty when the driver's compute cache had the module).

Loaded modules are cached per context by the cubin's cache key, so loading the same PTX
again costs a hash and a dict lookup, and function attributes raised once stay raised.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ..errors import CompileError, LaunchError
from ..kernelinfo import PtxModule
from ..target import target
from .compile import c_string, cache_key, ptx_to_cubin, whole_program
from .driver import check, context, driver, failure_message, use_device
from .launch import Kernel, LoadedFunction


@dataclass
class _CuModule:
    handle: object
    functions: dict[str, LoadedFunction]
    watchdog: object = None
    jit_log: str = ""  # the driver JIT's info log (modules it compiled)


_lock = threading.Lock()
_modules: dict[tuple[int, str], _CuModule] = {}
_key_locks: dict[tuple[int, str], threading.Lock] = {}  # one per module being loaded
_loaded: dict[tuple[int, str, tuple], LoadedModule] = {}


class LoadedModule:
    """A PTX module loaded on the device: `m["name"]` or `m.kernel("name")` is a `Kernel`.

    `info_log` is ptxas's verbose report (registers, spills, shared memory) per kernel; for
    modules the driver JIT compiled (`compile.whole_program`, sm_80) it is the JIT's, empty
    when the driver's compute cache answered, and `cubin` holds the PTX it was given."""

    def __init__(self, ptx_module: PtxModule, cubin: bytes, info_log: str, kernels: dict):
        self.ptx_module = ptx_module
        self.cubin = cubin
        self.info_log = info_log
        self.kernels: dict[str, Kernel] = kernels

    def kernel(self, name: str | None = None) -> Kernel:
        """The kernel called `name`; the module's first kernel when `name` is None."""
        if name is None:
            if not self.kernels:
                raise LaunchError("the module has no kernels")
            return next(iter(self.kernels.values()))
        k = self.kernels.get(name)
        if k is None:
            have = ", ".join(f"'{n}'" for n in self.kernels) or "none"
            raise LaunchError(f"no kernel named '{name}' in this module; kernels: {have}")
        return k

    def __getitem__(self, name: str) -> Kernel:
        return self.kernel(name)

    def __repr__(self) -> str:
        return f"LoadedModule(kernels={list(self.kernels)})"


def load(ptx_module: PtxModule, device: int | None = None) -> LoadedModule:
    """Compile (cached) and load `ptx_module` in the primary context of `device` (default:
    this thread's device, see `use_device`). Its kernels launch on that device from any
    thread, whichever device is current.

    Raises CompileError when ptxas rejects the PTX and LaunchError when a KernelInfo names a
    kernel the PTX does not define."""
    if device is not None:
        with use_device(device):
            return load(ptx_module)
    ctx = context()
    names = [k.name for k in ptx_module.kernels]
    key = cache_key(ptx_module.ptx, ptx_module.arch)
    ctx_id = int(ctx.handle)
    loaded_key = (ctx_id, key, ptx_module.kernels)
    with _lock:
        hit = _loaded.get(loaded_key)
    if hit is not None:
        return hit
    # the driver JIT compiles the PTX of a target that asks for it (`Target.jit`) for this
    # device, and whole programs; nvJitLink still checks the latter (its cubin is cached but
    # not loaded)
    by_driver = target(ptx_module.arch).jit
    jit = by_driver or whole_program(ptx_module.ptx)
    info_log = ""
    if not by_driver:
        cubin, info_log = ptx_to_cubin(ptx_module.ptx, ptx_module.arch, names)
    if jit:
        cubin = ptx_module.ptx.encode() + b"\0"
    mod = _module(ctx_id, key, cubin, jit, ptx_module, names)
    with _lock:
        kernels = {k.name: Kernel(k, _function(mod, k.name)) for k in ptx_module.kernels}
        for k in kernels.values():
            k.watchdog = mod.watchdog
            k.context = ctx
        if jit:
            info_log = mod.jit_log
        result = _loaded.setdefault(loaded_key,
                                    LoadedModule(ptx_module, cubin, info_log, kernels))
    return result


def _module(ctx_id: int, key: str, image: bytes, jit: bool, ptx_module: PtxModule,
            names: list[str]) -> _CuModule:
    """The CUmodule of `key` in the context, loaded once. The driver JIT may take seconds:
    it runs under this module's own lock, so other modules load meanwhile, and a second
    thread asking for the same module waits for the first one's."""
    with _lock:
        mod = _modules.get((ctx_id, key))
        if mod is not None:
            return mod
        key_lock = _key_locks.setdefault((ctx_id, key), threading.Lock())
    with key_lock:
        with _lock:
            mod = _modules.get((ctx_id, key))
        if mod is not None:
            return mod
        jit_log = ""
        if jit:
            handle, jit_log = _jit_load(image, names)
        else:
            handle = check(driver().cuModuleLoadData(image), "cuModuleLoadData")
        mod = _CuModule(handle, {}, jit_log=jit_log)
        if any(k.watch_sites for k in ptx_module.kernels):
            from .watchdog import Report

            mod.watchdog = Report(handle)
        with _lock:
            _modules[(ctx_id, key)] = mod
        return mod


_LOG_BYTES = 1 << 16
# what the driver JIT answers for PTX it will not compile (the input's fault: CompileError with
# its log); any other failure (out of memory, a dead context) is the device's (DeviceError)
_REJECTED = ("CUDA_ERROR_INVALID_PTX", "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
             "CUDA_ERROR_INVALID_IMAGE", "CUDA_ERROR_NO_BINARY_FOR_GPU")


def _jit_load(ptx: bytes, names: list[str]) -> tuple[object, str]:
    """Load PTX through the driver JIT (a whole-program compile): the module and the JIT's
    verbose info log (empty when the driver's compute cache had it); CompileError with the
    JIT's error log when it rejects the PTX, DeviceError for any other failure."""
    drv = driver()
    opt = drv.CUjit_option
    info, error = bytearray(_LOG_BYTES), bytearray(_LOG_BYTES)
    options = [opt.CU_JIT_INFO_LOG_BUFFER, opt.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
               opt.CU_JIT_ERROR_LOG_BUFFER, opt.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
               opt.CU_JIT_LOG_VERBOSE]
    err, handle = drv.cuModuleLoadDataEx(ptx, len(options), options,
                                         [info, _LOG_BYTES, error, _LOG_BYTES, 1])
    which = ", ".join(f"'{n}'" for n in names)
    if err != 0 and any(err == getattr(drv.CUresult, n, None) for n in _REJECTED):
        log = c_string(error)
        raise CompileError(failure_message(err, f"the driver JIT of {which}")
                           + (f"\n{log}" if log else ""))
    check((err,), f"cuModuleLoadDataEx({which})")
    return handle, c_string(info)



def _function(mod: _CuModule, name: str) -> LoadedFunction:
    fn = mod.functions.get(name)
    if fn is None:
        drv = driver()
        res = drv.cuModuleGetFunction(mod.handle, name.encode())
        if res[0] == drv.CUresult.CUDA_ERROR_NOT_FOUND:
            raise LaunchError(
                f"kernel '{name}' is described by the module's KernelInfo but its PTX defines "
                f"no .entry of that name"
            )
        fn = mod.functions[name] = LoadedFunction(check(res, f"cuModuleGetFunction({name})"))
    return fn
