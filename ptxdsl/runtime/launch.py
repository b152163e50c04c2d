"""`Kernel`: a loaded kernel plus its launch contract; checks every launch before the driver.

Launch settings (grid, block, cluster, smem) are checked against the KernelInfo in pure
Python, then turned into a `CUlaunchConfig` that is cached per setting, so a repeated launch
costs one dict lookup, one argument pack and the `cuLaunchKernelEx` call.
"""

from __future__ import annotations

import operator
import threading
from dataclasses import dataclass
from math import prod
from threading import get_ident
from typing import Any

from ..errors import DeviceError, LaunchError
from ..kernelinfo import KernelInfo
from ..target import PORTABLE_CLUSTER, target
from .args import ArgPacker
from .driver import (
    check,
    device_info,
    driver,
    ensure_current,
    failure_message,
    make_current,
    stream_handle,
)

_CONFIG_CACHE_SIZE = 256
_MAX_THREAD_PACKERS = 64


def _index(v: Any) -> int | None:
    """`v` as an int when it is one (numpy integers included, bools not), else None."""
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        return None
    return operator.index(v)


def _dims(value: Any, what: str) -> tuple[int, int, int]:
    seq = value if isinstance(value, (tuple, list)) else (value,)
    dims = [_index(v) for v in seq]
    if not 1 <= len(dims) <= 3 or None in dims:
        raise LaunchError(f"{what} must be an int or a tuple of 1 to 3 ints, got {value!r}")
    return tuple(dims) + (1,) * (3 - len(dims))  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """Checked launch settings: grid in blocks, block in threads, cluster in blocks or None."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    cluster: tuple[int, int, int] | None
    smem: int
    pdl: bool = False  # programmatic stream serialization (KernelInfo.pdl)


def plan_launch(
    info: KernelInfo,
    grid: Any,
    block: Any = None,
    cluster: Any = None,
    smem: Any = None,
    *,
    max_smem: int | None = None,
) -> LaunchPlan:
    """Check launch settings against `info`; unset ones take the KernelInfo's values.

    Raises LaunchError for a malformed or out-of-range grid, a block other than the kernel's
    `.reqntid`, a grid not divisible by the cluster, or too much dynamic shared memory."""
    g = _dims(grid, "grid")
    limits = (2**31 - 1, 65535, 65535)
    for axis, v, hi in zip("xyz", g, limits, strict=True):
        if not 1 <= v <= hi:
            raise LaunchError(f"grid.{axis} must be in [1, {hi}], got {v}")
    b = tuple(info.threads) if block is None else _dims(block, "block")
    if b != tuple(info.threads):
        raise LaunchError(
            f"block {b} does not match the kernel's .reqntid {tuple(info.threads)}; "
            "leave block unset to use it"
        )
    c: tuple[int, ...] | None = info.cluster if cluster is None else _dims(cluster, "cluster")
    t = target(info.arch)
    if c is not None:
        if any(v < 1 for v in c):
            raise LaunchError(f"cluster dims must be >= 1, got {c}")
        if prod(c) > t.max_cluster:
            raise LaunchError(
                f"cluster size {prod(c)} ({c[0]} x {c[1]} x {c[2]}) exceeds the maximum of "
                f"{t.max_cluster} CTAs"
            )
        for axis, gv, cv in zip("xyz", g, c, strict=True):
            if gv % cv:
                raise LaunchError(
                    f"grid {g} is not divisible by cluster {c} in dimension {axis} "
                    f"({gv} % {cv} = {gv % cv})"
                )
    s = info.smem_bytes if smem is None else _index(smem)
    if s is None or s < 0:
        raise LaunchError(f"smem must be a non-negative int (bytes), got {smem!r}")
    # before a device is queried the target's limit; a loaded kernel passes its device's
    limit = max_smem if max_smem is not None else t.smem_bytes
    if s > limit:
        raise LaunchError(
            f"smem must be at most {limit} bytes (the opt-in shared memory per block), got {s}"
        )
    return LaunchPlan(g, b, c, s, info.pdl)  # type: ignore[arg-type]


class LoadedFunction:
    """A CUfunction and the attributes ptxdsl has raised on it (shared by every Kernel that
    wraps the same function, so each attribute is set once)."""

    def __init__(self, handle: Any):
        self.handle = handle
        self._lock = threading.Lock()
        self._dyn_limit: int | None = None
        self._static_smem = 0
        self._non_portable = False

    def _attr(self, name: str) -> Any:
        drv = driver()
        return getattr(drv.CUfunction_attribute, f"CU_FUNC_ATTRIBUTE_{name}")

    def prepare(self, plan: LaunchPlan, name: str, device: int | None = None) -> None:
        """Raise the dynamic-smem limit and allow big clusters where the plan needs it
        (`device`: the function's GPU, whose opt-in limit applies; asking for this thread's
        device instead would make its context current in the middle of a launch)."""
        drv = driver()
        with self._lock:
            if self._dyn_limit is None:
                self._dyn_limit = int(
                    check(
                        drv.cuFuncGetAttribute(
                            self._attr("MAX_DYNAMIC_SHARED_SIZE_BYTES"), self.handle
                        ),
                        "cuFuncGetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
                    )
                )
                self._static_smem = int(
                    check(
                        drv.cuFuncGetAttribute(self._attr("SHARED_SIZE_BYTES"), self.handle),
                        "cuFuncGetAttribute(SHARED_SIZE_BYTES)",
                    )
                )
            if plan.smem > self._dyn_limit:
                optin = device_info(device).max_smem_optin
                if plan.smem + self._static_smem > optin:
                    raise LaunchError(
                        f"kernel '{name}' has {self._static_smem} bytes of static shared memory; "
                        f"with smem={plan.smem} that exceeds the opt-in maximum of {optin} "
                        f"bytes (smem can be at most {optin - self._static_smem})"
                    )
                check(
                    drv.cuFuncSetAttribute(
                        self.handle, self._attr("MAX_DYNAMIC_SHARED_SIZE_BYTES"), plan.smem
                    ),
                    f"cuFuncSetAttribute({name}, MAX_DYNAMIC_SHARED_SIZE_BYTES, {plan.smem})",
                )
                self._dyn_limit = plan.smem
            if plan.cluster and prod(plan.cluster) > PORTABLE_CLUSTER and not self._non_portable:
                check(
                    drv.cuFuncSetAttribute(
                        self.handle, self._attr("NON_PORTABLE_CLUSTER_SIZE_ALLOWED"), 1
                    ),
                    f"cuFuncSetAttribute({name}, NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)",
                )
                self._non_portable = True


def _launch_config(plan: LaunchPlan, stream: int) -> Any:
    drv = driver()
    cfg = drv.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = plan.grid
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = plan.block
    cfg.sharedMemBytes = plan.smem
    cfg.hStream = stream
    attrs = []
    if plan.cluster is not None:
        a = drv.CUlaunchAttribute()
        a.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = plan.cluster
        attrs.append(a)
    if plan.pdl:
        a = drv.CUlaunchAttribute()
        a.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        a.value.programmaticStreamSerializationAllowed = 1
        attrs.append(a)
    cfg.attrs = attrs
    cfg.numAttrs = len(attrs)
    return cfg


class Kernel:
    """A kernel ready to launch: `k.launch(*args, grid=..)` or `k[grid](*args)`.

    Arguments are matched to the KernelInfo's parameters by position or by name and
    checked (count, kind, range, element type) before anything reaches the driver. Without a
    loaded `function` (a KernelInfo alone) every check still runs, and a launch that passes
    them raises DeviceError. One Kernel may be launched from several threads at once: each
    thread packs its arguments into its own parameter storage."""

    def __init__(self, info: KernelInfo, function: LoadedFunction | None = None):
        self.info = info
        self.function = function
        self._packer = ArgPacker(info)
        # one packer (parameter storage) per launching thread, so launches need no lock; a
        # thread that has one has made the context current (load() did, or _launch)
        self._packers: dict[int, ArgPacker] = {get_ident(): self._packer}
        self._nparams = len(info.params)
        self._launchers: dict[Any, _Launcher] = {}  # k[key] -> its launcher (see __getitem__)
        self._configs: dict[tuple, Any] = {}
        self._max_smem = device_info().max_smem_optin if function is not None else None
        self._launch_ex: Any = None
        self._handle: Any = None  # function.handle, once a launch has been prepared
        self.watchdog: Any = None  # a watchdog.Report when compiled with the hang watchdog
        self.context: Any = None  # the driver.Context it was loaded in (set by load)

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def device(self) -> int | None:
        """The ordinal of the GPU the kernel was loaded on (None before loading)."""
        return None if self.context is None else self.context.ordinal

    def launch(
        self,
        *args: Any,
        grid: Any,
        block: Any = None,
        cluster: Any = None,
        smem: int | None = None,
        stream: Any = None,
        **kwargs: Any,
    ) -> None:
        """Launch on `grid` blocks (int or 1..3-tuple). `block` defaults to the kernel's
        `.reqntid` (and must equal it), `cluster` to KernelInfo.cluster, `smem` (dynamic
        shared memory in bytes) to KernelInfo.smem_bytes; `stream` None is the legacy
        default stream. Parameters named like these settings must be passed by position."""
        self._launch(args, kwargs, grid, block, cluster, smem, stream)

    __call__ = launch

    def __getitem__(self, key: Any) -> _Launcher:
        """`k[grid]`, `k[grid, block]` or `k[grid, block, stream]`, as in numba: a tuple key
        lists settings, so a 2-D grid is written `k[(gx, gy),]` or `k[(gx, gy), None]`.

        The launcher is kept per key (when the stream is None or an int handle), so
        `k[grid](args)` in a loop reuses one launcher and its checked configuration."""
        try:
            hit = self._launchers.get(key)
        except TypeError:  # unhashable settings (lists)
            hit = None
        if hit is not None:
            return hit
        items = key if isinstance(key, tuple) else (key,)
        if not 1 <= len(items) <= 3:
            raise LaunchError(
                f"use k[grid], k[grid, block] or k[grid, block, stream], got {len(items)} items"
            )
        grid, block, stream = (*items, None, None)[:3]
        if (
            block is not None
            and all(_index(v) is not None for v in items)
            and _dims(block, "block") != tuple(self.info.threads)
        ):
            raise LaunchError(
                f"k{list(items)} means grid={grid}, block={block}, but the kernel's block is "
                f"{tuple(self.info.threads)}; for a multi-dimensional grid write "
                f"k[{tuple(items)},]"
            )
        launcher = _Launcher(self, grid, block, stream)
        # a stream object is not kept: it could be destroyed while its launcher is cached
        if stream is None or type(stream) is int:
            try:
                if len(self._launchers) >= _CONFIG_CACHE_SIZE:
                    self._launchers.clear()
                self._launchers[key] = launcher
            except TypeError:
                pass
        return launcher

    def _launch(
        self,
        args: tuple,
        kwargs: dict,
        grid: Any,
        block: Any,
        cluster: Any,
        smem: Any,
        stream: Any,
    ) -> Any:
        """Check, pack and launch; returns the launch configuration used (for _Launcher)."""
        sh = stream if stream is None or type(stream) is int else stream_handle(stream)
        key = (grid, block, cluster, smem, sh)
        try:
            cfg = self._configs.get(key)
            cacheable = True
        except TypeError:  # unhashable settings (lists): check and build every time
            cfg, cacheable = None, False
        if cfg is None:
            cfg = self._prepare(
                args, kwargs, grid, block, cluster, smem, sh, key if cacheable else None
            )
        # the context is per thread; a new thread must make it current
        if self.context is None:
            ensure_current()
        else:
            make_current(self.context)
        params = self._thread_packer().pack(args, kwargs)
        err = self._launch_ex(cfg, self._handle, params, 0)[0]
        if err != 0:
            raise DeviceError(failure_message(err, f"cuLaunchKernelEx({self.name})"))
        if self.watchdog is not None:  # debug builds launch synchronously to report hangs
            self.watchdog.after_launch(self.info, sh or 0)
        return cfg

    def _prepare(
        self,
        args: tuple,
        kwargs: dict,
        grid: Any,
        block: Any,
        cluster: Any,
        smem: Any,
        stream: int | None,
        key: tuple | None,
    ) -> Any:
        plan = plan_launch(self.info, grid, block, cluster, smem, max_smem=self._max_smem)
        self._thread_packer().pack(args, kwargs)  # argument errors come before "not loaded"
        if self.function is None:
            raise DeviceError(
                f"kernel '{self.name}' is not loaded; get launchable kernels from "
                "ptxdsl.runtime.load(ptx_module)"
            )
        self.function.prepare(plan, self.name, self.device)
        cfg = _launch_config(plan, stream or 0)
        self._launch_ex = driver().cuLaunchKernelEx
        self._handle = self.function.handle
        if key is not None:
            if len(self._configs) >= _CONFIG_CACHE_SIZE:
                self._configs.clear()
            self._configs[key] = cfg
        return cfg

    def _thread_packer(self) -> ArgPacker:
        ident = get_ident()
        packer = self._packers.get(ident)
        if packer is None:
            if len(self._packers) >= _MAX_THREAD_PACKERS:  # threads come and go
                self._packers.clear()
            if self.function is not None:  # see _packers: a packer means a current context
                if self.context is None:
                    ensure_current()
                else:
                    make_current(self.context)
            packer = self._packers[ident] = self._packer.copy()
        return packer

    def __repr__(self) -> str:
        params = ", ".join(f"{p.name}: {p.kind}<{p.dtype}>" for p in self.info.params)
        return f"Kernel({self.name}({params}), threads={tuple(self.info.threads)})"


class _Launcher:
    """The callable of `k[grid, block, stream]`.

    Bound once (`launch = k[grid]`), it keeps the checked launch configuration after its
    first call, so a repeated `launch(*args)` costs the argument checks and packing and the
    driver call, nothing else."""

    __slots__ = ("kernel", "grid", "block", "stream", "_cfg")

    def __init__(self, kernel: Kernel, grid: Any, block: Any, stream: Any):
        self.kernel, self.grid, self.block, self.stream = kernel, grid, block, stream
        self._cfg: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        k, cfg = self.kernel, self._cfg
        if cfg is None or kwargs or len(args) != k._nparams or k.watchdog is not None:
            self._cfg = k._launch(args, kwargs, self.grid, self.block, None, None, self.stream)
            return
        packer = k._packers.get(get_ident()) or k._thread_packer()
        if k.context is not None:  # another device's kernel may have launched in between
            make_current(k.context)
        err = k._launch_ex(cfg, k._handle, packer.fast(*args), 0)[0]
        if err != 0:
            raise DeviceError(failure_message(err, f"cuLaunchKernelEx({k.name})"))
