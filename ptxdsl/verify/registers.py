"""Register arrays: every thread's arrays fit its register budget, and every element index
(`acc[4 * j + i]`, `frag(p, k)`) stays inside its array in every unrolled iteration.

Registers have no address: an index is a constant or an expression of `unroll` loop
variables, known only once the loop is unrolled. Codegen refuses one out of range in the
iteration it emits; this check decides it first, for every iteration, so that `check`
reports what `compile` would and the interpreter never indexes past a thread's registers.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from .. import ir
from .. import types as T
from ..opdef import const_int
from .facts import Facts, Report, text
from .values import Evaluator, const

_RESERVED_REGS = 8  # addresses, loop counters and predicates beside the register arrays
_MAX_ITERATIONS = 1 << 14  # unrolled iterations tried per index (a loop nest this deep
# would not fit the PTX line budget anyway)


def check_register_arrays(facts: Facts, out: Report) -> None:
    """The register arrays a thread declares fit the budget of its role (setmaxnreg) or of
    the kernel (maxnreg, else 255)."""
    k = facts.kernel
    base = k.maxnreg or 255
    _budget(k.body, base, out, ir.fragment_arrays(k.body))


def _budget(stmts: tuple[ir.Stmt, ...], budget: int, out: Report, packed: set[str]) -> int:
    used = 0
    for s in stmts:
        if isinstance(s, ir.SetMaxNReg):
            budget = s.regs
        elif isinstance(s, ir.Let) and isinstance(s.var_type, T.RegArray):
            # 32-bit registers: 64-bit elements take two; the 16-bit (fp8) elements of an array
            # read as wgmma A fragments are kept packed two (four) to one (codegen), others
            # take one each
            n, size = s.var_type.n, s.var_type.elem.nbytes
            used += n * 2 if size == 8 else -(-n * size // 4) if s.name in packed else n
            if used + _RESERVED_REGS > budget:
                out.error(f"register array '{s.name}' brings this thread's register arrays to "
                          f"{used} registers, more than its budget of {budget} allows (keep "
                          f"{_RESERVED_REGS} for addresses and counters); raise the role's "
                          "regs or shrink the tile", s.loc)
        elif isinstance(s, ir.If):
            used += max(_budget(s.then, budget, out, packed),
                        _budget(s.orelse, budget, out, packed))
        elif isinstance(s, (ir.For, ir.While)):
            used += _budget(s.body, budget, out, packed)
    return used


Unrolled = tuple[tuple[str, range], ...]  # the unroll loops around a statement, outermost first


def check_register_indices(facts: Facts, out: Report) -> None:
    """Every element index of a register array or vector, and every `frag(p, k)`, is inside
    its array in each iteration of the unroll loops around it."""
    k = facts.kernel
    types: dict[str, T.Type] = {s.name: s.var_type for s in facts.statements
                                if isinstance(s, ir.Let) and s.var_type is not None}
    ev = Evaluator((1, 1, 1))
    for s, unrolled in _statements(k.body, ()):
        for index, size, what, node in _indices(s, types):
            bad = _out_of_range(ev, index, size, unrolled)
            if bad is None:
                continue
            value, at = bad
            where = f" in the unrolled iteration {at}" if at else ""
            if what.startswith("frag"):
                per = ir.fragment_elems(node.vec.type.elem)  # type: ignore[attr-defined]
                out.error(f"{what}: k is {value}{where}, out of range [0, {size}) (the array "
                          f"holds {size} fragments of {per} elements)", node.loc or s.loc)
            else:
                out.error(f"element index {text(index)} of {what} is {value}{where}, out of "
                          f"range [0, {size})", node.loc or s.loc)


def _statements(stmts: tuple[ir.Stmt, ...], unrolled: Unrolled
                ) -> Iterator[tuple[ir.Stmt, Unrolled]]:
    for s in stmts:
        yield s, unrolled
        inner = unrolled
        if isinstance(s, ir.For) and s.unroll:
            start, stop, step = (const_int(x) for x in (s.start, s.stop, s.step))
            if start is not None and stop is not None and step:  # the builder made them so
                inner = unrolled + ((s.var, range(start, stop, step)),)
        for block in ir.blocks(s):
            yield from _statements(block, inner)


def _indices(s: ir.Stmt, types: dict[str, T.Type]
             ) -> Iterator[tuple[ir.Expr, int, str, ir.Node]]:
    """(index, number of elements it may reach, what it indexes, the access) of each element
    access of a register array or vector that `s` itself makes."""
    if isinstance(s, ir.SetElem):
        t = types.get(s.name)
        if isinstance(t, (T.RegArray, T.Vector)):
            yield s.index, t.n, f"'{s.name}' ({t})", s
    stack: list[object] = [getattr(s, name) for name in ir.node_fields(s)]
    while stack:
        x = stack.pop()
        if isinstance(x, tuple):
            stack.extend(x)
            continue
        if not isinstance(x, ir.Expr):
            continue
        if isinstance(x, ir.Fragment) and isinstance(x.vec.type, T.RegArray):
            yield (x.k, x.vec.type.n // ir.fragment_elems(x.vec.type.elem),
                   f"frag({text(x.vec)}, k)", x)
        elif isinstance(x, ir.Extract) and isinstance(x.vec.type, (T.RegArray, T.Vector)):
            yield x.index, x.vec.type.n, f"'{text(x.vec)}' ({x.vec.type})", x
        stack.extend(getattr(x, name) for name in ir.node_fields(x))


def _out_of_range(ev: Evaluator, index: ir.Expr, size: int, unrolled: Unrolled
                  ) -> tuple[int, str] | None:
    """The first (value, iteration) in which `index` leaves [0, size), or None. An index
    that reads anything but unroll loop variables is left to codegen."""
    names = ir.free_names(index)
    loops = [(var, values) for var, values in unrolled if var in names]
    if names - {var for var, _ in loops}:
        return None
    one = np.ones(1, bool)
    for combo in itertools.islice(itertools.product(*(v for _, v in loops)), _MAX_ITERATIONS):
        env = {var: const(x) for (var, _), x in zip(loops, combo, strict=True)}
        v = ev.ev(index, env, one, one).known
        if isinstance(v, int) and not 0 <= v < size:
            return v, ", ".join(f"{var} = {x}" for (var, _), x in zip(loops, combo, strict=True))
    return None
