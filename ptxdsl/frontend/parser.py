"""The .ptxdsl text frontend: lark parses, and a top-down walk of the tree calls the same
KernelBuilder as the Python API, in source order."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lark

from .. import ir
from .. import types as T
from ..bounds import MAX_NESTING, MAX_SOURCE_BYTES, stack_room
from ..builder import BINARY_SYMBOL, VALUE_FUNCTIONS, KernelBuilder, Lit
from ..builder.atomic import ATOMIC_FUNCTIONS, WORD_OPS, WORDS, word
from ..builder.common import ptx_name_ok
from ..builder.hints import type_hint
from ..builder.literals import LiteralError, float_literal, int_literal
from ..errors import CompileError, Diagnostic, DiagnosticBag, Note, Source, Span
from ..opdef import BY_SYNTAX
from .functions import FunctionWalker
from .generics import CompileTimeWalker
from .syntax import syntax_error


def _grammar_text() -> str:
    # A source checkout keeps the grammar at <root>/grammar; a wheel ships it as the package
    # ptxdsl.grammar (pyproject's package-dir), beside this package.
    package = Path(__file__).resolve().parent.parent
    for candidate in (package.parent / "grammar" / "ptxdsl.lark",
                      package / "grammar" / "ptxdsl.lark"):
        if candidate.is_file():
            return candidate.read_text()
    from importlib import resources

    return resources.files("ptxdsl.grammar").joinpath("ptxdsl.lark").read_text()


@functools.cache
def _parser() -> lark.Lark:
    return lark.Lark(_grammar_text(), parser="lalr", propagate_positions=True,
                     maybe_placeholders=True)


def parse_tree(source: Source) -> lark.Tree:
    """The lark parse tree of a source, or a CompileError with a located syntax error."""
    try:
        return _parser().parse(source.text)
    except lark.UnexpectedInput as e:
        raise CompileError(syntax_error(source, e, _parser().terminals)) from None


def parse(text: str, filename: str = "<string>",
          defines: Mapping[str, object] | None = None) -> ir.Module:
    """Parse .ptxdsl text into IR; raises CompileError with every problem found.

    `defines` gives compile-time kernel parameters their values (`{"N": 4096}`; strings are
    read as the command line's `-D N=4096` is): each kernel that declares the parameter is
    instantiated with it, and the IR holds the instantiated kernels."""
    source = Source(filename, text)
    tree = parse_tree(source)
    _check_nesting(source, tree)
    diags = DiagnosticBag()
    with stack_room():
        module = _Walker(source, diags, dict(defines or {})).module(tree)
    diags.raise_if_any()
    return module


def _check_nesting(source: Source, tree: lark.Tree) -> None:
    """A located error for blocks or expressions nested beyond MAX_NESTING levels, found
    without recursion (the walk that follows recurses once per level)."""
    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_NESTING:
            meta = node.meta
            span = Span(source, meta.start_pos, meta.start_pos + 1) \
                if not getattr(meta, "empty", True) else Span(source, 0, 0)
            raise CompileError(Diagnostic(
                f"this is nested more than {MAX_NESTING} levels deep (blocks inside blocks, "
                "or operators applied to operators); split it with 'let' or a helper kernel",
                span))
        stack.extend((c, depth + (c.data not in _NOT_A_LEVEL)) for c in node.children
                     if isinstance(c, lark.Tree))


_NOT_A_LEVEL = {"block", "args"}  # a statement's block, an argument list: one level with it


def read_source(path: str | Path) -> Source:
    """Read a .ptxdsl file, rejecting binary or non-UTF-8 content with a located error."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise CompileError(f"cannot read '{path}': {e.strerror or e}") from None
    name = str(path)
    if len(data) > MAX_SOURCE_BYTES:
        raise CompileError(Diagnostic(f"this file has {len(data)} bytes; a source file has at "
                                      f"most {MAX_SOURCE_BYTES}", Span(Source(name, ""), 0, 0)))
    if b"\0" in data:
        raise CompileError(Diagnostic("not a text file (it contains NUL bytes)",
                                      Span(Source(name, ""), 0, 0)))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        src = Source(name, data[: e.start].decode("utf-8", "replace"))
        raise CompileError(Diagnostic(f"not UTF-8 text (invalid byte 0x{data[e.start]:02x})",
                                      Span(src, e.start, e.start + 1))) from None
    return Source(name, text)


def parse_file(path: str | Path, defines: Mapping[str, object] | None = None) -> ir.Module:
    source = read_source(path)
    return parse(source.text, source.name, defines)


# ----------------------------------------------------------------------------- tree walk

_COMPARE = {"eq", "ne", "lt", "le", "gt", "ge"}
_COMPOUND = {"+=": "add", "-=": "sub", "*=": "mul", "/=": "div", "%=": "rem", "&=": "and",
             "|=": "or", "^=": "xor", "<<=": "shl", ">>=": "shr"}


class _Walker(FunctionWalker, CompileTimeWalker):
    def __init__(self, source: Source, diags: DiagnosticBag,
                 defines: dict[str, object] | None = None):
        self.source = source
        self.diags = diags
        self._builder: KernelBuilder | None = None
        self.defines = defines or {}
        self.used_defines: set[str] = set()
        self.type_params: dict[str, T.Scalar] = {}  # the kernel's `T: type` parameters
        # module-level constants, and each kernel's compile-time parameters while its
        # header is read, live in a builder of their own
        self.consts = KernelBuilder("<constants>", threads=1, diags=diags)

    @property
    def b(self) -> KernelBuilder:
        """The builder of the kernel being walked."""
        if self._builder is None:
            raise AssertionError("statements and expressions are walked inside a kernel")
        return self._builder

    def span(self, node: lark.Tree | lark.Token) -> Span | None:
        if isinstance(node, lark.Token):
            if node.start_pos is None:
                return None
            return Span(self.source, node.start_pos, node.end_pos or node.start_pos)
        meta = node.meta
        if getattr(meta, "empty", True):
            return None
        return Span(self.source, meta.start_pos, meta.end_pos)

    def module(self, tree: lark.Tree) -> ir.Module:
        kernels = []
        seen: dict[str, Span | None] = {}
        self.define_functions(tree)
        for k in tree.children:
            if k.data == "function":
                continue
            if k.data in ("const_decl", "static_assert"):
                self._builder = self.consts
                getattr(self, "s_" + k.data)(k)
                continue
            kern = self.kernel(k)
            if kern.name in seen:
                self.diags.error(f"kernel '{kern.name}' is defined twice", kern.loc,
                                 Note("first defined here", seen[kern.name]))
            seen[kern.name] = kern.loc
            kernels.append(kern)
        self.check_defines(tree)
        if not kernels:
            self.diags.error("no kernel in this file (expected 'kernel name(...) threads(N) "
                             "{ ... }')", Span(self.source, 0, 0))
        return ir.Module(kernels=tuple(kernels), loc=Span(self.source, 0, len(self.source.text)))

    def kernel(self, tree: lark.Tree) -> ir.Kernel:
        name_tok, *rest = tree.children
        block = rest[-1]
        attrs = [c for c in rest if isinstance(c, lark.Tree) and c.data == "attr"]
        params = [c for c in rest if isinstance(c, lark.Tree) and c.data == "param"]
        generics = [c for c in rest if isinstance(c, lark.Tree) and c.data == "generics"]
        loc = self.span(name_tok)
        self.type_params = {}
        self.consts.push()
        self._builder = self.consts
        for g in generics:
            self.generics(str(name_tok), g)
        settings: dict[str, object] = {}
        for a in attrs:
            key_tok, vals = a.children
            key = str(key_tok)
            nums = tuple(self.const_int(v, f"{key}()") for v in vals.children) \
                if vals is not None else ()
            if any(n is None for n in nums):
                settings.setdefault(str(key_tok), None)  # reported: no second message
                continue
            if key not in ("threads", "cluster", "maxnreg", "minctas", "nonportable"):
                self.diags.error(f"unknown kernel attribute '{key}'; expected threads, cluster, "
                                 "nonportable, maxnreg or minctas", self.span(key_tok))
                continue
            if (key == "nonportable") != (not nums):
                self.diags.error(f"attribute '{key}' takes "
                                 f"{'no values' if key == 'nonportable' else 'values'}",
                                 self.span(a))
                continue
            if key == "nonportable":
                settings[key] = True
                continue
            if key in settings:
                self.diags.error(f"attribute '{key}' is given twice", self.span(key_tok))
            if key in ("maxnreg", "minctas"):
                if len(nums) != 1:
                    self.diags.error(f"{key} takes one integer", self.span(a))
                    continue
                settings[key] = nums[0]
            else:
                settings[key] = nums
        if "threads" not in settings:
            self.diags.error(f"kernel '{name_tok}' needs a thread count: threads(N)", loc)
        settings = {k: v for k, v in settings.items() if v is not None}
        settings.setdefault("threads", (1,))
        if not ptx_name_ok(str(name_tok)):
            self.diags.error(f"'{name_tok}' cannot name a kernel: PTX names it, and a lone '_' "
                             "is not a PTX identifier", loc)
        b = KernelBuilder(str(name_tok), loc=loc, diags=self.diags, **settings)  # type: ignore[arg-type]
        for frame in self.consts.frames:  # module constants and compile-time parameters
            b.frames[0].names.update(frame.names)
        self.consts.pop()
        self._builder = b
        for p in params:
            pname, ptype = p.children
            b.param(str(pname), self.type(ptype), self.span(p))
        self.block(block)
        return b.finish()

    def type(self, tree: lark.Tree) -> T.Type | None:
        kind = tree.data
        if kind == "type_name":
            tok = tree.children[0]
            ty = self.named_type(str(tok))
            if ty is None:
                self.diags.error(f"unknown type '{tok}'{type_hint(str(tok))}", self.span(tok))
            return ty
        elem_tok = tree.children[0]
        elem = self.type_params.get(str(elem_tok)) or T.SCALARS.get(str(elem_tok))
        if kind == "vec_type":
            return self.vec_type(elem, elem_tok, tree.children[1])
        if elem is None or elem.is_pred:
            self.diags.error(f"unknown element type '{elem_tok}'{type_hint(str(elem_tok))}",
                             self.span(elem_tok))
            return None
        if kind == "array_type":
            dims = tuple(self.const_int(d, "an array dimension") for d in tree.children[1].children)
            if any(d is None for d in dims):
                return None
            return self.b.reg_array_type(elem, dims, self.span(tree))  # type: ignore[arg-type]
        if kind == "ptr_type":
            return T.Ptr(elem)
        rank = self.number(tree.children[1])
        return T.TensorMap(elem, rank) if isinstance(rank, int) else None

    # ------------------------------------------------------------------ statements

    def block(self, tree: lark.Tree) -> None:
        with self.names():
            for s in tree.children:
                getattr(self, "s_" + s.data)(s)

    def body(self, tree: lark.Tree) -> tuple[ir.Stmt, ...]:
        assert self.b is not None
        self.b.push()
        self.block(tree)
        return self.b.pop()

    def buffer_spec(self, t: lark.Tree) -> tuple | None:
        """(name, elem, shape, align or None, span, swizzle, major) of `name: T[d0]... [align A]
        [swizzle S [mn]]`."""
        name, elem_tok, dims, align, swizzle = t.children
        elem = self.type_params.get(str(elem_tok)) or T.SCALARS.get(str(elem_tok))
        if elem is None:
            self.diags.error(f"unknown element type '{elem_tok}'{type_hint(str(elem_tok))}",
                             self.span(elem_tok))
            return None
        shape = tuple(self.const_int(d, "a buffer dimension") for d in dims.children)
        a = self.const_int(align, "an alignment") if align is not None else None
        if any(d is None for d in shape) or (align is not None and a is None):
            return None
        swz = self.const_int(swizzle.children[0], "a swizzle") if swizzle is not None else 0
        if swz is None:
            return None
        major = "mn" if swizzle is not None and swizzle.children[1] is not None else "k"
        return str(name), elem, shape, a, self.span(t), swz, major

    def s_shared_decl(self, t: lark.Tree) -> None:
        spec = self.buffer_spec(t)
        if spec is None or isinstance(self.b.shared(*spec).type, T.ErrorType):
            # reported: uses of the name stay quiet
            self.b.poison(str(t.children[0]), self.span(t))

    def s_barrier_decl(self, t: lark.Tree) -> None:
        name, n, count = t.children
        size = self.const_int(n, "an mbarrier array size") if n is not None else 0
        c = self.const_int(count, "an arrival count")
        if size is None or c is None or \
                isinstance(self.b.mbarrier(str(name), size, c, self.span(t)).type, T.ErrorType):
            self.b.poison(str(name), self.span(t))

    def s_pipeline_decl(self, t: lark.Tree) -> None:
        name, stages, *bufs = t.children
        specs = [self.buffer_spec(b) for b in bufs]
        n = self.const_int(stages, "a stage count")
        good = [s for s in specs if s is not None]
        if n is None or len(good) != len(specs) or \
                isinstance(self.b.pipeline(str(name), n, good, self.span(t)).type, T.ErrorType):
            self.b.poison(str(name), self.span(t))

    def s_role_stmt(self, t: lark.Tree) -> None:
        name, start, stop, regs, body = t.children
        first, last = self.const_int(start, "a warp index"), self.const_int(stop, "a warp index")
        nregs = self.const_int(regs, "a register count") if regs is not None else None
        header = self.b.role_begin(str(name), first or 0, last or 0, nregs, self.span(name))
        self.block(body)
        self.b.role_end(header, self.span(t))

    def s_const_decl(self, t: lark.Tree) -> None:
        name, ty, value = t.children
        const_type = self.type(ty) if ty is not None else None
        if ty is not None and const_type is None:
            return
        self.b.const(self.declare(str(name)), const_type, self.expr(value), self.span(t))

    def s_static_assert(self, t: lark.Tree) -> None:
        cond, message = t.children
        text = self.source.text[cond.meta.start_pos:cond.meta.end_pos] \
            if isinstance(cond, lark.Tree) else str(cond)
        self.b.static_assert(self.expr(cond), _unescape(str(message)[1:-1]) if message else None,
                             text, self.span(t))

    def s_async_stmt(self, t: lark.Tree) -> None:
        name, body = t.children
        header = self.b.async_begin(str(name), self.span(name))
        self.block(body)
        self.b.async_end(header, self.span(t))

    def s_turn_stmt(self, t: lark.Tree) -> None:
        cond, body = t.children
        header = self.b.turn_begin(self.expr(cond) if cond is not None else None, self.span(t))
        self.block(body)
        self.b.turn_end(header)

    def s_let_stmt(self, t: lark.Tree) -> None:
        name, ty, value = t.children
        var_type = self.type(ty) if ty is not None else None
        if ty is not None and var_type is None:
            var_type = T.error
        init = self.expr(value) if value is not None else None
        self.b.let(self.declare(str(name)), var_type, init, self.span(t))

    def s_assign(self, t: lark.Tree) -> None:
        target, value = t.children
        if target.data == "name":
            name = self.use(str(target.children[0]), self.span(target))
            if name is not None:
                self.b.assign(name, self.expr(value), self.span(t), self.span(target))
        else:
            self.b.store(self.place(target), self.expr(value), self.span(t))

    def s_compound_assign(self, t: lark.Tree) -> None:
        target, op_tok, value = t.children
        op = _COMPOUND[str(op_tok)]
        loc = self.span(t)
        if target.data == "name":
            name = self.use(str(target.children[0]), self.span(target))
            if name is None:
                return
            cur = self.b.name(name, self.span(target))
            self.b.assign(name, self.b.binary(op, cur, self.expr(value), loc), loc,
                          self.span(target))
        else:
            place = self.place(target)
            self.b.store(place, self.b.binary(op, place, self.expr(value), loc), loc)

    def s_call_stmt(self, t: lark.Tree) -> None:
        call = t.children[0]
        if not isinstance(call, lark.Tree) or call.data != "call":
            self.diags.error("expected a statement; this expression's value is unused",
                             self.span(t))
            return
        name, args = call.children
        if str(name) in self.functions:
            self.call_function(self.functions[str(name)], _children(args), self.span(call))
            return
        if str(name) not in BY_SYNTAX and (fn := self.close_function(str(name))) is not None:
            self.diags.error(f"unknown operation '{name}'; did you mean '{fn}' (a function of "
                             "this file)?", self.span(call))
            return
        if str(name) in VALUE_FUNCTIONS:
            self.diags.error(f"the value of '{name}(...)' is unused", self.span(call))
            return
        self.b.op(str(name), self.call_args(str(name), args, lists=True), self.span(call))

    def s_if_stmt(self, t: lark.Tree) -> None:
        cond, then, orelse = t.children
        c = self.expr(cond)
        then_body = self.body(then)
        else_body: tuple[ir.Stmt, ...] = ()
        if orelse is not None:
            if orelse.data == "block":
                else_body = self.body(orelse)
            else:
                self.b.push()
                self.s_if_stmt(orelse)
                else_body = self.b.pop()
        self.b.if_stmt(c, then_body, else_body, self.span(t))

    def s_for_stmt(self, t: lark.Tree) -> None:
        var, start, stop, step, unroll, body = t.children
        first, last = self.expr(start), self.expr(stop)
        by = self.expr(step) if step is not None else None
        with self.names():
            name = self.declare(str(var))
            header = self.b.for_header(name, first, last, by, self.span(var),
                                       unroll=unroll is not None)
            self.block(body)
            self.b.for_stmt(name, header, self.span(t))

    def s_work_stmt(self, t: lark.Tree) -> None:
        var, sched, body = t.children
        header = self.b.work_begin(str(var), self.b.name(str(sched), self.span(sched)),
                                   self.span(var))
        self.block(body)
        self.b.work_end(header)

    def s_schedule_decl(self, t: lark.Tree) -> None:
        name, *clauses = t.children
        got = []
        for c in clauses:
            cname, args = c.children
            got.append((str(cname), [self.expr(a) for a in args.children] if args else [],
                        self.span(c)))
        self.b.schedule(str(name), got, self.span(name))

    def s_while_stmt(self, t: lark.Tree) -> None:
        cond, body = t.children
        outer, self.no_calls = self.no_calls, "a 'while' condition"
        try:
            c = self.b.value(self.expr(cond), T.pred)
        finally:
            self.no_calls = outer
        self.b.while_stmt(c, self.body(body), self.span(t))

    def s_return_stmt(self, t: lark.Tree) -> None:
        if t.children[0] is not None:
            self.diags.error("a kernel returns no value ('return value;' ends a function)",
                             self.span(t))
            return
        self.b.emit(ir.Return(loc=self.span(t)))

    def s_asm_stmt(self, t: lark.Tree) -> None:
        template, outs, args = t.children
        text = _unescape(str(template)[1:-1])
        out_names = [(self.use(str(o), self.span(o)) or str(o), self.span(o))
                     for o in outs.children] if outs is not None else []
        self.b.asm(text, out_names, self.args(args), self.span(t))

    # ------------------------------------------------------------------ expressions

    def number(self, tok: Any) -> int | float | None:
        """The value of an INT or FLOAT token, or None after a located error."""
        try:
            return int_literal(str(tok)) if tok.type == "INT" else float_literal(str(tok))
        except LiteralError as e:
            self.diags.error(str(e), self.span(tok))
            return None

    def args(self, tree: lark.Tree | None, lists: bool = False) -> list:
        """Arguments; `lists`: of an operation, where a list (coordinates) is one too."""
        if tree is None:
            return []
        return [self.expr(c, lists) for c in tree.children]

    def call_args(self, fn: str, tree: lark.Tree | None, lists: bool = False) -> list:
        """Arguments of a call (`lists`: of an operation, where a list is one too); in the
        calls that take a memory order or scope, a bare word such as `acq_rel` or `gpu` that
        names no variable is that word."""
        if tree is None or (fn not in ATOMIC_FUNCTIONS and fn not in WORD_OPS):
            return self.args(tree, lists)
        out = []
        for c in tree.children:
            if isinstance(c, lark.Tree) and c.data == "name" and str(c.children[0]) in WORDS \
                    and not self.visible(str(c.children[0])):
                out.append(word(str(c.children[0]), self.span(c)))
            else:
                out.append(self.expr(c, lists))
        return out

    def place(self, t: lark.Tree) -> ir.Expr:
        e = self.expr(t)
        if isinstance(e, Lit):
            self.diags.error("cannot assign to a literal", self.span(t))
            return ir.Const(value=0, type=T.error)
        return e

    def expr(self, t: lark.Tree, lists: bool = False):
        """The operand of expression `t`; a list literal only where `lists` allows one."""
        data = t.data
        loc = self.span(t)
        b = self.b
        if data == "list" and not lists:
            self.diags.error("a list is not a value here (lists are arguments of operations: "
                             "coordinates)", loc)
            return ir.Const(value=0, type=T.error)
        if data in BINARY_SYMBOL:
            x, y = t.children
            return b.binary(data, self.expr(x), self.expr(y), loc)
        if data in _COMPARE:
            x, y = t.children
            return b.compare(data, self.expr(x), self.expr(y), loc)
        if data in ("neg", "not"):
            return b.unary(data, self.expr(t.children[0]), loc)
        if data == "cast":
            x, ty_tok = t.children
            ty = self.named_type(str(ty_tok))
            if ty is None:
                self.diags.error(f"unknown type '{ty_tok}'{type_hint(str(ty_tok))}",
                                 self.span(ty_tok))
            return b.cast(self.expr(x), ty, loc)
        if data == "name":
            if str(t.children[0]) in self.type_params:
                self.diags.error(f"'{t.children[0]}' is a type, not a value (sizeof("
                                 f"{t.children[0]}) is its size in bytes)", loc)
                return ir.Const(value=0, type=T.error)
            var = self.use(str(t.children[0]), loc)
            return b.name(var, loc) if var is not None else ir.Const(value=0, type=T.error)
        if data == "sreg":
            return b.sreg(str(t.children[0])[1:], loc)
        if data in ("int", "float"):
            value = self.number(t.children[0])
            return Lit(value, loc) if value is not None else ir.Const(value=0, type=T.error)
        if data in ("true", "false"):
            return Lit(data == "true", loc)
        if data == "list":
            return self.args(t.children[0])
        if data == "index":
            base, idx = t.children
            bv = self.expr(base)
            if isinstance(bv, (Lit, list)):
                self.diags.error("only shared buffers, pointers, mbarrier arrays and vectors "
                                 "can be indexed", loc)
                return ir.Const(value=0, type=T.error)
            return b.index(bv, self.args(idx), loc)
        if data == "member":
            base, attr = t.children
            bv = self.expr(base)
            if isinstance(bv, (Lit, list)):
                self.diags.error(f"a literal has no member '{attr}'", loc)
                return ir.Const(value=0, type=T.error)
            return b.member(bv, str(attr), loc)
        if data == "call":
            name, args = t.children
            if str(name) in BY_SYNTAX:
                self.diags.error(f"'{name}' is an operation and has no value", loc)
                return ir.Const(value=0, type=T.error)
            if str(name) == "sizeof" and (size := self.sizeof_type(args)) is not None:
                return Lit(size, loc)
            if str(name) in self.functions:
                value = self.call_function(self.functions[str(name)], _children(args), loc)
                if value is None:
                    self.diags.error(f"function '{name}' returns no value (it has no "
                                     "'-> type')", loc)
                    return ir.Const(value=0, type=T.error)
                return value
            if str(name) not in VALUE_FUNCTIONS and T.parse_type_name(str(name)) is None and \
                    (fn := self.close_function(str(name))) is not None:
                self.diags.error(f"unknown function '{name}'; did you mean '{fn}' (a function "
                                 "of this file)?", loc)
                return ir.Const(value=0, type=T.error)
            return b.call(str(name), self.call_args(str(name), args), loc)
        raise AssertionError(f"unhandled expression {data}")


def _children(args: lark.Tree | None) -> list:
    return list(args.children) if args is not None else []


def _unescape(s: str) -> str:
    return s.encode("utf-8").decode("unicode_escape") if "\\" in s else s

