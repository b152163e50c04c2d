"""Run a sample end to end on the GPU and check it against its numpy reference.

A sample's Python twin (docs/twins.md; checked by `twin.check_example`) provides
`example(rng, ...) -> dict` with:
  grid          launch grid
  inputs        {param: numpy array or scalar}: arrays go to the device (bf16 as ml_dtypes'
                bfloat16 arrays, or uint16 bit patterns)
  outputs       {param: numpy array}: shape/dtype templates; poisoned on the device first
  tensor_maps   {param: TensorMap options}: the map wraps the device array of the same name
  expected      {param: numpy array}: the reference (float arrays compare with rtol/atol)
  rtol, atol    tolerances (default exact)
  kernel        which kernel of the module to run (default: the only one)

With `-D NAME=VALUE` (`defines`), the sample is instantiated with those compile-time
parameters, and example() is called with `defines=` (as strings) when it takes that argument,
to size its data alike.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from .. import kernels as library
from .. import types as T
from ..errors import LaunchError
from ..runtime.dtypes import bf16_to_f32, f32_to_bf16, ml_float  # noqa: F401  (re-exported)
from .twin import Launch, check_example, check_launches

LIBRARY = Path(library.__file__).resolve().parent  # the kernel library's directory


@dataclass
class CheckResult:
    name: str
    ok: bool
    max_abs_err: float
    max_rel_err: float
    detail: str = ""
    exact: bool = False  # compared element for element (no tolerance): the errors mean nothing


def import_twin(path: str | Path) -> ModuleType:
    """The Python module x.py beside x.ptxdsl (or x.py itself), imported once per process: a
    library family (ptxdsl/kernels/) as its module `ptxdsl.kernels.x`, any other file by path
    as `ptxdsl_twin_x`, so that a module is never imported under two names."""
    twin = Path(path).with_suffix(".py").resolve()
    if twin.parent == LIBRARY:
        return importlib.import_module(f"{library.__name__}.{twin.stem}")
    name = f"ptxdsl_twin_{twin.stem}"
    mod = sys.modules.get(name)
    if mod is not None and Path(mod.__file__ or "") == twin:
        return mod
    spec = importlib.util.spec_from_file_location(name, twin)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = mod  # dataclasses look their module up while it is executed
    try:
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
    except BaseException:
        del sys.modules[name]
        raise
    return mod


def load_twin(path: str | Path) -> ModuleType:
    """The Python twin module (x.py) of a sample file (x.ptxdsl), with its example()."""
    p = Path(path)
    twin = p.with_suffix(".py")
    if not twin.is_file():
        raise LaunchError(f"{p}: no Python twin {twin.name} with an example() to run")
    mod = import_twin(twin)
    if not hasattr(mod, "example"):
        raise LaunchError(f"{twin} has no example(rng) function")
    return mod


def _as_float(a: np.ndarray, t: T.Scalar | None) -> np.ndarray:
    if t is not None and t.name == "bf16" and a.dtype == np.uint16:
        return bf16_to_f32(a)
    if ml_float(a.dtype):  # ml_dtypes' bfloat16 / fp8
        return a.astype(np.float64)
    return a.astype(np.float64) if a.dtype.kind == "f" else a


def poisoned(template: np.ndarray) -> np.ndarray:
    """An output array of the template's shape and dtype filled with 0xFF bytes, so that
    every element a kernel fails to write shows up."""
    t = np.ascontiguousarray(template)
    return np.full(t.nbytes, 0xFF, np.uint8).view(t.dtype).reshape(t.shape)


def run_example(program: Any, ex: dict, *, stream: Any = None) -> list[CheckResult]:
    """Launch `program` (a Program or KernelDef) on `ex` and compare with the reference."""
    from ..runtime import TensorMap, synchronize, to_device

    name = ex.get("kernel")
    prog = program.program() if hasattr(program, "program") else program
    info = prog.ptx_module.kernel(name)
    kernel = prog.kernel(info.name)
    arrays = {**ex.get("inputs", {}), **ex.get("outputs", {})}
    outputs = ex.get("outputs", {})
    device: dict[str, Any] = {}
    shared: dict[int, Any] = {}  # id(host array) -> its device buffer
    args: list[Any] = []
    for p in info.params:
        if p.name not in arrays:
            raise LaunchError(f"example for '{info.name}' gives no value for parameter "
                              f"'{p.name}'")
        value = arrays[p.name]
        if p.kind == "scalar":
            args.append(value)
            continue
        host = np.ascontiguousarray(value)
        if p.name in outputs:
            dev = to_device(poisoned(host), dtype=p.dtype)
        elif id(value) in shared:  # parameters given one array share its buffer (a map and
            dev = shared[id(value)]  # a pointer to the same workspace, say)
        else:
            dev = shared[id(value)] = to_device(host, dtype=p.dtype)
        device[p.name] = dev
        if p.kind == "tmap":
            opts = dict(ex.get("tensor_maps", {}).get(p.name, {}))
            args.append(TensorMap(dev, dtype=p.dtype, **opts))
        else:
            args.append(dev)
    kernel[ex["grid"], None, stream](*args)
    synchronize()
    results = []
    types = {p.name: p.dtype for p in info.params}
    for out, want in ex.get("expected", {}).items():
        got = device[out].copy_to_host()
        results.append(compare(out, got, want, types.get(out), ex.get("rtol", 0.0),
                               ex.get("atol", 0.0)))
    for dev in {id(d): d for d in device.values()}.values():
        dev.free()
    return results


def compare(name: str, got: np.ndarray, want: np.ndarray, t: T.Scalar | None,
            rtol: float, atol: float | np.ndarray) -> CheckResult:
    """`got` against the reference: exactly, or within atol + rtol * |want| element by element
    (`atol` a number, or an array that broadcasts against `want`)."""
    w = np.asarray(want)
    if ml_float(got.dtype) and w.dtype.kind == "u" and w.dtype.itemsize == got.itemsize:
        got = got.view(w.dtype)  # a bit-pattern reference for bfloat16 data: compare the bits
    # a reference given in the output's own dtype (e.g. bf16 bit patterns) compares bit for bit
    g = got.reshape(w.shape) if w.dtype == got.dtype else _as_float(got.reshape(w.shape), t)
    if rtol == 0.0 and not np.any(atol):
        differ = g != w
        bad = int(np.count_nonzero(differ))
        if not bad:
            return CheckResult(name, True, 0.0, 0.0, exact=True)
        first = np.unravel_index(int(np.argmax(differ)), w.shape) if w.ndim else ()
        at = "" if not w.ndim else f" at index {list(map(int, first))}"
        bits = t is not None and t.is_float and w.dtype.kind == "u"  # float bit patterns
        got_v, want_v = (f"{int(v):#x}" if bits else str(v) for v in (g[first], w[first]))
        return CheckResult(name, False, float("inf"), float("inf"),
                           f"{bad} of {w.size} elements differ; the first{at}: got "
                           f"{got_v}, want {want_v}", exact=True)
    g64, w64 = g.astype(np.float64), w.astype(np.float64)
    err = np.abs(g64 - w64)
    finite = np.isfinite(g64).all()
    max_abs = float(err.max()) if err.size else 0.0
    rel = float(np.linalg.norm(g64 - w64) / max(float(np.linalg.norm(w64)), 1e-30))
    ok = bool(finite and np.all(err <= atol + rtol * np.abs(w64)))
    shown = f"{atol}" if np.ndim(atol) == 0 else "the per-element atol"
    detail = "" if ok else ("non-finite values in the output" if not finite else
                            f"max |err| {max_abs:.3g} exceeds {shown} + rtol {rtol}·|ref|")
    return CheckResult(name, ok, max_abs, rel, detail)


def _example(mod: Any, rng: np.random.Generator, defines: dict | None, **kw: Any) -> dict:
    """The twin's example(), told the compile-time parameters when it takes them."""
    import inspect

    if defines:
        if "defines" not in inspect.signature(mod.example).parameters:
            raise LaunchError(f"-D is given, but the example() of {mod.__file__} takes no "
                              "defines= to size its data for them")
        kw["defines"] = defines
    if "kernel" in kw and "kernel" not in inspect.signature(mod.example).parameters:
        raise LaunchError(f"the sample has several kernels, but the example() of {mod.__file__} "
                          "takes no kernel= to say which one it sets up")
    return mod.example(rng, **kw)


def _examples(mod: Any, rng: np.random.Generator, defines: dict | None, sizes: dict,
              kernels: list[str], kernel: str | None) -> Iterator[tuple[str | None, Any]]:
    """(kernel name, example dict) of each run: one per kernel (or only `kernel`), called
    with kernel= in a file of several. In such a file an example() without a `kernel`
    argument is called once, for them all (name None), and returns their "launches"."""
    import inspect

    several = len(kernels) > 1
    names: list[str | None] = [kernel] if kernel else list(kernels)
    if several and "kernel" not in inspect.signature(mod.example).parameters:
        names = [None]
    for name in names:
        ex = _example(mod, rng, defines, **sizes, **({"kernel": name} if several and name
                                                     else {}))
        if name is None and not chained(ex):
            raise LaunchError(f"{mod.__file__}: example() takes no kernel=, so it is the one "
                              f"example of the file's {len(kernels)} kernels; it returns "
                              'their "launches" (docs/twins.md)')
        yield name, ex


def chained(ex: Any) -> bool:
    """Whether an example dict describes several launches (docs/twins.md)."""
    return isinstance(ex, dict) and "launches" in ex


def run_sample(path: str | Path, *, kernel: str | None = None, seed: int | None = None,
               arch: str | None = None, watchdog_ms: int = 0, defines: dict | None = None,
               small: bool = False
               ) -> list[tuple[str, list[CheckResult]]]:
    """Compile a .ptxdsl sample and run each of its kernels (or `kernel`) on fresh inputs
    (at the twin's SMALL interpreter sizes with `small`, as sanitizer runs want); a chained
    example's launches run in order."""
    from ..compiler import compile as compile_source

    prog = compile_source(Path(path), arch=arch, watchdog_ms=watchdog_ms, defines=defines)
    mod = load_twin(path)
    rng = np.random.default_rng(seed)
    sizes = getattr(mod, "SMALL", {}) if small else {}
    out = []
    for name, ex in _examples(mod, rng, defines, sizes, [k.name for k in prog.kernels],
                              kernel):
        if chained(ex):
            out.append(run_launches(prog, ex, check_launches(ex, prog.module, mod.example)))
            continue
        assert name is not None  # _examples names the kernel of every one-launch example
        check_example(ex, prog.module.kernel(name), mod.example)
        ex.setdefault("kernel", name)
        out.append((name, run_example(prog, ex)))
    return out


def run_launches(program: Any, ex: dict, launches: list[Launch], *, stream: Any = None
                 ) -> tuple[str, list[CheckResult]]:
    """Launch a chained example's launches in order on the GPU, over one device buffer per
    shared array, and compare with the reference after the last."""
    from ..runtime import TensorMap, synchronize, to_device

    prog = program.program() if hasattr(program, "program") else program
    shared = {**ex.get("inputs", {}), **ex.get("outputs", {})}
    device: dict[str, Any] = {}  # shared array name -> its device buffer
    own: list[Any] = []  # the buffers of arrays one launch is given in its "args"
    types: dict[str, Any] = {}
    for launch in launches:
        info = prog.ptx_module.kernel(launch.kernel)
        args: list[Any] = []
        for p in info.params:
            value = launch.values.get(p.name, shared.get(launch.arrays.get(p.name, "")))
            if p.kind == "scalar":
                args.append(value)
                continue
            if p.name in launch.values:
                dev = to_device(np.ascontiguousarray(value), dtype=p.dtype)
                own.append(dev)
            else:
                name = launch.arrays[p.name]
                types.setdefault(name, p.dtype)
                if name not in device:
                    host = np.ascontiguousarray(value)
                    device[name] = to_device(poisoned(host) if name in ex.get("outputs", {})
                                             else host, dtype=p.dtype)
                dev = device[name]
            args.append(TensorMap(dev, dtype=p.dtype, **launch.maps.get(p.name, {}))
                        if p.kind == "tmap" else dev)
        prog.kernel(info.name)[launch.grid, None, stream](*args)
    synchronize()
    results = [compare(o, device[o].copy_to_host() if o in device else np.asarray(shared[o]),
                       want, types.get(o), ex.get("rtol", 0.0), ex.get("atol", 0.0))
               for o, want in ex.get("expected", {}).items()]
    for dev in [*device.values(), *own]:
        dev.free()
    return " -> ".join(launch.kernel for launch in launches), results


def interp_sample(path: str | Path, *, kernel: str | None = None, seed: int = 0,
                  defines: dict | None = None, arch: str | None = None,
                  max_steps: int | None = None) -> list[tuple[str, list[CheckResult]]]:
    """Like run_sample, in the CPU interpreter, at the twin's SMALL example sizes
    (`max_steps`: the steps one CTA may take, `interp.run`'s default when None)."""
    from ..frontend import parse_file
    from ..interp import run_sample as interp_run
    from ..interp.run import DEFAULT_MAX_STEPS

    module = parse_file(path, defines)
    mod = load_twin(path)
    rng = np.random.default_rng(seed)
    out = []
    steps = max_steps or DEFAULT_MAX_STEPS
    for name, ex in _examples(mod, rng, defines, getattr(mod, "SMALL", {}),
                              [k.name for k in module.kernels], kernel):
        if chained(ex):
            out.append(_interp_launches(module, ex, mod.example, seed, arch, steps))
            continue
        assert name is not None  # _examples names the kernel of every one-launch example
        k = module.kernel(name)
        check_example(ex, k, mod.example)
        got = interp_run(k, ex, seed=seed, arch=arch, max_steps=steps)
        types = {p.name: getattr(p.type, "elem", None) for p in k.params}
        out.append((name, [compare(o, got[o], want, types.get(o), ex.get("rtol", 0.0),
                                   ex.get("atol", 0.0))
                           for o, want in ex.get("expected", {}).items()]))
    return out


def _interp_launches(module: Any, ex: dict, example: Any, seed: int, arch: str | None,
                     max_steps: int) -> tuple[str, list[CheckResult]]:
    """Run a chained example's launches in the interpreter, each reading what the ones
    before it wrote, and compare the shared arrays with the reference after the last."""
    from ..interp import run_sample as interp_run

    launches = check_launches(ex, module, example)
    arrays = {n: v.copy() if isinstance(v, np.ndarray) else v
              for n, v in ex.get("inputs", {}).items()}
    arrays |= {n: poisoned(v) for n, v in ex.get("outputs", {}).items()}
    types: dict[str, Any] = {}
    for launch in launches:
        k = module.kernel(launch.kernel)
        for p in k.params:
            if p.name in launch.arrays:
                types.setdefault(launch.arrays[p.name], getattr(p.type, "elem", None))
        inputs = {**{p: arrays[a] for p, a in launch.arrays.items()}, **launch.values}
        # every array comes back: the next launch reads what this one wrote
        got = interp_run(k, {"grid": launch.grid, "inputs": inputs, "tensor_maps": launch.maps,
                             "expected": dict.fromkeys(launch.arrays)},
                         seed=seed, arch=arch, max_steps=max_steps)
        for p, a in launch.arrays.items():
            arrays[a] = got[p]
    name = " -> ".join(launch.kernel for launch in launches)
    return name, [compare(o, arrays[o], want, types.get(o), ex.get("rtol", 0.0),
                          ex.get("atol", 0.0)) for o, want in ex.get("expected", {}).items()]
