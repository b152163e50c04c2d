"""The .ptxdsl text frontend: lark parses, and a top-down walk of the tree calls the same
KernelBuilder as the Python API, in source order."""

from __future__ import annotations

import functools
from pathlib import Path

import lark

from . import ir
from . import types as T
from .builder import BINARY_SYMBOL, KernelBuilder, Lit
from .errors import CompileError, Diagnostic, DiagnosticBag, Source, Span
from .opdef import BY_SYNTAX


def _grammar_text() -> str:
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "grammar" / "ptxdsl.lark", here / "grammar" / "ptxdsl.lark"):
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
        raise CompileError(_syntax_error(source, e)) from None


def parse(text: str, filename: str = "<string>") -> ir.Module:
    """Parse .ptxdsl text into IR; raises CompileError with every problem found."""
    source = Source(filename, text)
    tree = parse_tree(source)
    diags = DiagnosticBag()
    module = _Walker(source, diags).module(tree)
    diags.raise_if_any()
    return module


def read_source(path: str | Path) -> Source:
    """Read a .ptxdsl file, rejecting binary or non-UTF-8 content with a located error."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise CompileError(f"cannot read '{path}': {e.strerror or e}") from None
    name = str(path)
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


def parse_file(path: str | Path) -> ir.Module:
    source = read_source(path)
    return parse(source.text, source.name)


# ----------------------------------------------------------------------------- syntax errors

_TERMINAL_NAMES = {
    "NAME": "a name", "INT": "an integer", "FLOAT": "a number", "STRING": "a string",
    "SREG": "a special register (%tid.x, ...)", "COMPOUND": "a compound assignment",
    "$END": "end of file",
}  # fmt: skip


def _terminal_text(name: str) -> str:
    if name in _TERMINAL_NAMES:
        return _TERMINAL_NAMES[name]
    for t in _parser().terminals:
        if t.name == name:
            pat = t.pattern
            if isinstance(pat, lark.lexer.PatternStr):
                return f"'{pat.value}'"
    return name


def _syntax_error(source: Source, e: lark.UnexpectedInput) -> Diagnostic:
    pos = getattr(e, "pos_in_stream", None)
    if isinstance(e, lark.UnexpectedToken):
        tok = e.token
        if tok.type == "$END":
            start = len(source.text.rstrip())
            span = Span(source, max(0, start - 1), start)
            what = "unexpected end of file"
        else:
            start = tok.start_pos if tok.start_pos is not None else 0
            span = Span(source, start, tok.end_pos or start + 1)
            kind = {"NAME": "name ", "INT": "integer ", "FLOAT": "number ", "STRING": "string ",
                    "SREG": "special register "}.get(tok.type, "")
            what = f"unexpected {kind}{str(tok)!r}"
        expected = sorted({_terminal_text(x) for x in e.expected})
        if tok.type == "$END" and "'}'" in expected:
            what += "; expected '}' (a block is not closed)"
        elif "';'" in expected and len(expected) > 3:
            # after a complete expression LALR also accepts every operator; name the usual fix
            what += "; expected ';' (or an operator)"
        elif expected:
            what += "; expected " + (expected[0] if len(expected) == 1 else
                                     "one of: " + ", ".join(expected))
        return Diagnostic(what, span)
    if isinstance(e, lark.UnexpectedCharacters):
        start = pos if pos is not None else 0
        ch = source.text[start : start + 1]
        return Diagnostic(f"unexpected character {ch!r}", Span(source, start, start + 1))
    start = pos or 0
    return Diagnostic("syntax error", Span(source, start, start + 1))


# ----------------------------------------------------------------------------- tree walk

_COMPARE = {"eq", "ne", "lt", "le", "gt", "ge"}
_COMPOUND = {"+=": "add", "-=": "sub", "*=": "mul", "/=": "div", "%=": "rem", "&=": "and",
             "|=": "or", "^=": "xor", "<<=": "shl", ">>=": "shr"}


class _Walker:
    def __init__(self, source: Source, diags: DiagnosticBag):
        self.source = source
        self.diags = diags
        self.b: KernelBuilder | None = None

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
        for k in tree.children:
            kern = self.kernel(k)
            if kern.name in seen:
                from .errors import Note

                self.diags.error(f"kernel '{kern.name}' is defined twice", kern.loc,
                                 Note("first defined here", seen[kern.name]))
            seen[kern.name] = kern.loc
            kernels.append(kern)
        if not kernels:
            self.diags.error("no kernel in this file (expected 'kernel name(...) threads(N) "
                             "{ ... }')", Span(self.source, 0, 0))
        return ir.Module(kernels=tuple(kernels), loc=Span(self.source, 0, len(self.source.text)))

    def kernel(self, tree: lark.Tree) -> ir.Kernel:
        name_tok, *rest = tree.children
        block = rest[-1]
        attrs = [c for c in rest if isinstance(c, lark.Tree) and c.data == "attr"]
        params = [c for c in rest if isinstance(c, lark.Tree) and c.data == "param"]
        loc = self.span(name_tok)
        settings: dict[str, object] = {}
        for a in attrs:
            key_tok, *vals = a.children
            key = str(key_tok)
            nums = tuple(int(str(v), 0) for v in vals)
            if key not in ("threads", "cluster", "maxnreg", "minctas"):
                self.diags.error(f"unknown kernel attribute '{key}'; expected threads, cluster, "
                                 "maxnreg or minctas", self.span(key_tok))
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
            settings["threads"] = (1,)
        b = KernelBuilder(str(name_tok), loc=loc, diags=self.diags, **settings)  # type: ignore[arg-type]
        self.b = b
        for p in params:
            pname, ptype = p.children
            b.param(str(pname), self.type(ptype), self.span(p))
        self.block(block)
        return b.finish()

    def type(self, tree: lark.Tree) -> T.Type | None:
        kind = tree.data
        if kind == "type_name":
            tok = tree.children[0]
            ty = T.parse_type_name(str(tok))
            if ty is None:
                self.diags.error(f"unknown type '{tok}'", self.span(tok))
            return ty
        elem_tok = tree.children[0]
        elem = T.SCALARS.get(str(elem_tok))
        if elem is None or elem.is_pred:
            self.diags.error(f"unknown element type '{elem_tok}'", self.span(elem_tok))
            return None
        if kind == "array_type":
            return self.b.reg_array_type(elem, tuple(int(str(d), 0) for d in
                                                      tree.children[1].children), self.span(tree))
        if kind == "ptr_type":
            return T.Ptr(elem)
        return T.TensorMap(elem, int(str(tree.children[1]), 0))

    # ------------------------------------------------------------------ statements

    def block(self, tree: lark.Tree) -> None:
        for s in tree.children:
            getattr(self, "s_" + s.data)(s)

    def body(self, tree: lark.Tree) -> tuple[ir.Stmt, ...]:
        assert self.b is not None
        self.b.push()
        self.block(tree)
        return self.b.pop()

    def buffer_spec(self, t: lark.Tree) -> tuple | None:
        """(name, elem, shape, align or None, span) of `name: T[d0]... [align A]`."""
        name, elem_tok, dims, align, swizzle = t.children
        elem = T.SCALARS.get(str(elem_tok))
        if elem is None:
            self.diags.error(f"unknown element type '{elem_tok}'", self.span(elem_tok))
            return None
        shape = tuple(int(str(d), 0) for d in dims.children)
        swz = int(str(swizzle.children[0]), 0) if swizzle is not None else 0
        major = "mn" if swizzle is not None and swizzle.children[1] is not None else "k"
        return (str(name), elem, shape, int(str(align), 0) if align else None, self.span(t),
                swz, major)

    def s_shared_decl(self, t: lark.Tree) -> None:
        spec = self.buffer_spec(t)
        if spec is not None:
            self.b.shared(*spec)

    def s_barrier_decl(self, t: lark.Tree) -> None:
        name, n, count = t.children
        self.b.mbarrier(str(name), int(str(n), 0) if n is not None else 0, int(str(count), 0),
                        self.span(t))

    def s_pipeline_decl(self, t: lark.Tree) -> None:
        name, stages, *bufs = t.children
        specs = [s for s in map(self.buffer_spec, bufs) if s is not None]
        self.b.pipeline(str(name), int(str(stages), 0), specs, self.span(t))

    def s_role_stmt(self, t: lark.Tree) -> None:
        name, start, stop, regs, body = t.children
        header = self.b.role_begin(str(name), int(str(start), 0), int(str(stop), 0),
                                   int(str(regs), 0) if regs is not None else None, self.span(name))
        self.block(body)
        self.b.role_end(header, self.span(t))

    def s_let_stmt(self, t: lark.Tree) -> None:
        name, ty, value = t.children
        var_type = self.type(ty) if ty is not None else None
        if ty is not None and var_type is None:
            var_type = T.error
        self.b.let(str(name), var_type, self.expr(value) if value is not None else None,
                   self.span(t))

    def s_assign(self, t: lark.Tree) -> None:
        target, value = t.children
        if target.data == "name":
            self.b.assign(str(target.children[0]), self.expr(value), self.span(t),
                          self.span(target))
        else:
            self.b.store(self.place(target), self.expr(value), self.span(t))

    def s_compound_assign(self, t: lark.Tree) -> None:
        target, op_tok, value = t.children
        op = _COMPOUND[str(op_tok)]
        loc = self.span(t)
        if target.data == "name":
            name = str(target.children[0])
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
        from .builder import VALUE_FUNCTIONS

        if str(name) in VALUE_FUNCTIONS:
            self.diags.error(f"the value of '{name}(...)' is unused", self.span(call))
            return
        self.b.op(str(name), self.args(args), self.span(call))

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
        header = self.b.for_header(str(var), self.expr(start), self.expr(stop),
                                   self.expr(step) if step is not None else None,
                                   self.span(var), unroll=unroll is not None)
        self.block(body)
        self.b.for_stmt(str(var), header, self.span(t))

    def s_while_stmt(self, t: lark.Tree) -> None:
        cond, body = t.children
        c = self.b.value(self.expr(cond), T.pred)
        self.b.while_stmt(c, self.body(body), self.span(t))

    def s_return_stmt(self, t: lark.Tree) -> None:
        self.b.emit(ir.Return(loc=self.span(t)))

    def s_asm_stmt(self, t: lark.Tree) -> None:
        template, outs, args = t.children
        text = _unescape(str(template)[1:-1])
        out_names = [(str(o), self.span(o)) for o in outs.children] if outs is not None else []
        self.b.asm(text, out_names, self.args(args), self.span(t))

    # ------------------------------------------------------------------ expressions

    def args(self, tree: lark.Tree | None) -> list:
        if tree is None:
            return []
        return [self.expr(c) for c in tree.children]

    def place(self, t: lark.Tree) -> ir.Expr:
        e = self.expr(t)
        if isinstance(e, Lit):
            self.diags.error("cannot assign to a literal", self.span(t))
            return ir.Const(value=0, type=T.error)
        return e

    def expr(self, t: lark.Tree | lark.Token):
        data = t.data
        loc = self.span(t)
        b = self.b
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
            ty = T.parse_type_name(str(ty_tok))
            if ty is None:
                self.diags.error(f"unknown type '{ty_tok}'", self.span(ty_tok))
            return b.cast(self.expr(x), ty, loc)
        if data == "name":
            return b.name(str(t.children[0]), loc)
        if data == "sreg":
            return b.sreg(str(t.children[0])[1:], loc)
        if data == "int":
            return Lit(int(str(t.children[0]), 0), loc)
        if data == "float":
            return Lit(float(str(t.children[0])), loc)
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
            return b.call(str(name), self.args(args), loc)
        raise AssertionError(f"unhandled expression {data}")


def _unescape(s: str) -> str:
    return s.encode("utf-8").decode("unicode_escape") if "\\" in s else s

