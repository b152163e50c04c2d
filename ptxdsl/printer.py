"""IR back to canonical .ptxdsl text; parse(print(ir)) == ir for every kernel.

The IR holds instantiated kernels (constants folded, compile-time parameters given their
values), so the printer writes the instantiated kernel: `kernel k<N: u32 = 8192>` with
`bf16[N]` prints as `kernel k` with `bf16[8192]`, which parses back to the same IR."""

from __future__ import annotations

from . import ir
from . import types as T
from .opdef import definition

_BIN = {"add": ("+", 8), "sub": ("-", 8), "mul": ("*", 9), "div": ("/", 9), "rem": ("%", 9),
        "and": ("&", 6), "or": ("|", 4), "xor": ("^", 5), "shl": ("<<", 7), "shr": (">>", 7)}
_PRED_BIN = {"and": ("&&", 2), "or": ("||", 1)}
_CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_CMP_PREC, _CAST_PREC, _UNARY_PREC, _POSTFIX_PREC = 3, 10, 11, 12


def type_text(t: T.Type) -> str:
    if isinstance(t, T.Ptr):
        return f"ptr<{t.elem}>"
    if isinstance(t, T.TensorMap):
        return f"tmap<{t.elem}, {t.rank}>"
    return str(t)


def _default_literal_type(c: ir.Const) -> T.Type:
    if isinstance(c.value, bool):
        return T.pred
    return T.f32 if isinstance(c.value, float) else T.u32


def _const_text(c: ir.Const) -> str:
    v = c.value
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) or (isinstance(c.type, T.Scalar) and c.type.is_float):
        text = repr(float(v))
        return text if ("." in text or "e" in text) else text + ".0"
    return str(v)


def expr_text(e: ir.Expr, prec: int = 0, typed: bool = False) -> str:
    """`typed`: the context gives a bare literal its type (the other operand, a declaration)."""
    if isinstance(e, ir.Const):
        text = _const_text(e)
        if typed or e.type == _default_literal_type(e):
            return f"({text})" if text.startswith("-") and prec >= _UNARY_PREC else text
        return _paren(f"{text} as {e.type}", _CAST_PREC, prec)
    if isinstance(e, (ir.Var, ir.SharedBuf, ir.BarrierObj)):
        return e.name
    if isinstance(e, ir.SReg):
        return f"%{e.name}"
    if isinstance(e, ir.Binary):
        if e.op in ("min", "max"):
            return f"{e.op}({_pair(e.a, e.b)})"
        sym, p = (_PRED_BIN if e.type == T.pred else _BIN)[e.op]
        ta = not isinstance(e.b, ir.Const)
        tb = not isinstance(e.a, ir.Const) or e.op in ("shl", "shr")
        return _paren(f"{expr_text(e.a, p, ta)} {sym} {expr_text(e.b, p + 1, tb)}", p, prec)
    if isinstance(e, ir.Compare):
        ta, tb = not isinstance(e.b, ir.Const), not isinstance(e.a, ir.Const)
        text = (f"{expr_text(e.a, _CMP_PREC + 1, ta)} {_CMP[e.op]} "
                f"{expr_text(e.b, _CMP_PREC + 1, tb)}")
        return _paren(text, _CMP_PREC, prec)
    if isinstance(e, ir.Unary):
        sym = "-" if e.op == "neg" else ("!" if e.type == T.pred else "~")
        return _paren(f"{sym}{expr_text(e.x, _UNARY_PREC)}", _UNARY_PREC, prec)
    if isinstance(e, ir.Cast):
        return _paren(f"{expr_text(e.x, _CAST_PREC)} as {e.type}", _CAST_PREC, prec)
    if isinstance(e, ir.Select):
        return f"select({expr_text(e.cond)}, {_pair(e.a, e.b)})"
    if isinstance(e, ir.Call):
        typed_args = e.fn in ("fma",) and any(not isinstance(a, ir.Const) for a in e.args)
        inner = ", ".join(expr_text(a, 0, typed_args or i > 0 and e.fn.startswith("shfl"))
                          for i, a in enumerate(e.args))
        return f"{e.fn}({inner})"
    if isinstance(e, ir.Atomic):
        words = [e.sem, e.scope] if e.scope != "gpu" else [e.sem] if e.sem != "relaxed" else []
        inner = ", ".join([expr_text(e.ref), *(expr_text(a, 0, True) for a in e.args), *words])
        return f"{e.syntax}({inner})"
    if isinstance(e, ir.AtomicLoad):
        scope = [e.scope] if e.scope != "gpu" else []
        return f"{e.syntax}({', '.join([expr_text(e.ref), *scope])})"
    if isinstance(e, ir.Pack):
        return f"{e.type}({', '.join(expr_text(x, 0, True) for x in e.elems)})"
    if isinstance(e, ir.Fragment):
        return f"frag({expr_text(e.vec)}, {expr_text(e.k, 0, True)})"
    if isinstance(e, ir.Extract):
        return f"{expr_text(e.vec, _POSTFIX_PREC)}[{expr_text(e.index, 0, True)}]"
    if isinstance(e, (ir.PipelineObj, ir.AsyncObj)):
        return e.name
    if isinstance(e, ir.StageBuf):
        return f"{e.pipe}.{e.buf}"
    if isinstance(e, ir.StageIndex):
        return f"{e.pipe}.stage"
    if isinstance(e, ir.Index):
        base = expr_text(e.base, _POSTFIX_PREC)
        big = isinstance(e.base.type, T.Ptr)
        idx = ", ".join(expr_text(i, 0, not big or i.type != T.u64) for i in e.indices)
        return f"{base}[{idx}]"
    if isinstance(e, ir.Peer):
        return f"peer({expr_text(e.ref)}, {expr_text(e.rank, 0, True)})"
    if isinstance(e, ir.Load):
        if isinstance(e.type, T.Vector):
            return f"vload({expr_text(e.ref)}, {e.type.n})"
        return expr_text(e.ref, prec)
    raise TypeError(f"cannot print {type(e).__name__}")


def _pair(a: ir.Expr, b: ir.Expr) -> str:
    return f"{expr_text(a, 0, not isinstance(b, ir.Const))}, " \
           f"{expr_text(b, 0, not isinstance(a, ir.Const))}"


def _paren(text: str, own: int, ctx: int) -> str:
    return f"({text})" if own < ctx else text


class _Printer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 0

    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def kernel(self, k: ir.Kernel) -> None:
        params = ", ".join(f"{p.name}: {type_text(p.type)}" for p in k.params)
        attrs = [f"threads({_dims(k.threads)})"]
        if k.cluster is not None:
            attrs.append(f"cluster({_dims(k.cluster)})")
        if k.nonportable:
            attrs.append("nonportable")
        if k.maxnreg is not None:
            attrs.append(f"maxnreg({k.maxnreg})")
        if k.minctas is not None:
            attrs.append(f"minctas({k.minctas})")
        self.line(f"kernel {k.name}({params}) {' '.join(attrs)} {{")
        self.body(k.body)
        self.line("}")

    def body(self, stmts: tuple[ir.Stmt, ...]) -> None:
        self.depth += 1
        for s in stmts:
            self.stmt(s)
        self.depth -= 1

    def stmt(self, s: ir.Stmt) -> None:
        if isinstance(s, ir.SharedDecl):
            dims = "".join(f"[{d}]" for d in s.shape)
            swz = f" swizzle {s.swizzle}{' mn' if s.major == 'mn' else ''}" if s.swizzle else ""
            self.line(f"shared {s.name}: {s.elem}{dims} align {s.align}{swz};")
        elif isinstance(s, ir.BarrierDecl):
            arr = f"[{s.n}]" if s.n else ""
            self.line(f"mbarrier {s.name}{arr} count {s.count};")
        elif isinstance(s, ir.Let):
            init = f" = {expr_text(s.value, 0, True)}" if s.value is not None else ""
            self.line(f"let {s.name}: {type_text(s.var_type)}{init};")
        elif isinstance(s, ir.Assign):
            self.line(f"{s.name} = {expr_text(s.value, 0, True)};")
        elif isinstance(s, ir.SetElem):
            self.line(f"{s.name}[{expr_text(s.index, 0, True)}] = {expr_text(s.value, 0, True)};")
        elif isinstance(s, ir.Store):
            self.line(f"{expr_text(s.ref)} = {expr_text(s.value, 0, True)};")
        elif isinstance(s, ir.If):
            self.if_chain(s, "if")
            self.line("}")
        elif isinstance(s, ir.For):
            consts = all(isinstance(x, ir.Const) for x in (s.start, s.stop, s.step))
            typed = not (consts and s.var_type != T.u32)
            step = ""
            if not (isinstance(s.step, ir.Const) and s.step.value == 1):
                step = f" step {expr_text(s.step, 0, typed)}"
            unroll = " unroll" if s.unroll else ""
            self.line(f"for {s.var} in {expr_text(s.start, 0, typed)} .. "
                      f"{expr_text(s.stop, 0, typed)}{step}{unroll} {{")
            self.body(s.body)
            self.line("}")
        elif isinstance(s, ir.While):
            self.line(f"while {expr_text(s.cond)} {{")
            self.body(s.body)
            self.line("}")
        elif isinstance(s, ir.PipelineDecl):
            self.line(f"pipeline {s.name} stages {s.stages} {{")
            for d in s.buffers:
                dims = "".join(f"[{x}]" for x in d.shape)
                swz = (f" swizzle {d.swizzle}{' mn' if d.major == 'mn' else ''}"
                       if d.swizzle else "")
                self.line(f"    {d.name}: {d.elem}{dims} align {d.align}{swz};")
            self.line("}")
        elif isinstance(s, ir.Role):
            regs = f" regs {s.regs}" if s.regs is not None else ""
            self.line(f"role {s.name} warps {s.warp_start} .. {s.warp_stop}{regs} {{")
            self.body(s.body)
            self.line("}")
        elif isinstance(s, ir.Turn):
            self.line("turn {")
            self.body(s.body)
            self.line("}")
        elif isinstance(s, ir.AsyncLoad):
            self.line(f"async {s.name} {{")
            self.body(s.body)
            self.line("}")
        elif isinstance(s, ir.Return):
            self.line("return;")
        elif isinstance(s, ir.SetMaxNReg):  # made by lowering roles: no text of its own
            self.line(f"setmaxnreg_{'inc' if s.inc else 'dec'}({s.regs});")
        elif isinstance(s, ir.Asm):
            tmpl = s.template.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
            outs = ", ".join(s.outs)
            ins = ", ".join(expr_text(x) for x in s.ins)
            tail = f" : {outs} : {ins}" if (outs or ins) else ""
            self.line(f'asm "{tmpl}"{tail};')
        elif isinstance(s, ir.Op):
            self.line(f"{s.syntax}({', '.join(self.op_args(s))});")
        else:
            raise TypeError(f"cannot print {type(s).__name__}")

    def if_chain(self, s: ir.If, head: str) -> None:
        self.line(f"{head} {expr_text(s.cond)} {{")
        self.body(s.then)
        if len(s.orelse) == 1 and isinstance(s.orelse[0], ir.If):
            self.depth_line_else_if(s.orelse[0])
        elif s.orelse:
            self.line("} else {")
            self.body(s.orelse)

    def depth_line_else_if(self, s: ir.If) -> None:
        self.if_chain(s, "} else if")

    def op_args(self, s: ir.Op) -> list[str]:
        """Arguments in signature order; omitted ones are the trailing, derived ones (a stage
        copy's barrier, a byte count equal to its shared operand's size)."""
        d = definition(s)
        out: list[str] = []
        for i, (name, _kind, optional) in enumerate(d.operands):
            v = getattr(s, name)
            if optional and d.omitted(s, name):
                continue
            if len(out) < i:
                raise AssertionError(f"{s.syntax}: '{name}' follows an omitted argument")
            if isinstance(v, str):  # a scope word
                out.append(v)
            elif isinstance(v, tuple):
                out.append("[" + ", ".join(expr_text(c, 0, True) for c in v) + "]")
            else:
                out.append(expr_text(v, 0, True))
        return out


def _dims(d: tuple[int, int, int]) -> str:
    x, y, z = d
    if z == 1:
        return str(x) if y == 1 else f"{x}, {y}"
    return f"{x}, {y}, {z}"


def print_kernel(k: ir.Kernel) -> str:
    p = _Printer()
    p.kernel(k)
    return "\n".join(p.lines) + "\n"


def print_module(m: ir.Module) -> str:
    return "\n".join(print_kernel(k) for k in m.kernels)
