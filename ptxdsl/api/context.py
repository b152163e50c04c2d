"""The kernel context `k` of the Python API (declarations, statements, blocks) and
`build_kernel`, which runs a kernel function against it."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import numbers
import re
from collections.abc import Callable, Iterator
from typing import Any

from .. import ir
from .. import types as T
from ..builder import SPECIAL_REGS, VALUE_FUNCTIONS, KernelBuilder, Lit, Operand
from ..builder.atomic import ATOMIC_FUNCTIONS, WORD_OPS, WORDS, word
from ..builder.common import describe, ptx_name_ok
from ..builder.hints import function_hint
from ..builder.literals import int_fits_error
from ..errors import CompileError, Diagnostic, Note, Span
from ..opdef import BY_SYNTAX
from .values import Value, _caller_locals, _diag, _pyname, is_err_expr, user_span

_KEYWORD_OPS = {"await"}  # operations whose names are Python keywords: k.await_(...)

_IDENT = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_BUILDING: list[KernelContext] = []  # kernels being built, innermost last


class _SRegGroup:
    def __init__(self, k: KernelContext, prefix: str):
        self._k, self._p = k, prefix

    def __getattr__(self, d: str) -> Value:
        return self._k.sreg(f"{self._p}.{d}")


class KernelContext:
    """The `k` handed to a kernel function: declarations, statements, control flow."""

    def __init__(self, builder: KernelBuilder):
        self._b = builder
        self._last_if: tuple[list[ir.Stmt], int] | None = None
        self._done = False  # its build finished: its values are no longer usable

    def _live(self, what: str = "the kernel context of") -> None:
        """Raise unless this is the kernel being built now (the innermost build)."""
        name = self._b.kernel_name
        if self._done:
            raise CompileError(_diag(f"{what} '{name}' is used after the kernel was built; a "
                                     "kernel's values, buffers, barriers and pipelines are "
                                     "used only inside its own kernel function"))
        if _BUILDING and _BUILDING[-1] is not self:
            inner = _BUILDING[-1]._b.kernel_name
            raise CompileError(_diag(f"{what} '{name}' is used while kernel '{inner}' is being "
                                     f"built; each kernel uses only its own values"))

    # -- values
    def _operand(self, x: Any, lists: bool = False, words: bool = False) -> Operand:
        """A Python argument as an operand; `lists`: a list or tuple is one too (an
        operation's coordinates); `words`: so is a memory order or scope ("acq_rel", "gpu"),
        in the arguments of atomics and ordered accesses."""
        if isinstance(x, Value):
            if x._k is not self:
                e = x._e
                made = Note("it was made here", e.loc) if isinstance(e, ir.Expr) and \
                    e.loc is not None else None
                what = describe(e) if isinstance(e, ir.Expr) else "this value"
                self._b.diags.error(f"{what} belongs to kernel '{x._k._b.kernel_name}', not to "
                                    f"'{self._b.kernel_name}'; a value, buffer, barrier or "
                                    "pipeline is used only in the kernel that made it",
                                    user_span(), *((made,) if made else ()))
                return ir.Const(value=0, type=T.error)
            return x._e
        if isinstance(x, numbers.Integral) and not isinstance(x, (bool, int)):
            x = int(x)  # numpy integers
        elif isinstance(x, numbers.Real) and not isinstance(x, (bool, int, float)):
            x = float(x)  # numpy floats
        if isinstance(x, int) and not isinstance(x, bool) and \
                (why := int_fits_error(x)) is not None:
            self._b.diags.error(f"the Python integer {why}", user_span())
            return ir.Const(value=0, type=T.error)
        if isinstance(x, (bool, int, float)):
            return Lit(x, user_span())
        if isinstance(x, (list, tuple)) and lists:
            return [self._operand(v) for v in x]  # type: ignore[return-value]
        if isinstance(x, (list, tuple)):
            self._b.diags.error(f"a {type(x).__name__} is not a kernel value here (lists are "
                                "arguments of operations: coordinates)", user_span())
            return ir.Const(value=0, type=T.error)
        if isinstance(x, str) and x in WORDS and words:  # a memory order or scope: "gpu"
            return word(x, user_span())  # type: ignore[return-value]
        return self._bad(f"cannot use a {type(x).__name__} in a kernel expression")

    def _index(self, base: Operand, items: list[Any], loc: Span | None) -> ir.Expr:
        if isinstance(base, Lit):
            self._b.diags.error("a literal cannot be indexed", loc)
            return ir.Const(value=0, type=T.error)
        return self._b.index(base, [self._operand(i) for i in items], loc)

    def sreg(self, name: str) -> Value:
        """A special register by its PTX name without `%` ("tid.x", "laneid", ...)."""
        self._live()
        if not isinstance(name, str):
            return Value(self, self._bad(f"sreg() takes a register name like 'tid.x', got "
                                         f"{_pyname(name)}"))
        return Value(self, self._b.sreg(name, user_span()))

    # -- arguments of the API's own methods, checked where the user wrote them
    def _bad(self, message: str) -> ir.Expr:
        self._b.diags.error(message, user_span())
        return ir.Const(value=0, type=T.error)

    def _ident(self, name: Any, what: str) -> str:
        """A name for the kernel: a string that is an identifier (it is one in PTX too)."""
        if isinstance(name, str) and _IDENT.fullmatch(name):
            return name
        self._bad(f"{what} must be a name (letters, digits, '_'; not starting with a digit), "
                  f"got {_pyname(name)}")
        return "invalid_name"

    def _int(self, v: Any, what: str) -> int | None:
        """A compile-time integer argument: a Python (or numpy) integer or a constant."""
        if isinstance(v, Value) and isinstance(v._e, Lit):
            v = v._e.value
        if isinstance(v, numbers.Integral) and not isinstance(v, bool):
            if int_fits_error(int(v)) is None:
                return int(v)
        self._bad(f"{what} must be an integer known when the kernel is built, got "
                  f"{_pyname(v)}")
        return None

    def _type(self, ty: Any, what: str, scalar: bool = False) -> Any:
        if isinstance(ty, T.Scalar) or (isinstance(ty, T.Type) and not scalar):
            return ty
        self._bad(f"{what} must be a ptxdsl {'scalar ' if scalar else ''}type "
                  f"(ptxdsl.f32, ...), got {_pyname(ty)}")
        return None

    def _dims(self, shape: Any, what: str) -> tuple[int, ...] | None:
        items = shape if isinstance(shape, (list, tuple)) else (shape,)
        dims = tuple(self._int(d, what) for d in items)
        return None if any(d is None for d in dims) else dims  # type: ignore[return-value]

    def __getattr__(self, name: str) -> Any:
        if name in ("tid", "ntid", "ctaid", "nctaid", "clusterid", "nclusterid",
                    "cluster_ctaid", "cluster_nctaid"):
            return _SRegGroup(self, name)
        if name in SPECIAL_REGS:
            return self.sreg(name)
        if name in BY_SYNTAX or (name.endswith("_") and name[:-1] in _KEYWORD_OPS):
            syntax = name.rstrip("_")  # k.await_(load): `await` is a Python keyword

            def op(*args: Any) -> None:
                self._live()
                words = syntax in WORD_OPS
                self._b.op(syntax, [self._operand(a, True, words) for a in args], user_span())
            return op
        if name in VALUE_FUNCTIONS or isinstance(T.parse_type_name(name), T.Vector):
            def fn(*args: Any) -> Value:
                self._live()
                loc = user_span()
                ops = [self._operand(a, words=name in ATOMIC_FUNCTIONS) for a in args]
                return Value(self, self._b.call(name, ops, loc))
            return fn
        raise AttributeError(f"ptxdsl kernels have no '{name}'{function_hint(name)}")

    # -- declarations
    def shared(self, name: str, elem: T.Scalar, shape: int | list[int] | tuple[int, ...],
               align: int | None = None, swizzle: int = 0, major: str = "k") -> Value:
        """A shared-memory buffer of `elem` with `shape` (outermost first); `swizzle` (32, 64
        or 128 bytes) declares the TMA / wgmma swizzled layout of its rows, `major` ("k" or
        "mn") whether wgmma reads a row along K or along M / N."""
        self._live()
        name = self._ident(name, "a shared buffer's name")
        elem, dims = self._type(elem, f"the element type of '{name}'", True), \
            self._dims(shape, f"a dimension of '{name}'")
        a = self._int(align, f"the alignment of '{name}'") if align is not None else None
        swz = self._int(swizzle, f"the swizzle of '{name}'")
        if not isinstance(major, str):
            self._bad(f"the major of '{name}' is 'k' or 'mn', got {_pyname(major)}")
            major = "k"
        if elem is None or dims is None or (align is not None and a is None) or swz is None:
            self._b.poison(name, user_span())
            return Value(self, ir.Const(value=0, type=T.error))
        return Value(self, self._b.shared(name, elem, dims, a, user_span(), swz, major))

    def mbarrier(self, name: str, count: int = 1, n: int = 0) -> Value:
        """An mbarrier expecting `count` arrivals per phase (`n` > 0: an array of n)."""
        self._live()
        name = self._ident(name, "an mbarrier's name")
        c, size = self._int(count, "an arrival count"), self._int(n, "an mbarrier array size")
        if c is None or size is None:
            self._b.poison(name, user_span())
            return Value(self, ir.Const(value=0, type=T.error))
        count, n = c, size
        return Value(self, self._b.mbarrier(name, n, count, user_span()))

    def pipeline(self, name: str, stages: int, **buffers: tuple) -> Value:
        """A pipeline of `stages` stages; each keyword names a stage buffer as
        (elem, shape), (elem, shape, align), (elem, shape, align, swizzle) or
        (elem, shape, align, swizzle, major):
        `k.pipeline("ring", 4, row=(bf16, [8192]))`."""
        self._live()
        loc = user_span()
        name = self._ident(name, "a pipeline's name")
        n = self._int(stages, "a stage count")
        specs = []
        for bname, spec in buffers.items():
            if not isinstance(spec, (tuple, list)) or not 2 <= len(spec) <= 5:
                self._bad(f"stage buffer '{bname}' is (elem, shape[, align[, swizzle[, "
                          f"major]]]), got {_pyname(spec)}")
                continue
            elem, shape, *rest = spec
            ty, dims = self._type(elem, f"the element type of '{bname}'", True), \
                self._dims(shape, f"a dimension of '{bname}'")
            align = self._int(rest[0], f"the alignment of '{bname}'") \
                if rest and rest[0] is not None else None
            swz = self._int(rest[1], f"the swizzle of '{bname}'") if len(rest) > 1 else 0
            major = rest[2] if len(rest) > 2 else "k"
            if not isinstance(major, str):
                self._bad(f"the major of '{bname}' is 'k' or 'mn', got {_pyname(major)}")
                continue
            if ty is None or dims is None or swz is None or \
                    (rest and rest[0] is not None and align is None):
                continue
            specs.append((bname, ty, dims, align, loc, swz, major))
        if n is None or len(specs) != len(buffers):
            self._b.poison(name, loc)
            return Value(self, ir.Const(value=0, type=T.error))
        return Value(self, self._b.pipeline(name, n, specs, loc))

    @contextlib.contextmanager
    def role(self, name: str, warp_start: int, warp_stop: int,
             regs: int | None = None) -> Iterator[None]:
        """Warps [warp_start, warp_stop) run the block; `regs` sets their register budget."""
        self._live()
        name = self._ident(name, "a role's name")
        first, last = self._int(warp_start, "a warp index"), self._int(warp_stop, "a warp index")
        nregs = self._int(regs, "a register count") if regs is not None else None
        header = self._b.role_begin(name, first or 0, last or 0, nregs, user_span())
        yield
        self._b.role_end(header, header[4])

    @contextlib.contextmanager
    def turn(self, enabled: bool = True) -> Iterator[None]:
        """`turn { ... }`: the warpgroups of the enclosing role run the block one at a time,
        in order (ping-pong); every turn block of a role shares the rotation, whose named
        barriers and counts the compiler derives. `enabled=False` makes it a plain block."""
        self._live()
        header = self._b.turn_begin(Lit(bool(enabled), None), user_span())
        yield
        self._b.turn_end(header)

    @contextlib.contextmanager
    def async_(self, name: str) -> Iterator[Value]:
        """A one-shot asynchronous load (`async name { ... }`): the copies issued in the block
        complete on a barrier the compiler derives (count, bytes, init, phase); any role waits
        for them with `k.await_(load)`."""
        self._live()
        name = self._ident(name, "an async block's name")
        header = self._b.async_begin(name, user_span())
        yield Value(self, ir.AsyncObj(name=name, type=T.AsyncRef(), loc=header[2]))
        self._b.async_end(header, header[2])

    def let(self, name: str, value: Any = None, type: T.Type | None = None) -> Value:
        """A local variable (a register)."""
        self._live()
        name = self._ident(name, "a variable's name")
        if type is not None and self._type(type, f"the type of '{name}'") is None:
            type = T.error
        v = self._operand(value) if value is not None else None
        return Value(self, self._b.let(name, type, v, user_span()))

    def assign(self, var: Value | str, value: Any) -> None:
        self._live()
        if isinstance(var, Value) and var._k is not self:
            self._operand(var)  # reports whose it is
            return
        name = var if isinstance(var, str) else \
            getattr(var._e, "name", None) if isinstance(var, Value) else None
        if name is None:
            self._b.diags.error("assign() needs a local variable", user_span())
            return
        self._b.assign(name, self._operand(value), user_span())

    def asm(self, template: str, outs: list[Value] = (), ins: list[Any] = ()) -> None:  # type: ignore[assignment]
        """Raw PTX; `{0}`... name the outputs, then the inputs."""
        self._live()
        loc = user_span()
        if not isinstance(template, str):
            self._bad(f"asm() takes the PTX text as a string, got {_pyname(template)}")
            return
        if not isinstance(outs, (list, tuple)) or not isinstance(ins, (list, tuple)):
            self._bad("asm(template, outs, ins): outs and ins are lists")
            return
        names = []
        for o in outs:
            e = self._operand(o) if isinstance(o, Value) else None
            if not isinstance(e, ir.Var):
                if e is None or not is_err_expr(e):
                    self._bad(f"an asm output is a local variable, got {_pyname(o)}")
                return
            names.append((e.name, loc))
        self._b.asm(template, names, [self._operand(x) for x in ins], loc)

    def return_(self) -> None:
        self._live()
        self._b.emit(ir.Return(loc=user_span()))

    # -- control flow
    @contextlib.contextmanager
    def if_(self, cond: Any) -> Iterator[None]:
        self._live()
        loc = user_span()
        c = self._operand(cond)
        self._b.push()
        yield
        then = self._b.pop()
        self._b.if_stmt(c, then, (), loc)
        stmts = self._b.frames[-1].stmts
        self._last_if = (stmts, len(stmts) - 1)

    @contextlib.contextmanager
    def else_(self) -> Iterator[None]:
        self._live()
        last = self._last_if
        stmts = self._b.frames[-1].stmts
        if last is None or last[0] is not stmts or last[1] != len(stmts) - 1:
            self._b.diags.error("else_() must directly follow an if_() block", user_span())
            self._b.push()
            yield
            self._b.pop()
            return
        self._b.push()
        yield
        orelse = self._b.pop()
        stmts[-1] = dataclasses.replace(stmts[-1], orelse=orelse)  # type: ignore[type-var,call-arg]
        self._last_if = None

    def schedule(self, name: str, tiles: Any, *, group: Any = None, ksteps: Any = None,
                 splits: Any = None, streamk: bool = False, clusters: bool = False,
                 groups: Any = None) -> Value:
        """`schedule name tiles(TM, TN) [group(G)] [ksteps(KT)] [splits(S) | streamk]
        [clusters] [groups(...)];`: the work items a persistent grid gives each CTA (or
        cluster), walked with `with k.for_("w", sched) as w:` (fields w.m, w.n, w.tile, w.k0,
        w.k1, w.split, w.splits, w.whole; with `groups=(offs, G, BM)` or `(counts, G, BM,
        cap)`, `tiles=(TN,)` and w.group, w.row0, w.rows; see ptxdsl.builder.schedule)."""
        self._live()
        loc = user_span()
        name = self._ident(name, "a schedule's name")
        if not isinstance(tiles, (tuple, list)) or len(tiles) not in (1, 2):
            self._bad(f"tiles is (tile-rows, tile-columns), or (tile-columns,) with groups, "
                      f"got {_pyname(tiles)}")
            tiles = (0, 0)
        clauses = [("tiles", [self._operand(t) for t in tiles], loc)]
        for cname, v in (("group", group), ("ksteps", ksteps), ("splits", splits)):
            if v is not None:
                clauses.append((cname, [self._operand(v)], loc))
        if groups is not None:
            if not isinstance(groups, (tuple, list)):
                self._bad(f"groups is (offsets, count, rows per tile) or (counts, count, rows "
                          f"per tile, capacity), got {_pyname(groups)}")
                groups = ()
            clauses.append(("groups", [self._operand(v) for v in groups], loc))
        clauses += [(c, [], loc) for c, on in (("streamk", streamk), ("clusters", clusters)) if on]
        return Value(self, self._b.schedule(name, clauses, loc))

    @contextlib.contextmanager
    def for_(self, name: str, start: Any, stop: Any = None, step: Any = None,
             unroll: bool = False) -> Iterator[Value]:
        """`for name in start .. stop step step` (stop exclusive); `unroll` copies the body
        once per iteration (constant bounds). `for_(name, sched)` walks a schedule
        (`for w in work`): the loop variable is this CTA's work item."""
        self._live()
        loc = user_span()
        name = self._ident(name, "a loop variable's name")
        walk = isinstance(start, Value) and isinstance(start.ir, ir.Expr) and \
            isinstance(start.ir.type, T.ScheduleRef)
        if walk and (stop is not None or step is not None or unroll):
            self._bad("for_(name, schedule) walks a schedule: it takes no stop, step or unroll")
        if walk or (stop is None and step is None and not unroll):
            header = self._b.work_begin(name, self._operand(start), loc)
            ty = T.WorkRef() if header[0] is not None else T.error
            yield Value(self, ir.Var(name=name, type=ty, loc=loc))
            self._b.work_end(header)
            return
        header = self._b.for_header(name, self._operand(start), self._operand(stop),
                                    self._operand(step) if step is not None else None, loc,
                                    unroll=unroll)
        yield Value(self, ir.Var(name=name, type=header[3], loc=loc))
        self._b.for_stmt(name, header, loc)

    @contextlib.contextmanager
    def while_(self, cond: Any) -> Iterator[None]:
        self._live()
        loc = user_span()
        c = self._b.value(self._operand(cond), T.pred)
        self._b.push()
        yield
        self._b.while_stmt(c, self._b.pop(), loc)


def build_kernel(fn: Callable[..., None], *, name: str | None = None, threads: Any,
                 cluster: Any = None, maxnreg: int | None = None,
                 minctas: int | None = None, nonportable: bool = False) -> ir.Kernel:
    """Run a kernel function once against a builder and return its IR (or raise every error)."""
    loc = user_span()
    if not callable(fn):
        raise CompileError(_diag(f"@ptxdsl.kernel decorates a function, got {_pyname(fn)}"))
    kname = name if name is not None else getattr(fn, "__name__", "")
    problems = [f"a kernel's name must be a PTX identifier, got {_pyname(kname)}"] \
        if not isinstance(kname, str) or not ptx_name_ok(kname) else []
    problems += _shape_problems("threads", threads) + _shape_problems("cluster", cluster)
    for what, v in (("maxnreg", maxnreg), ("minctas", minctas)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
            problems.append(f"{what} must be an integer, got {_pyname(v)}")
    if problems:
        raise CompileError([Diagnostic(p, loc) for p in problems])
    b = KernelBuilder(kname, threads=threads, cluster=cluster, maxnreg=maxnreg,
                      minctas=minctas, nonportable=bool(nonportable), loc=loc)
    k = KernelContext(b)
    try:
        sig = inspect.signature(fn, eval_str=True, locals=_caller_locals())
    except NameError as e:
        raise CompileError(_diag(f"cannot evaluate a parameter annotation of '{kname}': "
                                 f"{e}")) from None
    except (TypeError, ValueError) as e:
        raise CompileError(_diag(f"cannot read the parameters of '{kname}': {e}")) from None
    params = list(sig.parameters.values())
    if not params:
        raise CompileError(_diag("a kernel function takes the kernel context first: "
                                 "def f(k, ...)"))
    args = []
    for p in params[1:]:
        ty = p.annotation
        if ty is inspect.Parameter.empty or not isinstance(ty, T.Type):
            b.diags.error(f"parameter '{p.name}' needs a ptxdsl type annotation, e.g. "
                          f"{p.name}: ptxdsl.u32 or ptxdsl.ptr(ptxdsl.f32)", loc)
            args.append(Value(k, ir.Const(value=0, type=T.error)))
            continue
        b.param(p.name, ty, loc)
        args.append(Value(k, b.name(p.name, loc)))
    _BUILDING.append(k)
    try:
        fn(k, *args)
    finally:
        _BUILDING.remove(k)
        k._done = True
    if len(b.frames) != 1:  # a block's `with` was entered by hand and never left
        raise CompileError(_diag(f"kernel '{kname}' ends inside an open block (an if_, for_, "
                                 "while_, role or async_ entered without its `with`)"))
    kernel = b.finish()
    b.diags.raise_if_any()
    return kernel


def _shape_problems(what: str, v: Any) -> list[str]:
    """Why `v` is not a launch shape (an int or 1 to 3 ints), if it is not."""
    if v is None and what == "cluster":
        return []
    dims = v if isinstance(v, (list, tuple)) else (v,)
    if 1 <= len(dims) <= 3 and all(isinstance(d, int) and not isinstance(d, bool)
                                   for d in dims):
        return []
    return [f"{what} takes an integer or 1 to 3 integers, got {_pyname(v)}"]
