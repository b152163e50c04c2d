"""Values of the Python API: the symbolic `Value` that kernel arithmetic builds, the types
of parameters (`ptr`, `array`, `tmap`), and the user's source span that every call records."""

from __future__ import annotations

import contextlib
import inspect
import os
from typing import Any

from .. import ir
from .. import types as T
from ..builder import Lit, Operand
from ..errors import CompileError, Span, python_source

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the kernel library is user code of the API: its kernels' spans point into it
_LIBRARY_DIR = os.path.join(_PKG_DIR, "kernels") + os.sep


def user_span() -> Span | None:
    """The span of the innermost call site outside the ptxdsl package."""
    frame = inspect.currentframe()
    while frame is not None and _internal(frame):
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


def _internal(frame: Any) -> bool:
    """A frame of ptxdsl itself (not of its kernel library), or of contextlib running one of
    its `with` blocks."""
    path = os.path.abspath(frame.f_code.co_filename)
    return path.startswith(_PKG_DIR) and not path.startswith(_LIBRARY_DIR) or \
        path == _CONTEXTLIB


_CONTEXTLIB = os.path.abspath(contextlib.__file__)


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

    def __init__(self, k: Any, e: Operand):  # k: the api.context.KernelContext
        self._k = k
        self._e = e

    @property
    def ir(self) -> Operand:
        return self._e

    def _ctx(self) -> Any:
        """The kernel this value belongs to, which must be the one being built."""
        self._k._live("a value of kernel")
        return self._k

    def _bin(self, op: str, other: Any, reverse: bool = False) -> Value:
        k = self._ctx()
        o = k._operand(other)
        a, b = (o, self._e) if reverse else (self._e, o)
        return Value(k, k._b.binary(op, a, b, user_span()))

    def _cmp(self, op: str, other: Any) -> Value:
        k = self._ctx()
        return Value(k, k._b.compare(op, self._e, k._operand(other), user_span()))

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
    def __neg__(self): return Value(self._k, self._ctx()._b.unary("neg", self._e, user_span()))
    def __invert__(self): return Value(self._k, self._ctx()._b.unary("not", self._e, user_span()))

    __hash__ = None  # type: ignore[assignment]

    def to(self, ty: T.Type) -> Value:
        """Convert to another scalar type (`x as ty` in .ptxdsl)."""
        k = self._ctx()
        if not isinstance(ty, T.Type):
            k._b.diags.error(f"to() takes a ptxdsl type (ptxdsl.f32, ...), got "
                             f"{_pyname(ty)}", user_span())
            return Value(k, ir.Const(value=0, type=T.error))
        return Value(k, k._b.cast(self._e, ty, user_span()))

    def __getitem__(self, idx: Any) -> Value:
        items = list(idx) if isinstance(idx, tuple) else [idx]
        return Value(self._k, self._ctx()._index(self._e, items, user_span()))

    def __setitem__(self, idx: Any, value: Any) -> None:
        loc = user_span()
        k = self._ctx()
        items = list(idx) if isinstance(idx, tuple) else [idx]
        place = k._index(self._e, items, loc)
        k._b.store(place, k._operand(value), loc)

    def __getattr__(self, name: str) -> Value:
        if name.startswith("_"):
            raise AttributeError(name)
        e = self._e
        if isinstance(e, Lit):
            k = self._ctx()
            return Value(k, k._bad(f"a literal has no member '{name}'"))
        return Value(self._k, self._ctx()._b.member(e, name, user_span()))

    def __bool__(self) -> bool:
        raise CompileError(_diag("a kernel value has no Python truth value; use k.if_(...), "
                                 "k.while_(...), or & | ~ instead of and/or/not"))

    def __repr__(self) -> str:
        from ..printer import expr_text

        e = self._e
        return f"<ptxdsl value {e.value!r}>" if isinstance(e, Lit) else \
            f"<ptxdsl value {expr_text(e)}: {e.type}>"




def _pyname(v: Any) -> str:
    """A Python argument for a message: its repr, short, and its type."""
    r = repr(v)
    r = r if len(r) <= 40 else r[:37] + "..."
    return f"{r} ({type(v).__name__})"


def is_err_expr(e: Any) -> bool:
    return isinstance(e, ir.Expr) and isinstance(e.type, T.ErrorType)


def _caller_locals() -> dict:
    """Locals of the innermost frame outside ptxdsl: string annotations (`from __future__
    import annotations`) of a kernel defined inside a function may name them."""
    frame = inspect.currentframe()
    while frame is not None and _internal(frame):
        frame = frame.f_back
    return dict(frame.f_locals) if frame is not None else {}


def _diag(message: str):
    from ..errors import Diagnostic

    return Diagnostic(message, user_span())
