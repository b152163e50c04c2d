"""The compile pipeline: source or Python kernel -> IR -> checks -> PTX, and the `Program`
object that loads it on the GPU on first launch."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import ir
from .api import build_kernel
from .bounds import stack_room
from .codegen.features import features_used
from .errors import CompileError
from .frontend import parse, read_source
from .kernelinfo import KernelInfo, PtxModule
from .target import default_target, target


def compile_module(module: ir.Module, arch: str | None = None,
                   source_name: str | None = None, watchdog_ms: int = 0) -> PtxModule:
    """PTX for an IR module: the passes of target `arch` run (`ptxdsl.target`), the emitter
    last. With no `arch`, sm_90, or sm_90a where a kernel uses what only sm_90a has
    (`ptxdsl.target.default_target`). PTXDSL_DUMP=DIR writes every stage (`ptxdsl.lower.dump`)."""
    from .lower import emit, lower
    from .lower.dump import StageDump

    t = target(arch)
    dump = StageDump.from_env(module)
    with stack_room():
        try:
            lowered = lower(module, t, watch=dump.stage if dump else None)
            if arch is None:
                t = default_target(features_used(lowered))
            ptx = emit(lowered, t, source_name, watchdog_ms)
        finally:
            if dump:
                dump.write_stages(t)  # also those before a pass that failed
    if dump:
        dump.write_ptx(t, ptx)
    return ptx


class Program:
    """Compiled kernels: PTX text, launch contracts, and launchers loaded on first use.

    `prog.name[grid](args)` or, for a one-kernel program, `prog[grid](args)`."""

    def __init__(self, module: ir.Module, arch: str | None = None, source_name: str | None = None,
                 watchdog_ms: int = 0, device: int | None = None):
        self.module = module
        self.ptx_module = compile_module(module, arch, source_name, watchdog_ms)
        self.device = device  # where launchers load; None: the thread's device at first use
        self._launchers: dict[Any, Any] = {}

    @property
    def ptx(self) -> str:
        return self.ptx_module.ptx

    @property
    def kernels(self) -> tuple[KernelInfo, ...]:
        return self.ptx_module.kernels

    def kernel(self, name: str | None = None, device: int | None = None):
        """The launcher of a kernel (the only one when `name` is None), loaded on `device`
        (default: the program's device, else the thread's device when first asked)."""
        if name is None:
            if len(self.kernels) != 1:
                names = ", ".join(k.name for k in self.kernels)
                raise KeyError(f"this program has several kernels ({names}); name one")
            name = self.kernels[0].name
        device = self.device if device is None else device
        key = name if device is None else (name, device)
        if key not in self._launchers:
            from .runtime import load

            self._launchers[key] = load(self.ptx_module, device).kernel(name)
        return self._launchers[key]

    @classmethod
    def compiled(cls, module: ir.Module, ptx_module: PtxModule) -> Program:
        """A Program over PTX already emitted for `module` (by a worker process: see
        ptxdsl.tools.precompile)."""
        p = object.__new__(cls)
        p.module, p.ptx_module, p.device, p._launchers = module, ptx_module, None, {}
        return p

    def on(self, device: int) -> Program:
        """This program with its launchers loaded on GPU `device` (`prog.on(1)[grid](...)`)."""
        other = object.__new__(Program)
        other.module, other.ptx_module, other.device = self.module, self.ptx_module, device
        other._launchers = self._launchers
        return other

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if any(k.name == name for k in self.ptx_module.kernels):
            return self.kernel(name)
        raise AttributeError(f"no kernel named '{name}' in this program")

    def __getitem__(self, launch: Any):
        return self.kernel()[launch]

    def __call__(self, *args: Any, **kwargs: Any):
        return self.kernel()(*args, **kwargs)


def compile(source: str | Path | KernelDef, arch: str | None = None,
            watchdog_ms: int = 0, device: int | None = None,
            defines: dict[str, object] | None = None) -> Program:
    """Compile .ptxdsl text, a .ptxdsl file path, or a @ptxdsl.kernel function.

    `defines` gives the compile-time kernel parameters of .ptxdsl source their values, as
    `-D NAME=VALUE` does on the command line: `compile("norms.ptxdsl", defines={"N": 4096})`.

    `watchdog_ms` > 0 makes every mbarrier wait give up after that long: the launch then
    raises DeviceError naming the barrier, parity, role, source line, block and thread
    (the CUDA context is unusable afterwards, as after any device fault).

    `device` is the GPU ordinal its kernels load and launch on (default: the thread's device
    when a kernel is first launched); `prog.on(d)` gives the same program on another GPU."""
    if isinstance(source, KernelDef):
        prog = source.program(arch, watchdog_ms)
        return prog if device is None else prog.on(device)
    if isinstance(source, Path) or (isinstance(source, str) and source.endswith(".ptxdsl")
                                    and "\n" not in source and "{" not in source):
        src = read_source(source)
        return Program(parse(src.text, src.name, defines), arch, src.name, watchdog_ms, device)
    return Program(parse(str(source), defines=defines), arch, watchdog_ms=watchdog_ms,
                   device=device)


class KernelDef:
    """A kernel written in Python with @ptxdsl.kernel: its IR, its PTX, and a launcher."""

    def __init__(self, kernel: ir.Kernel):
        self.ir = kernel
        self.module = ir.Module(kernels=(kernel,), loc=kernel.loc)
        self._programs: dict[tuple, Program] = {}

    @property
    def name(self) -> str:
        return self.ir.name

    def program(self, arch: str | None = None, watchdog_ms: int = 0) -> Program:
        key = (arch, watchdog_ms)
        if key not in self._programs:
            self._programs[key] = Program(self.module, arch, watchdog_ms=watchdog_ms)
        return self._programs[key]

    def ptx(self, arch: str | None = None) -> str:
        return self.program(arch).ptx

    def adopt(self, ptx_module: PtxModule, arch: str | None = None) -> None:
        """Take `ptx_module`, emitted from this kernel's IR elsewhere (a worker process), as
        the program of `arch`, instead of emitting it again."""
        self._programs.setdefault((arch, 0), Program.compiled(self.module, ptx_module))

    def __getitem__(self, launch: Any):
        return self.program().kernel()[launch]

    def __call__(self, *args: Any, **kwargs: Any):
        return self.program().kernel()(*args, **kwargs)


def kernel(fn: Callable[..., None] | None = None, *, threads: Any = None, cluster: Any = None,
           maxnreg: int | None = None, minctas: int | None = None,
           name: str | None = None, nonportable: bool = False) -> Any:
    """Decorator: build a kernel from a Python function `f(k, param: type, ...)`.

    `threads` is the exact CTA shape; `cluster` the cluster shape; `maxnreg` and `minctas`
    the register cap and the minimum CTAs per SM; `nonportable` allows clusters of more than
    8 (up to 16) CTAs."""

    def wrap(f: Callable[..., None]) -> KernelDef:
        if threads is None:
            from .api import _diag

            raise CompileError(_diag("@ptxdsl.kernel needs threads=N (the CTA shape)"))
        return KernelDef(build_kernel(f, name=name, threads=threads, cluster=cluster,
                                      maxnreg=maxnreg, minctas=minctas,
                                      nonportable=nonportable))

    return wrap(fn) if fn is not None else wrap
