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
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from .. import kernels as library
from .. import types as T
from ..errors import LaunchError
from ..runtime.dtypes import bf16_to_f32, f32_to_bf16, ml_float  # noqa: F401  (re-exported)
from .twin import check_example

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
        if p.name in outputs:  # poison: every element the kernel fails to write shows up
            host = np.full(host.nbytes, 0xFF, np.uint8).view(host.dtype).reshape(host.shape)
            dev = to_device(host, dtype=p.dtype)
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


def run_sample(path: str | Path, *, kernel: str | None = None, seed: int | None = None,
               arch: str | None = None, watchdog_ms: int = 0, defines: dict | None = None,
               small: bool = False
               ) -> list[tuple[str, list[CheckResult]]]:
    """Compile a .ptxdsl sample and run each of its kernels (or `kernel`) on fresh inputs
    (at the twin's SMALL interpreter sizes with `small`, as sanitizer runs want)."""
    from ..compiler import compile as compile_source

    prog = compile_source(Path(path), arch=arch, watchdog_ms=watchdog_ms, defines=defines)
    mod = load_twin(path)
    rng = np.random.default_rng(seed)
    names = [kernel] if kernel else [k.name for k in prog.kernels]
    out = []
    sizes = getattr(mod, "SMALL", {}) if small else {}
    for name in names:
        ex = _example(mod, rng, defines, **sizes,
                      **({"kernel": name} if len(prog.kernels) > 1 else {}))
        check_example(ex, prog.module.kernel(name), mod.example)
        ex.setdefault("kernel", name)
        out.append((name, run_example(prog, ex)))
    return out


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
    names = [kernel] if kernel else [k.name for k in module.kernels]
    out = []
    small = getattr(mod, "SMALL", {})
    for name in names:
        ex = _example(mod, rng, defines, **small,
                      **({"kernel": name} if len(module.kernels) > 1 else {}))
        check_example(ex, module.kernel(name), mod.example)
        got = interp_run(module.kernel(name), ex, seed=seed, arch=arch,
                         max_steps=max_steps or DEFAULT_MAX_STEPS)
        types = {p.name: getattr(p.type, "elem", None) for p in module.kernel(name).params}
        out.append((name, [compare(o, got[o], want, types.get(o), ex.get("rtol", 0.0),
                                   ex.get("atol", 0.0))
                           for o, want in ex.get("expected", {}).items()]))
    return out
