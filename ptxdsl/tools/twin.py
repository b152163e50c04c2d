"""The twin's example() dict checked against the kernel before a run (docs/twins.md).

The GPU runner and the interpreter would otherwise meet a bad dict deep inside a launch
("must be a TensorMapModel, got ndarray", or a deadlock); here each problem names the twin
file, the key and the form it expects, and all of them are reported at once.
"""

from __future__ import annotations

from typing import Any

from .. import ir
from .. import types as T
from ..errors import Diagnostic, LaunchError, Note, Span, python_source
from ..interp.run import grid_dims
from ..interp.tensormap import TensorMapModel, short_box_message, short_boxes

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
    for key in ("inputs", "outputs", "expected", "tensor_maps"):
        if not isinstance(ex.get(key, {}), dict):
            problems.append(Diagnostic(f'"{key}" is a {type(ex[key]).__name__}; expected a '
                                       "dict keyed by parameter name", at))
    if problems:
        raise LaunchError(problems)
    arrays = {**ex.get("inputs", {}), **ex.get("outputs", {})}
    maps = ex.get("tensor_maps", {})
    for p in kernel.params:
        if p.name not in arrays:
            where = "an array in" if isinstance(p.type, (T.Ptr, T.TensorMap)) else "a value in"
            problems.append(Diagnostic(f"parameter '{p.name}' ({p.type}) of kernel "
                                       f"'{kernel.name}' has no value; expected {where} "
                                       '"inputs" (or "outputs", where the kernel writes it)', at))
    for name in ex.get("expected", {}):
        if name not in arrays:
            problems.append(Diagnostic(f"expected['{name}'] names no array of \"inputs\" or "
                                       '"outputs": a reference is compared with the array of '
                                       "its name after the run", at))
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
