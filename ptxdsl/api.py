"""The Python API: build kernels with ordinary Python, through the same KernelBuilder as the
text frontend.

    @ptxdsl.kernel(threads=256)
    def add_one(k, src: ptxdsl.ptr(ptxdsl.f32), dst: ptxdsl.ptr(ptxdsl.f32)):
        tile = k.shared("tile", ptxdsl.f32, [2048])
        ...

Every call records the user's own source line, so errors point there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
from collections.abc import Callable, Iterator
from typing import Any

from . import ir
from . import types as T
from .builder import SPECIAL_REGS, VALUE_FUNCTIONS, KernelBuilder, Lit, Operand
from .errors import CompileError, Span, python_source
from .literals import int_fits_error
from .opdef import BY_SYNTAX

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_KEYWORD_OPS = {"await"}  # operations whose names are Python keywords: k.await_(...)


def user_span() -> Span | None:
    """The span of the innermost call site outside the ptxdsl package."""
    frame = inspect.currentframe()
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PKG_DIR):
        frame = frame.f_back
    if frame is None:
        return None
    info = inspect.getframeinfo(frame, context=0)
    src = python_source(frame.f_code.co_filename)
    pos = getattr(info, "positions", None)
    if pos is not None and pos.lineno is not None and pos.col_offset is not None:
        start = src.offset(pos.lineno, pos.col_offset)
        if pos.end_lineno == pos.lineno and pos.end_col_offset is not None:
            return Span(src, start, src.offset(pos.lineno, pos.end_col_offset))
        return Span(src, start, start + 1)
    start = src.offset(info.lineno, 0)
    line = src.line_text(info.lineno)
    indent = len(line) - len(line.lstrip())
    return Span(src, start + indent, start + len(line))


def ptr(elem: T.Scalar) -> T.Ptr:
    """The type of a global pointer parameter, `ptr<elem>`."""
    return T.Ptr(elem)


def array(elem: T.Scalar, *shape: int) -> T.RegArray:
    """The type of a register array, `elem[d0][d1]...` (`k.let("acc", 0.0, array(f32, 128))`)."""
    return T.RegArray(elem, tuple(shape))


def tmap(elem: T.Scalar, rank: int) -> T.TensorMap:
    """The type of a tensor-map parameter, `tmap<elem, rank>`."""
    return T.TensorMap(elem, rank)


class Value:
    """A symbolic kernel value. Arithmetic builds IR; it is never a Python number."""

    __slots__ = ("_k", "_e")

    def __init__(self, k: KernelContext, e: Operand):
        self._k = k
        self._e = e

    @property
    def ir(self) -> Operand:
        return self._e

    def _bin(self, op: str, other: Any, reverse: bool = False) -> Value:
        o = self._k._operand(other)
        a, b = (o, self._e) if reverse else (self._e, o)
        return Value(self._k, self._k._b.binary(op, a, b, user_span()))

    def _cmp(self, op: str, other: Any) -> Value:
        return Value(self._k, self._k._b.compare(op, self._e, self._k._operand(other),
                                                 user_span()))

    def __add__(self, o): return self._bin("add", o)
    def __radd__(self, o): return self._bin("add", o, True)
    def __sub__(self, o): return self._bin("sub", o)
    def __rsub__(self, o): return self._bin("sub", o, True)
    def __mul__(self, o): return self._bin("mul", o)
    def __rmul__(self, o): return self._bin("mul", o, True)
    def __truediv__(self, o): return self._bin("div", o)
    def __rtruediv__(self, o): return self._bin("div", o, True)
    def __floordiv__(self, o): return self._bin("div", o)
    def __mod__(self, o): return self._bin("rem", o)
    def __and__(self, o): return self._bin("and", o)
    def __rand__(self, o): return self._bin("and", o, True)
    def __or__(self, o): return self._bin("or", o)
    def __ror__(self, o): return self._bin("or", o, True)
    def __rfloordiv__(self, o): return self._bin("div", o, True)
    def __rmod__(self, o): return self._bin("rem", o, True)
    def __xor__(self, o): return self._bin("xor", o)
    def __rxor__(self, o): return self._bin("xor", o, True)
    def __lshift__(self, o): return self._bin("shl", o)
    def __rlshift__(self, o): return self._bin("shl", o, True)
    def __rshift__(self, o): return self._bin("shr", o)
    def __rrshift__(self, o): return self._bin("shr", o, True)
    def __eq__(self, o): return self._cmp("eq", o)  # type: ignore[override]
    def __ne__(self, o): return self._cmp("ne", o)  # type: ignore[override]
    def __lt__(self, o): return self._cmp("lt", o)
    def __le__(self, o): return self._cmp("le", o)
    def __gt__(self, o): return self._cmp("gt", o)
    def __ge__(self, o): return self._cmp("ge", o)
    def __neg__(self): return Value(self._k, self._k._b.unary("neg", self._e, user_span()))
    def __invert__(self): return Value(self._k, self._k._b.unary("not", self._e, user_span()))

    __hash__ = None  # type: ignore[assignment]

    def to(self, ty: T.Type) -> Value:
        """Convert to another scalar type (`x as ty` in .ptxdsl)."""
        return Value(self._k, self._k._b.cast(self._e, ty, user_span()))

    def __getitem__(self, idx: Any) -> Value:
        items = list(idx) if isinstance(idx, tuple) else [idx]
        return Value(self._k, self._k._index(self._e, items, user_span()))

    def __setitem__(self, idx: Any, value: Any) -> None:
        loc = user_span()
        items = list(idx) if isinstance(idx, tuple) else [idx]
        place = self._k._index(self._e, items, loc)
        self._k._b.store(place, self._k._operand(value), loc)

    def __getattr__(self, name: str) -> Value:
        if name.startswith("_"):
            raise AttributeError(name)
        e = self._e
        if isinstance(e, Lit):
            raise AttributeError(f"a literal has no member '{name}'")
        return Value(self._k, self._k._b.member(e, name, user_span()))

    def __bool__(self) -> bool:
        raise CompileError(_diag("a kernel value has no Python truth value; use k.if_(...), "
                                 "k.while_(...), or & | ~ instead of and/or/not"))

    def __repr__(self) -> str:
        from .printer import expr_text

        e = self._e
        return f"<ptxdsl value {e.value!r}>" if isinstance(e, Lit) else \
            f"<ptxdsl value {expr_text(e)}: {e.type}>"


def _caller_locals() -> dict:
    """Locals of the innermost frame outside ptxdsl: string annotations (`from __future__
    import annotations`) of a kernel defined inside a function may name them."""
    frame = inspect.currentframe()
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PKG_DIR):
        frame = frame.f_back
    return dict(frame.f_locals) if frame is not None else {}


def _diag(message: str):
    from .errors import Diagnostic

    return Diagnostic(message, user_span())


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

    # -- values
    def _operand(self, x: Any, lists: bool = False) -> Operand:
        """A Python argument as an operand; `lists`: a list or tuple is one too (an
        operation's coordinates)."""
        if isinstance(x, Value):
            return x._e
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
        self._b.diags.error(f"cannot use a {type(x).__name__} in a kernel expression",
                            user_span())
        return Lit(0)

    def _index(self, base: Operand, items: list[Any], loc: Span | None) -> ir.Expr:
        if isinstance(base, Lit):
            self._b.diags.error("a literal cannot be indexed", loc)
            return ir.Const(value=0, type=T.error)
        return self._b.index(base, [self._operand(i) for i in items], loc)

    def sreg(self, name: str) -> Value:
        """A special register by its PTX name without `%` ("tid.x", "laneid", ...)."""
        return Value(self, self._b.sreg(name, user_span()))

    def __getattr__(self, name: str) -> Any:
        if name in ("tid", "ntid", "ctaid", "nctaid", "clusterid", "nclusterid",
                    "cluster_ctaid", "cluster_nctaid"):
            return _SRegGroup(self, name)
        if name in SPECIAL_REGS:
            return self.sreg(name)
        if name in BY_SYNTAX or (name.endswith("_") and name[:-1] in _KEYWORD_OPS):
            syntax = name.rstrip("_")  # k.await_(load): `await` is a Python keyword

            def op(*args: Any) -> None:
                self._b.op(syntax, [self._operand(a, True) for a in args], user_span())
            return op
        if name in VALUE_FUNCTIONS or isinstance(T.parse_type_name(name), T.Vector):
            def fn(*args: Any) -> Value:
                loc = user_span()
                ops = [self._operand(a) for a in args]
                return Value(self, self._b.call(name, ops, loc))
            return fn
        raise AttributeError(f"ptxdsl kernels have no '{name}'")

    # -- declarations
    def shared(self, name: str, elem: T.Scalar, shape: int | list[int] | tuple[int, ...],
               align: int | None = None, swizzle: int = 0, major: str = "k") -> Value:
        """A shared-memory buffer of `elem` with `shape` (outermost first); `swizzle` (32, 64
        or 128 bytes) declares the TMA / wgmma swizzled layout of its rows, `major` ("k" or
        "mn") whether wgmma reads a row along K or along M / N."""
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        return Value(self, self._b.shared(name, elem, dims, align, user_span(), swizzle, major))

    def mbarrier(self, name: str, count: int = 1, n: int = 0) -> Value:
        """An mbarrier expecting `count` arrivals per phase (`n` > 0: an array of n)."""
        return Value(self, self._b.mbarrier(name, n, count, user_span()))

    def pipeline(self, name: str, stages: int, **buffers: tuple) -> Value:
        """A pipeline of `stages` stages; each keyword names a stage buffer as
        (elem, shape), (elem, shape, align), (elem, shape, align, swizzle) or
        (elem, shape, align, swizzle, major):
        `k.pipeline("ring", 4, row=(bf16, [8192]))`."""
        loc = user_span()
        specs = []
        for bname, spec in buffers.items():
            elem, shape, *rest = spec
            dims = (shape,) if isinstance(shape, int) else tuple(shape)
            specs.append((bname, elem, dims, rest[0] if rest else None, loc,
                          rest[1] if len(rest) > 1 else 0, rest[2] if len(rest) > 2 else "k"))
        return Value(self, self._b.pipeline(name, stages, specs, loc))

    @contextlib.contextmanager
    def role(self, name: str, warp_start: int, warp_stop: int,
             regs: int | None = None) -> Iterator[None]:
        """Warps [warp_start, warp_stop) run the block; `regs` sets their register budget."""
        header = self._b.role_begin(name, warp_start, warp_stop, regs, user_span())
        yield
        self._b.role_end(header, header[4])

    @contextlib.contextmanager
    def async_(self, name: str) -> Iterator[Value]:
        """A one-shot asynchronous load (`async name { ... }`): the copies issued in the block
        complete on a barrier the compiler derives (count, bytes, init, phase); any role waits
        for them with `k.await_(load)`."""
        header = self._b.async_begin(name, user_span())
        yield Value(self, ir.AsyncObj(name=name, type=T.AsyncRef(), loc=header[2]))
        self._b.async_end(header, header[2])

    def let(self, name: str, value: Any = None, type: T.Type | None = None) -> Value:
        """A local variable (a register)."""
        v = self._operand(value) if value is not None else None
        return Value(self, self._b.let(name, type, v, user_span()))

    def assign(self, var: Value | str, value: Any) -> None:
        name = var if isinstance(var, str) else getattr(var._e, "name", None)
        if name is None:
            self._b.diags.error("assign() needs a local variable", user_span())
            return
        self._b.assign(name, self._operand(value), user_span())

    def asm(self, template: str, outs: list[Value] = (), ins: list[Any] = ()) -> None:  # type: ignore[assignment]
        """Raw PTX; `{0}`... name the outputs, then the inputs."""
        loc = user_span()
        names = [(getattr(o._e, "name", "?"), loc) for o in outs]
        self._b.asm(template, names, [self._operand(x) for x in ins], loc)

    def return_(self) -> None:
        self._b.emit(ir.Return(loc=user_span()))

    # -- control flow
    @contextlib.contextmanager
    def if_(self, cond: Any) -> Iterator[None]:
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

    @contextlib.contextmanager
    def for_(self, name: str, start: Any, stop: Any, step: Any = None,
             unroll: bool = False) -> Iterator[Value]:
        """`for name in start .. stop step step` (stop exclusive); `unroll` copies the body
        once per iteration (constant bounds)."""
        loc = user_span()
        header = self._b.for_header(name, self._operand(start), self._operand(stop),
                                    self._operand(step) if step is not None else None, loc,
                                    unroll=unroll)
        yield Value(self, ir.Var(name=name, type=header[3], loc=loc))
        self._b.for_stmt(name, header, loc)

    @contextlib.contextmanager
    def while_(self, cond: Any) -> Iterator[None]:
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
    b = KernelBuilder(name or fn.__name__, threads=threads, cluster=cluster, maxnreg=maxnreg,
                      minctas=minctas, nonportable=nonportable, loc=loc)
    k = KernelContext(b)
    try:
        sig = inspect.signature(fn, eval_str=True, locals=_caller_locals())
    except NameError as e:
        raise CompileError(_diag(f"cannot evaluate a parameter annotation of '{fn.__name__}': "
                                 f"{e}")) from None
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
    fn(k, *args)
    kernel = b.finish()
    b.diags.raise_if_any()
    return kernel
