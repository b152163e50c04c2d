"""Inline functions of the text language: `fn name(params) [-> T] { ... }` at file level,
built again at each call (no PTX call, no stack).

A call binds each parameter as it is declared: a scalar, vector or pointer parameter is a
`let` of the argument (so a compile-time argument stays compile-time inside the body, usable
as a register-array index), a register-array parameter names the caller's array itself (the
body reads and writes it), and a `const` parameter is a compile-time constant (an error
unless the argument is one). A function returning a value ends with `return value;`; the
call's value is a `let` of it.

The body sees its parameters, its own names and the file's constants, never the caller's
names: every name it declares gets a kernel-unique IR name (`_merge2_lo`, the `lo` of the
second inlined call of `merge`), which messages written while inlining show as the source
name. A message located in a body gets a note at the call that inlined it; the same message
from a second call is not repeated.
"""

from __future__ import annotations

import contextlib
import difflib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import lark

from .. import ir
from .. import types as T
from ..builder import VALUE_FUNCTIONS, Lit
from ..builder.common import KEYWORDS, describe
from ..builder.named import ALLOWED, inline, reason, runtime_operand
from ..builder.scope import RESERVED
from ..errors import Diagnostic, Note, Span
from ..opdef import BY_SYNTAX

if TYPE_CHECKING:
    from ..builder import KernelBuilder
    from ..errors import DiagnosticBag, Source

# what a function body may not contain, and why: each belongs to the kernel
_KERNEL_ONLY = {
    "shared_decl": "shared memory is declared in the kernel",
    "barrier_decl": "mbarriers are declared in the kernel",
    "pipeline_decl": "pipelines are declared in the kernel",
    "role_stmt": "roles are declared in the kernel",
    "async_stmt": "'async' blocks belong to the kernel",
    "turn_stmt": "'turn' blocks belong to the kernel",
    "schedule_decl": "schedules are declared in the kernel",
    "work_stmt": "a schedule's loop belongs to the kernel",
}


@dataclass(frozen=True)
class FnParam:
    name: str
    type: lark.Tree
    const: bool
    loc: Span | None


@dataclass(frozen=True)
class FnDef:
    """A file-level `fn`: its parameters, result type and body, kept as syntax (each call
    builds them again). `ok`: its definition was sound (else it was reported, and calls
    stay quiet)."""

    name: str
    params: tuple[FnParam, ...]
    result: lark.Tree | None
    body: lark.Tree
    loc: Span | None  # its name
    ok: bool


@dataclass
class _Inline:
    """The names of one inlined call: a scope stack of source name -> IR name, and each IR
    name's source name (for messages)."""

    fn: FnDef
    n: int  # the how-manyth call inlined in the file: its names are unique
    scopes: list[dict[str, str]] = field(default_factory=lambda: [{}])
    source_names: dict[str, str] = field(default_factory=dict)


class FunctionWalker:
    """The function part of the tree walker; `_Walker` provides `b`, `consts`, `expr`..."""

    source: Source
    diags: DiagnosticBag
    _builder: KernelBuilder | None
    consts: KernelBuilder
    functions: dict[str, FnDef]
    _inline: _Inline | None
    _active: list[str]  # the functions being inlined, outermost first
    _ncalls: int
    _reported: set[tuple[str, int, int]]  # body messages already given at an earlier call
    _noted: set[Diagnostic]  # the messages given their call notes
    no_calls: str | None  # where a call would be wrong: "a 'while' condition"

    def span(self, node: lark.Tree | lark.Token) -> Span | None:  # provided by the walker
        raise NotImplementedError

    @property
    def b(self) -> KernelBuilder:  # provided by the walker
        raise NotImplementedError

    def expr(self, t: lark.Tree, lists: bool = False):  # provided by the walker
        raise NotImplementedError

    def type(self, tree: lark.Tree) -> T.Type | None:  # provided by the walker
        raise NotImplementedError

    # ------------------------------------------------------------------ definitions

    def define_functions(self, tree: lark.Tree) -> None:
        """Read every `fn` of the file (a kernel may call one defined after it)."""
        self.functions = {}
        self._inline = None
        self._active = []
        self._ncalls = 0
        self._reported = set()
        self._noted = set()
        self.no_calls = None
        for f in tree.children:
            if f.data == "function":
                self.define(f)

    def define(self, tree: lark.Tree) -> None:
        name_tok, *rest = tree.children
        name, loc = str(name_tok), self.span(name_tok)
        result, body = rest[-2], rest[-1]
        params = tuple(FnParam(str(p.children[1]), p.children[2], p.children[0] is not None,
                               self.span(p))
                       for p in rest[:-2] if isinstance(p, lark.Tree))
        ok = self.sound(name, loc, params, result, body)
        if name in self.functions:
            self.diags.error(f"function '{name}' is defined twice", loc,
                             Note("first defined here", self.functions[name].loc))
            return
        self.functions[name] = FnDef(name, params, result, body, loc, ok)

    def sound(self, name: str, loc: Span | None, params: tuple[FnParam, ...],
              result: lark.Tree | None, body: lark.Tree) -> bool:
        """Check what a definition alone decides (its name, its parameters' names, what its
        body contains, where it returns), once, however often it is called."""
        errors = len(self.diags.items)
        if name in KEYWORDS or name in VALUE_FUNCTIONS or name in BY_SYNTAX or \
                T.parse_type_name(name) is not None:
            self.diags.error(f"'{name}' is a built-in name; name the function otherwise", loc)
        seen: dict[str, Span | None] = {}
        for p in params:
            if p.name in seen:
                self.diags.error(f"function '{name}' has two parameters named '{p.name}'",
                                 p.loc, Note("the first is here", seen[p.name]))
            seen[p.name] = p.loc
        stmts = body.children
        last = stmts[-1] if stmts else None
        if result is not None and (last is None or last.data != "return_stmt"
                                   or last.children[0] is None):
            self.diags.error(f"function '{name}' returns a value, so its body ends with "
                             "'return value;'", self.span(last) if last is not None else loc)
        for s in body.iter_subtrees_topdown():
            if s.data in _KERNEL_ONLY:
                self.diags.error(f"a function cannot contain this: {_KERNEL_ONLY[s.data]}; "
                                 "declare it there and pass what the function needs",
                                 self.span(s))
            elif s.data == "return_stmt" and (s is not last or result is None):
                self.diags.error(
                    f"'return' in function '{name}': " +
                    ("a function without '-> type' ends at its last statement (in a kernel, "
                     "'return;' ends the thread)" if result is None else
                     "a function returns its value at its end, with one 'return value;'"),
                    self.span(s))
        return len(self.diags.items) == errors

    # ------------------------------------------------------------------ names

    def use(self, name: str, loc: Span | None) -> str | None:
        """The IR name of a name read or assigned, or None after an error: in a function
        body, its parameters, its own names and the file's constants only."""
        if self._inline is None:
            return name
        found = self.resolved(name)
        if found is not None:
            return found
        visible = [n for s in self._inline.scopes for n in s] + list(self.consts.frames[0].names)
        close = difflib.get_close_matches(name, visible, n=1)
        why = f"; did you mean '{close[0]}'?" if close else ""
        if self.b.lookup(name) is not None:
            why += (f" (a function sees its parameters, its own names and the file's "
                    f"constants; pass '{name}' as an argument)")
        self.diags.error(f"unknown name '{name}' in function '{self._inline.fn.name}'{why}",
                         loc)
        return None

    def resolved(self, name: str) -> str | None:
        """In a function body, the IR name of `name` where the body sees it, else None."""
        assert self._inline is not None
        for scope in reversed(self._inline.scopes):
            if name in scope:
                return scope[name]
        return name if name in self.consts.frames[0].names else None

    def visible(self, name: str) -> bool:
        """Whether `name` names a variable here (else it may be a word such as `acq_rel`)."""
        if self._inline is None:
            return self.b.lookup(name) is not None
        return self.resolved(name) is not None

    def declare(self, name: str) -> str:
        """The IR name of a name being declared: itself in a kernel; in a function body, a
        name unique in the kernel. A name the body sees already, or a built-in one, keeps
        the name the builder knows, which refuses it as in a kernel."""
        if self._inline is None or name in RESERVED:
            return name
        seen = self.resolved(name)
        if seen is not None:
            return seen
        fresh = self.fresh(f"_{self._inline.fn.name}{self._inline.n}_{name}")
        self._inline.scopes[-1][name] = fresh
        self._inline.source_names[fresh] = name
        return fresh

    def fresh(self, name: str) -> str:
        while self.b.lookup(name) is not None:
            name += "_"
        return name

    @contextlib.contextmanager
    def names(self) -> Iterator[None]:
        """A block: the names a function body declares in it end with it."""
        if self._inline is None:
            yield
            return
        self._inline.scopes.append({})
        try:
            yield
        finally:
            self._inline.scopes.pop()

    # ------------------------------------------------------------------ calls

    def close_function(self, name: str) -> str | None:
        """The function of this file that an unknown call `name` likely meant."""
        close = difflib.get_close_matches(name, list(self.functions), n=1, cutoff=0.6)
        return close[0] if close else None

    def call_function(self, fn: FnDef, args: list[lark.Tree], loc: Span | None):
        """Inline a call of `fn`: its value (a `let` of the result, read where the call is),
        or an error constant; None for a function without a result."""
        err = ir.Const(value=0, type=T.error, loc=loc)
        if self._builder is self.consts:
            self.diags.error(f"'{fn.name}(...)' is a function call, computed when the kernel "
                             "runs; a constant needs a value known at compile time", loc)
            return err
        if self.no_calls is not None:
            self.diags.error(f"a function call in {self.no_calls} would run once, before the "
                             "loop; compute it in the loop's body", loc)
            return err
        active = self._active
        if fn.name in active:
            path = " -> ".join(active[active.index(fn.name):] + [fn.name])
            self.diags.error(f"function '{fn.name}' calls itself ({path}); functions are "
                             "inlined, so they cannot recurse", loc,
                             Note(f"'{fn.name}' is defined here", fn.loc))
            return err
        if len(args) != len(fn.params) or not fn.ok:
            for a in args:  # their own mistakes
                self.expr(a)
            if fn.ok:
                names = f" ({', '.join(p.name for p in fn.params)})" if fn.params else ""
                self.diags.error(f"function '{fn.name}' takes {len(fn.params)} argument(s)"
                                 f"{names}, got {len(args)}", loc,
                                 Note(f"'{fn.name}' is defined here", fn.loc))
            return err
        values = [self.expr(a) for a in args]  # in the caller's names
        outer, first = self._inline, len(self.diags.items)
        self._ncalls += 1
        self._inline = _Inline(fn, self._ncalls)
        active.append(fn.name)
        try:
            for p, a, v in zip(fn.params, args, values, strict=True):
                self.bind(fn, p, v, self.span(a))
            for s in fn.body.children[:-1] if fn.result is not None else fn.body.children:
                getattr(self, "s_" + s.data)(s)
            result = self.result(fn, fn.result, loc) if fn.result is not None else None
        finally:
            self.located(fn, self._inline, first, loc)
            active.pop()
            self._inline = outer
        return result

    def bind(self, fn: FnDef, p: FnParam, arg, at: Span | None) -> None:
        """Bind parameter `p` to the argument `arg` written at `at`."""
        ty = self.type(p.type)
        name = self.declare(p.name)
        defined = Note(f"parameter '{p.name}' of '{fn.name}' is declared here", p.loc)
        if ty is None:
            self.b.poison(name, p.loc)
            return
        if p.const:
            if isinstance(arg, ir.Expr) and not isinstance(arg.type, T.ErrorType) and \
                    (bad := runtime_operand(arg, self.b.lookup)) is not None:
                why, notes = reason(bad, self.b.lookup)
                self.diags.error(f"argument '{p.name}' of '{fn.name}' is 'const', a "
                                 f"compile-time value: {ALLOWED}; {why}", at, *notes, defined)
                self.b.poison(name, p.loc)
            elif self.b.const(name, ty, inline(arg, self.b.lookup, at)
                              if isinstance(arg, ir.Expr) else arg, at) is None:
                self.b.poison(name, p.loc)
            return
        if isinstance(ty, T.RegArray):
            if not (isinstance(arg, ir.Var) and isinstance(arg.type, T.RegArray)):
                what = "this" if isinstance(arg, Lit) else describe(arg)
                self.diags.error(f"argument '{p.name}' of '{fn.name}' is a register array "
                                 f"{ty}; {what} is not one", at, defined)
            elif arg.type != ty:
                self.diags.error(f"argument '{p.name}' of '{fn.name}' is declared {ty}, got "
                                 f"'{arg.name}' of type {arg.type}", at, defined)
            else:
                # the caller's array itself: the body writes it
                self._inline.scopes[-1][p.name] = arg.name  # type: ignore[union-attr]
                return
            self.b.poison(name, p.loc)
            return
        v = self.b.value(arg, ty) if isinstance(arg, Lit) else self.b.value(arg)
        if not isinstance(v.type, T.ErrorType) and v.type != ty:
            self.diags.error(f"argument '{p.name}' of '{fn.name}' is declared {ty}, got "
                             f"{v.type}", at, defined)
            self.b.poison(name, p.loc)
            return
        self.b.let(name, ty, v, p.loc)

    def result(self, fn: FnDef, result: lark.Tree, loc: Span | None) -> ir.Expr:
        """The call's value: a `let` of the value of the body's final `return`, of type
        `result`."""
        ret = fn.body.children[-1]
        ty = self.type(result)
        value = self.expr(ret.children[0])
        if ty is None:
            return ir.Const(value=0, type=T.error, loc=loc)
        if not isinstance(ty, (T.Scalar, T.Vector, T.Ptr)):
            self.diags.error(f"function '{fn.name}' returns {ty}; a function returns a "
                             "scalar, a vector or a pointer", self.span(result))
            return ir.Const(value=0, type=T.error, loc=loc)
        v = self.b.value(value, ty) if isinstance(value, Lit) else self.b.value(value)
        if not isinstance(v.type, T.ErrorType) and v.type != ty:
            self.diags.error(f"function '{fn.name}' returns {ty}, but this value is {v.type}",
                             self.span(ret.children[0]))
            return ir.Const(value=0, type=T.error, loc=loc)
        name = self.fresh(f"_{fn.name}{self._inline.n}")  # type: ignore[union-attr]
        self._inline.source_names[name] = f"{fn.name}(...)"  # type: ignore[union-attr]
        return replace(self.b.let(name, ty, v, self.span(ret)), loc=loc)

    def located(self, fn: FnDef, call: _Inline, first: int, loc: Span | None) -> None:
        """The messages written while inlining `call`: source names for IR names, a note at
        the call for each outside it (its arguments' are at the call already), and none
        repeated from an earlier call."""
        names = call.source_names
        pattern = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, sorted(names, key=len,
                                                                            reverse=True)))
                             + r")(?!\w)") if names else None

        def plain(text: str) -> str:
            return pattern.sub(lambda m: names[m.group(1)], text) if pattern else text

        kept: list[Diagnostic] = []
        for d in self.diags.items[first:]:
            inside = d.span is not None and loc is not None and d.span.source is loc.source \
                and loc.start <= d.span.start < loc.end
            d = replace(d, message=plain(d.message),
                        notes=tuple(replace(n, message=plain(n.message)) for n in d.notes))
            if not inside:
                # a message of an inner call has its notes; one of this body is new or a repeat
                key = (d.message, d.span.start if d.span else -1, d.span.end if d.span else -1)
                if d not in self._noted and key in self._reported:
                    continue
                self._reported.add(key)
                d = replace(d, notes=d.notes + (Note(f"in this call of '{fn.name}'", loc),))
                self._noted.add(d)
            kept.append(d)
        self.diags.items[first:] = kept
