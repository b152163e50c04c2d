"""The twin's example() dict checked against the kernel before a run (docs/twins.md).

The GPU runner and the interpreter would otherwise meet a bad dict deep inside a launch
("must be a TensorMapModel, got ndarray", or a deadlock); here each problem names the twin
file, the key and the form it expects, and all of them are reported at once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .. import ir
from .. import types as T
from ..errors import Diagnostic, LaunchError, Note, Span, python_source
from ..interp.run import grid_dims
from ..interp.tensormap import TensorMapModel, short_box_message, short_boxes
from ..runtime.dtypes import ml_float

_MODEL_OPTIONS = ("box", "swizzle", "oob_fill")  # what the interpreter's model checks
OPTIONS = (*_MODEL_OPTIONS, "l2_promotion", "interleave")  # the GPU's TensorMap takes these too


def check_example(ex: Any, kernel: ir.Kernel, example: Any) -> None:
    """LaunchError listing every way `ex` (what the twin's function `example` returned) does
    not fit `kernel`: a missing key, a tensor-map parameter with no `tensor_maps` entry, a box
    the encoder refuses, a box whose bytes differ from the stage buffer a derived expect_tx
    counts. Each is located at the twin's `def example`."""
    at = _def_span(example)
    if not isinstance(ex, dict):
        raise LaunchError(Diagnostic(f"example() returned a {type(ex).__name__}; expected a "
                                     'dict with "grid", "inputs", "outputs" and "expected"', at))
    problems: list[Diagnostic] = []
    if "grid" not in ex:
        problems.append(Diagnostic('example() returned no "grid"; expected "grid": n or '
                                   "(x, y, z)", at))
    else:
        try:
            grid_dims(ex["grid"])
        except LaunchError:
            problems.append(Diagnostic(f'"grid" is {ex["grid"]!r}; expected n or (x, y, z), '
                                       "1 to 3 positive integers", at))
    problems += _dicts(ex, "parameter", at)
    if problems:
        raise LaunchError(problems)
    problems += [Diagnostic(f"outputs['{n}'] is a {type(v).__name__}; expected a numpy array, "
                            "the template (shape and dtype) of what the kernel writes", at)
                 for n, v in ex.get("outputs", {}).items() if not isinstance(v, np.ndarray)]
    arrays = {**ex.get("inputs", {}), **ex.get("outputs", {})}
    maps = ex.get("tensor_maps", {})
    for p in kernel.params:
        if p.name not in arrays:
            where = "an array in" if isinstance(p.type, (T.Ptr, T.TensorMap)) else "a value in"
            problems.append(Diagnostic(f"parameter '{p.name}' ({p.type}) of kernel "
                                       f"'{kernel.name}' has no value; expected {where} "
                                       '"inputs" (or "outputs", where the kernel writes it)', at))
    problems += _unnamed_references(ex, arrays, "the run", at)
    problems += _reference_problems(ex, arrays, at)
    for p in kernel.params:
        if isinstance(p.type, T.TensorMap):
            problems += _map_problems(p.name, p.type, kernel, arrays.get(p.name),
                                      maps.get(p.name), at)
    for name in maps:
        if not any(p.name == name and isinstance(p.type, T.TensorMap) for p in kernel.params):
            problems.append(Diagnostic(
                f"tensor_maps['{name}'] names no tensor map parameter of kernel "
                f"'{kernel.name}' (its tensor maps: {_tmaps(kernel) or 'none'})", at))
    if problems:
        raise LaunchError(problems)


def _dicts(ex: dict, keyed_by: str, at: Span | None) -> list[Diagnostic]:
    """A problem for each of the dict's keys that should hold a dict and does not."""
    return [Diagnostic(f'"{key}" is a {type(ex[key]).__name__}; expected a dict keyed by '
                       f"{keyed_by} name", at)
            for key in ("inputs", "outputs", "expected", "tensor_maps")
            if not isinstance(ex.get(key, {}), dict)]


def _unnamed_references(ex: dict, arrays: dict, after: str, at: Span | None
                        ) -> list[Diagnostic]:
    """A problem for each reference of `expected` that names none of `arrays`."""
    return [Diagnostic(f"expected['{name}'] names no array of \"inputs\" or \"outputs\": a "
                       f"reference is compared with the array of its name after {after}", at)
            for name in ex.get("expected", {}) if name not in arrays]


def _reference_problems(ex: dict, arrays: dict, at: Span | None) -> list[Diagnostic]:
    """A problem for each reference that is not numbers as many as its array holds, and for
    a tolerance that is not a number (atol: or an array of them)."""
    out = []
    for name, want in ex.get("expected", {}).items():
        got = arrays.get(name)
        if name not in arrays:
            continue  # _unnamed_references reports it
        if not isinstance(got, np.ndarray):
            out.append(Diagnostic(f"expected['{name}'] names {_kind(got)} input; a reference is "
                                  "compared with an array the kernel writes", at))
            continue
        try:
            w = np.asarray(want)
        except ValueError:  # ragged nested lists
            w = np.asarray(None)
        if not (w.dtype.kind in "biuf" or ml_float(w.dtype)) or w.size != got.size:
            out.append(Diagnostic(f"expected['{name}'] is {_kind(want)}; expected an array of "
                                  f"{got.size} numbers, as '{name}' holds", at))
    for tol in ("rtol", "atol"):
        v = ex.get(tol, 0.0)
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) or
                tol == "atol" and isinstance(v, np.ndarray) and v.dtype.kind in "iuf"):
            out.append(Diagnostic(f'"{tol}" is {_kind(v)}; expected a number', at))
    return out


def _kind(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return f"a {v.dtype} array of shape {v.shape}"
    return f"a {type(v).__name__}"


def _def_span(example: Any) -> Span | None:
    """The line `def example(...)` of the twin, where its problems are reported."""
    code = getattr(example, "__code__", None)
    if code is None:
        return None
    src = python_source(code.co_filename)
    start = src.offset(code.co_firstlineno, 0)
    return Span(src, start, start + len(src.line_text(code.co_firstlineno)))


def _tmaps(kernel: ir.Kernel) -> str:
    return ", ".join(p.name for p in kernel.params if isinstance(p.type, T.TensorMap))


def _box_form(rank: int) -> str:
    """The form of a tensor_maps entry of a rank-`rank` map, its box outermost first."""
    dims = {1: "n,", 2: "rows, cols"}.get(rank) or ", ".join(f"d{i}" for i in range(rank))
    return f'{{"box": ({dims}), "swizzle": "none"}}'


def _map_problems(name: str, t: T.TensorMap, kernel: ir.Kernel, array: Any, opts: Any,
                  at: Span | None) -> list[Diagnostic]:
    if opts is None:
        return [Diagnostic(f"tensor map parameter '{name}' of kernel '{kernel.name}' has no "
                           "entry in this twin's tensor_maps; expected "
                           f'"tensor_maps": {{"{name}": {_box_form(t.rank)}}}, the box outermost '
                           "first",
                           at)]
    if not isinstance(opts, dict) or "box" not in opts:
        return [Diagnostic(f"tensor_maps['{name}'] is {opts!r}; expected "
                           f"{_box_form(t.rank)}, the box outermost first", at)]
    unknown = [o for o in opts if o not in OPTIONS]
    if unknown:
        return [Diagnostic(f"tensor_maps['{name}'] has option {', '.join(map(repr, unknown))}; "
                           f"the options are {', '.join(OPTIONS)}", at)]
    if array is None:
        return []  # reported as a parameter with no value
    try:
        model = TensorMapModel(array, dtype=t.elem,
                               **{o: v for o, v in opts.items() if o in _MODEL_OPTIONS})
    except (LaunchError, TypeError, ValueError) as e:
        why = "; ".join(d.message for d in e.diagnostics) if isinstance(e, LaunchError) \
            else str(e)
        return [Diagnostic(f"tensor_maps['{name}'] (box {opts['box']!r}, outermost first, for "
                           f"a {getattr(array, 'shape', '?')} array): {why}", at)]
    return [_box_mismatch(name, model, s, at) for s in short_boxes(kernel, name, model)]


def _box_mismatch(name: str, model: TensorMapModel, s: Any, at: Span | None) -> Diagnostic:
    return Diagnostic(short_box_message(f"tensor_maps['{name}']", model, s), at,
                      (Note(f"the {s.syntax} filling the {s.dst.type.nbytes}-byte buffer",
                            s.loc),))


# ----------------------------------------------------------------------------- launches

_LAUNCH_KEYS = ("kernel", "grid", "args", "tensor_maps")


@dataclass(frozen=True)
class Launch:
    """One launch of a chained example: its kernel and grid, each parameter's shared array
    (`arrays`: parameter -> a name of the example's "inputs" or "outputs") or own value
    (`values`), and the tensor-map options of its map parameters."""

    kernel: str
    grid: Any
    arrays: dict[str, str]
    values: dict[str, Any]
    maps: dict[str, dict]


def check_launches(ex: dict, module: ir.Module, example: Any) -> list[Launch]:
    """The launches of a chained example (`"launches": [...]` over the shared arrays of its
    "inputs" and "outputs"), or a LaunchError listing every way they do not fit the module's
    kernels: each launch is checked as a one-launch example, its messages prefixed with
    `launches[i]`."""
    at = _def_span(example)
    steps = ex["launches"]
    if not isinstance(steps, list) or not steps or not all(isinstance(s, dict) for s in steps):
        raise LaunchError(Diagnostic('"launches" is a list of dicts, one per launch in order: '
                                     '{"kernel": name, "grid": n or (x, y, z)} (and "args", '
                                     '"tensor_maps" where needed)', at))
    problems = _dicts(ex, "array", at)
    if problems:
        raise LaunchError(problems)
    shared = {**ex.get("inputs", {}), **ex.get("outputs", {})}
    problems += _unnamed_references(ex, shared, "the last launch", at)
    out = []
    for i, step in enumerate(steps):
        launch = _launch(i, step, module, shared, ex.get("tensor_maps", {}), at, problems)
        if launch is None:
            continue
        one = {"grid": launch.grid, "tensor_maps": launch.maps,
               "inputs": {**{p: shared[a] for p, a in launch.arrays.items()}, **launch.values}}
        try:
            check_example(one, module.kernel(launch.kernel), example)
        except LaunchError as e:
            problems += [replace(d, message=f"launches[{i}] (kernel '{launch.kernel}'): "
                                 f"{d.message}") for d in e.diagnostics]
        out.append(launch)
    if problems:
        raise LaunchError(problems)
    return out


def _launch(i: int, step: dict, module: ir.Module, shared: dict, maps: dict,
            at: Span | None, problems: list[Diagnostic]) -> Launch | None:
    """Launch `i` of a chained example, its parameters resolved; None after a problem."""
    where = f"launches[{i}]"
    unknown = [k for k in step if k not in _LAUNCH_KEYS]
    if unknown:
        problems.append(Diagnostic(f"{where} has key {', '.join(map(repr, unknown))}; a launch "
                                   f"takes {', '.join(_LAUNCH_KEYS)}", at))
        return None
    names = [k.name for k in module.kernels]
    name = step.get("kernel", names[0] if len(names) == 1 else None)
    if name not in names:
        problems.append(Diagnostic(f"{where} names kernel {name!r}; expected \"kernel\": one of "
                                   f"{', '.join(names)}", at))
        return None
    if "grid" not in step:
        problems.append(Diagnostic(f'{where} (kernel \'{name}\') has no "grid"; expected '
                                   '"grid": n or (x, y, z)', at))
        return None
    args = step.get("args", {})
    if not isinstance(args, dict):
        problems.append(Diagnostic(f'{where}: "args" is a {type(args).__name__}; expected '
                                   "{param: the name of a shared array, or a value}", at))
        return None
    kernel = module.kernel(name)
    arrays, values = {}, {}
    for p in kernel.params:
        given = args.get(p.name, p.name)
        if isinstance(given, str) and given in shared:
            arrays[p.name] = given
        elif not isinstance(given, str):
            values[p.name] = given
        else:
            problems.append(Diagnostic(
                f"{where}: parameter '{p.name}' ({p.type}) of kernel '{name}' has no value; "
                f"expected an array '{given}' in \"inputs\" or \"outputs\", or \"args\": "
                f"{{'{p.name}': the name of one, or a value}}", at))
            return None
    tmaps = {p.name for p in kernel.params if isinstance(p.type, T.TensorMap)}
    own = step.get("tensor_maps", {})
    opts = {p: own.get(p, maps.get(arrays.get(p, p))) for p in tmaps}
    return Launch(name, step["grid"], arrays, values,
                  {p: o for p, o in opts.items() if o is not None})
