"""IR -> PTX text.

A small writer (`instr(mnemonic, *operands, guard=None)`) with per-class register counters
whose `.reg` declarations are written last, and an emitter that walks the structured IR.
Each PTX mnemonic is written whole in one string, so a grep for an instruction lands on the
line that emits it. Register and label names are deterministic, so goldens are stable.
"""

from __future__ import annotations

import re

from .. import ir
from .. import types as T
from ..bounds import MAX_PTX_LINES
from ..errors import CompileError, Diagnostic, Span
from ..kernelinfo import KernelInfo, ParamInfo, PtxModule
from ..opdef import EXPR_REGISTRY, definition
from ..target import Target
from .abi import PARAM_TYPE, TMAP_ALIGN, TMAP_BYTES
from .addressing import Addressing, tile_aligns, tmap_swizzles
from .arith import Arithmetic
from .asyncops import AsyncOps
from .features import ptx_version, require_features
from .fragments import Fragments
from .layout import Layout, layout_kernel
from .writer import (
    SMEM_SYMBOL,
    WATCHDOG_SYMBOL,
    PtxWriter,
    header,
    immediate,
    int_type,
    mem_type,
    reg_type,
)


class KernelEmitter(AsyncOps, Addressing, Arithmetic, Fragments):
    """Emits one ir.Kernel as a PTX `.entry`."""

    def __init__(self, kernel: ir.Kernel, layout: Layout, target: Target, watchdog_ms: int = 0):
        self.k = kernel
        self.target = target
        self.layout = layout
        self.w = PtxWriter()
        self.scopes: list[dict[str, object]] = [{}]
        self.smem_base: str | None = None
        self.watchdog_ns = watchdog_ms * 1_000_000
        self.sites: list[str] = []
        self.unrolled: list[tuple[str, int]] = []  # unrolled loops' variables, outermost first
        self.packed = ir.fragment_arrays(kernel.body)
        self.f32_of: dict[str, str] = {}

    # ------------------------------------------------------------------ names

    def bind(self, name: str, regs: object) -> None:
        self.scopes[-1][name] = regs

    def lookup(self, name: str):
        for s in reversed(self.scopes):
            if name in s:
                return s[name]
        raise KeyError(name)

    def new_regs(self, t: T.Type):
        if isinstance(t, (T.Vector, T.RegArray)):
            return [self.w.reg(t.elem) for _ in range(t.n)]
        return self.w.reg(t)

    # ------------------------------------------------------------------ entry

    def emit(self) -> str:
        k, w = self.k, self.w
        params = []
        for p in k.params:
            if isinstance(p.type, T.TensorMap):
                params.append(f"    .param .align {TMAP_ALIGN} .b8 p_{p.name}[{TMAP_BYTES}]")
            elif isinstance(p.type, T.Ptr):
                params.append(f"    .param .u64 p_{p.name}")
            else:
                assert isinstance(p.type, T.Scalar)
                params.append(f"    .param .{PARAM_TYPE.get(p.type.name, mem_type(p.type))} "
                              f"p_{p.name}")
        for p in k.params:
            r = w.reg(p.type if not isinstance(p.type, T.TensorMap) else T.u64)
            self.bind(p.name, r)
            if isinstance(p.type, T.TensorMap):
                w.instr("mov.u64", r, f"p_{p.name}")
                w.instr("cvta.param.u64", r, r)
            elif isinstance(p.type, T.Ptr):
                w.instr("ld.param.u64", r, f"[p_{p.name}]")
                w.instr("cvta.to.global.u64", r, r)
            elif p.type == T.pred:
                t = w.reg(T.u16)
                w.instr("ld.param.u8", t, f"[p_{p.name}]")
                w.instr("setp.ne.u16", r, t, "0")
            else:
                w.instr(f"ld.param.{mem_type(p.type)}", r, f"[p_{p.name}]")  # type: ignore[arg-type]
        if self.layout.items:
            base = w.reg(T.u32)
            w.instr("mov.u32", base, SMEM_SYMBOL)
            if self.layout.align > 16:
                # The dynamic smem base is only 16-byte aligned on every load path; round up.
                w.instr("add.u32", base, base, str(self.layout.align - 1))
                w.instr("and.b32", base, base, str(-self.layout.align))
            self.smem_base = base
        self.stmts(k.body)
        w.instr("ret")

        d = []
        d.append(f".visible .entry {k.name}(")
        d.append(",\n".join(params))
        x, y, z = k.threads
        dirs = [f".reqntid {x}, {y}, {z}"]
        if k.maxnreg is not None:
            dirs.append(f".maxnreg {k.maxnreg}")
        if k.minctas is not None:
            dirs.append(f".minnctapersm {k.minctas}")
        if k.cluster is not None:
            dirs.append(".reqnctapercluster {}, {}, {}".format(*k.cluster))
        d.append(")\n    " + " ".join(dirs))
        d.append("{")
        d.extend(w.reg_decls())
        d.extend(self.layout.comments())
        d.extend(w.lines)
        d.append("}")
        return "\n".join(d) + "\n"

    # ------------------------------------------------------------------ statements

    def stmts(self, body: tuple[ir.Stmt, ...]) -> None:
        self.scopes.append({})
        for s in body:
            self.stmt(s)
        self.scopes.pop()

    def stmt(self, s: ir.Stmt) -> None:
        w = self.w
        if isinstance(s, (ir.SharedDecl, ir.BarrierDecl)):
            return
        if isinstance(s, ir.Let):
            regs = self.new_regs(s.var_type)
            self.bind(s.name, regs)
            if isinstance(s.var_type, T.RegArray):
                if s.name in self.packed:
                    n = s.var_type.n * s.var_type.elem.nbytes // 4
                    self.bind(f"{s.name}#b32", [w.reg(T.b32) for _ in range(n)])
                if s.value is not None:  # a literal broadcast to every element
                    v = self.ev(s.value)
                    for i, r in enumerate(regs):
                        w.instr(f"mov.{reg_type(s.var_type.elem)}", r, v)
                        self.repack(s.name, regs, i, s.var_type.elem)
            elif s.value is not None:
                self.move_into(regs, s.value, s.var_type)
        elif isinstance(s, ir.Assign):
            self.move_into(self.lookup(s.name), s.value, s.value.type)
        elif isinstance(s, ir.Store):
            self.store(s)
        elif isinstance(s, ir.SetElem):
            t = s.value.type
            assert isinstance(t, T.Scalar)  # an element of a register array
            regs = self.lookup(s.name)
            dst = self.element(regs, s.index, s.loc)
            if s.name in self.packed and t.is_fp8:
                self.set_fp8(s.value, dst, t)
            else:
                w.instr(f"mov.{reg_type(t)}", dst, self.ev(s.value))
            self.repack(s.name, regs, regs.index(dst), t)
        elif isinstance(s, ir.If):
            p = self.ev_reg(s.cond)
            end = w.label("endif")
            if s.orelse:
                other = w.label("else")
                w.instr("bra", other, guard=f"!{p}")
                self.stmts(s.then)
                w.instr("bra.uni", end)
                w.place_label(other)
                self.stmts(s.orelse)
            else:
                w.instr("bra", end, guard=f"!{p}")
                self.stmts(s.then)
            w.place_label(end)
        elif isinstance(s, ir.For):
            self.for_loop(s)
        elif isinstance(s, ir.While):
            t0 = self.spin_clock(s)  # a spin on global memory, bounded by the watchdog
            top, end = w.label("while"), w.label("endwhile")
            w.place_label(top)
            p = self.ev_reg(s.cond)
            w.instr("bra", end, guard=f"!{p}")
            if t0 is not None:
                self.spin_check(s, t0)
            self.stmts(s.body)
            w.instr("bra.uni", top)
            w.place_label(end)
        elif isinstance(s, ir.Return):
            w.instr("ret")
        elif isinstance(s, ir.Asm):
            ops = [self.lookup(n) for n in s.outs] + [self.ev(x) for x in s.ins]
            text = re.sub(r"\{(\d+)\}", lambda m: str(ops[int(m.group(1))]), s.template)
            for line in text.strip().split("\n"):
                w.lines.append("    " + line.strip())
        elif isinstance(s, ir.SetMaxNReg):
            mn = "setmaxnreg.inc.sync.aligned.u32" if s.inc else "setmaxnreg.dec.sync.aligned.u32"
            w.instr(mn, str(s.regs))
        elif isinstance(s, ir.Op):
            definition(s).emit(self, s)
        else:
            raise TypeError(f"no PTX for {type(s).__name__}")

    def for_loop(self, s: ir.For) -> None:
        w = self.w
        if s.unroll:
            # the loop variable is an immediate in each copy of the body
            for value in range(int(s.start.value), int(s.stop.value),  # type: ignore[attr-defined]
                               int(s.step.value)):  # type: ignore[attr-defined]
                if len(w.lines) > MAX_PTX_LINES:
                    raise CompileError(Diagnostic(
                        f"kernel '{self.k.name}' would be more than {MAX_PTX_LINES} lines of "
                        "PTX once this loop is unrolled; unroll less", s.loc or self.k.loc))
                self.scopes.append({s.var: str(value)})
                self.unrolled.append((s.var, value))
                self.stmts(s.body)
                self.unrolled.pop()
                self.scopes.pop()
            return
        i = w.reg(s.var_type)
        self.scopes.append({s.var: i})
        w.instr(f"mov.{reg_type(s.var_type)}", i, self.ev(s.start))
        stop = self.ev(s.stop)
        if not isinstance(s.stop, ir.Const):
            stop = self.copy(stop, s.var_type)  # evaluated once, before the first iteration
        step = self.ev(s.step)
        if not isinstance(s.step, ir.Const):
            step = self.copy(step, s.var_type)
        down = isinstance(s.step, ir.Const) and s.step.value < 0
        top, end = w.label("for"), w.label("endfor")
        p = w.reg(T.pred)
        w.place_label(top)
        w.instr(f"setp.{'le' if down else 'ge'}.{int_type(s.var_type)}", p, i, stop)
        w.instr("bra", end, guard=p)
        self.stmts(s.body)
        w.instr(f"add.{int_type(s.var_type)}", i, i, step)
        w.instr("bra.uni", top)
        w.place_label(end)
        self.scopes.pop()

    def copy(self, operand: str, t: T.Scalar) -> str:
        r = self.w.reg(t)
        self.w.instr(f"mov.{reg_type(t)}", r, operand)
        return r

    def move_into(self, regs, value: ir.Expr, t: T.Type) -> None:
        if isinstance(t, T.Vector):
            for dst, src in zip(regs, self.ev_vec(value), strict=True):
                self.w.instr(f"mov.{reg_type(t.elem)}", dst, src)
        elif isinstance(t, T.Scalar) and t.is_pred:
            src = self.ev(value)
            if src in ("1", "0"):
                self.w.instr("setp.ne.u32", regs, src, "0")
            else:
                self.w.instr("mov.pred", regs, src)
        else:
            mt = "u64" if isinstance(t, T.Ptr) else reg_type(t)  # type: ignore[arg-type]
            self.w.instr(f"mov.{mt}", regs, self.ev(value))

    # ------------------------------------------------------------------ memory

    def shared_addr(self, ref: ir.Expr) -> tuple[str, int]:
        """(register, constant byte offset) of a shared place or view."""
        if isinstance(ref, ir.Peer):
            return self.peer_addr(ref), 0
        indices: list[ir.Expr] = []
        while isinstance(ref, ir.Index):
            indices = list(ref.indices) + indices
            ref = ref.base
        if isinstance(ref, ir.BarrierObj):
            off = self.layout.offset(ref.name)
            if not indices:
                return self.smem_base, off  # type: ignore[return-value]
            return self.scaled(self.smem_base, indices[0], 8, off, T.u32)  # type: ignore[arg-type]
        assert isinstance(ref, ir.SharedBuf), ref
        decl_shape = self.layout.shape(ref.name)
        esz = ref.type.elem.nbytes  # type: ignore[attr-defined]
        strides = []
        acc = esz
        for d in reversed(decl_shape):
            strides.append(acc)
            acc *= d
        strides.reverse()
        base, off = self.smem_base, self.layout.offset(ref.name)
        for idx, stride in zip(indices, strides, strict=False):
            base, off = self.scaled(base, idx, stride, off, T.u32)  # type: ignore[arg-type]
        return base, off  # type: ignore[return-value]

    def scaled(self, base: str, idx: ir.Expr, stride: int, off: int,
               t: T.Scalar) -> tuple[str, int]:
        """base + idx * stride (+ off), folding constant indices into the offset."""
        w = self.w
        if isinstance(idx, ir.Const):
            return base, off + int(idx.value) * stride
        if t == T.u32 and idx.type == T.u32:
            c, rest = self.split_const(idx)
            if rest is None:
                return base, off + c * stride
            off, idx = off + c * stride, rest
        i = self.ev_reg(idx)
        r = w.reg(t)
        it = idx.type
        if t == T.u32:
            w.instr("mad.lo.u32", r, i, str(stride), base)
        elif it in (T.u32, T.s32):
            tmp = w.reg(T.u64)
            w.instr(f"mul.wide.{'s32' if it == T.s32 else 'u32'}", tmp, i, str(stride))
            w.instr("add.s64", r, base, tmp)
        else:
            w.instr("mad.lo.u64", r, i, str(stride), base)
        return r, off

    def global_addr(self, ref: ir.Index) -> tuple[str, int]:
        base = self.ev_reg(ref.base)
        esz = ref.type.elem.nbytes  # type: ignore[attr-defined]
        return self.scaled(base, ref.indices[0], esz, 0, T.u64)

    def addr(self, ref: ir.Expr) -> tuple[str, str]:
        """('shared'|'global', '[reg+off]') for a place."""
        if isinstance(ref.type, T.GlobalRef):
            r, off = self.global_addr(ref)  # type: ignore[arg-type]
            space = "global"
        else:
            r, off = self.shared_addr(ref)
            space = "shared::cluster" if isinstance(ref, ir.Peer) else "shared"
            swz = self.swizzle_of(ref) if not isinstance(ref, ir.Peer) else 0
            if swz > 16 and ref.type.shape == ():  # type: ignore[attr-defined]
                r, off = self.swizzled(r, off, swz), 0
        return space, (f"[{r}+{off}]" if off else f"[{r}]")

    def load(self, e: ir.Load):
        space, a = self.addr(e.ref)
        t = e.type
        if isinstance(t, T.Vector):
            return self.vector_mem(f"ld.{space}", a, t, None)
        r = self.w.reg(t)
        self.w.instr(f"ld.{space}.{mem_type(t)}", r, a)  # type: ignore[arg-type]
        return r

    def store(self, s: ir.Store) -> None:
        space, a = self.addr(s.ref)
        t = s.value.type
        if isinstance(t, T.Vector):
            self.vector_mem(f"st.{space}", a, t, self.ev_vec(s.value))
            return
        v = self.ev_reg(s.value)
        self.w.instr(f"st.{space}.{mem_type(t)}", a, v)  # type: ignore[arg-type]

    def vector_mem(self, kind: str, a: str, t: T.Vector, values: list[str] | None):
        """Vector ld/st; 16-bit elements travel packed in pairs as .b32."""
        w = self.w
        if t.elem.nbytes >= 4:
            regs = values if values is not None else [w.reg(t.elem) for _ in range(t.n)]
            w.instr(f"{kind}.v{t.n}.{mem_type(t.elem)}", *_vec_operands(kind, a, regs))
            return regs
        if t.elem.is_fp8:
            return self.byte_vector_mem(kind, a, t, values)
        words = t.n // 2
        if values is None:
            packed = [w.reg(T.b32) for _ in range(words)]
            suffix = f".v{words}.b32" if words > 1 else ".b32"
            w.instr(f"{kind}{suffix}", *_vec_operands(kind, a, packed))
            regs = []
            for p in packed:
                lo, hi = w.reg(t.elem), w.reg(t.elem)
                w.instr("mov.b32", f"{{{lo}, {hi}}}", p)
                regs += [lo, hi]
            return regs
        packed = []
        for j in range(words):
            p = w.reg(T.b32)
            w.instr("mov.b32", p, f"{{{values[2 * j]}, {values[2 * j + 1]}}}")
            packed.append(p)
        suffix = f".v{words}.b32" if words > 1 else ".b32"
        w.instr(f"{kind}{suffix}", *_vec_operands(kind, a, packed))
        return values

    def byte_vector_mem(self, kind: str, a: str, t: T.Vector, values: list[str] | None):
        """Vector ld/st of fp8: four bytes to a .b32 word. Each element lives zero-extended in
        a 16-bit register, so a pair packs as lo | hi << 8 and unpacks with and / shr."""
        w = self.w
        words = t.n // 4
        suffix = f".v{words}.b32" if words > 1 else ".b32"
        if values is None:
            packed = [w.reg(T.b32) for _ in range(words)]
            w.instr(f"{kind}{suffix}", *_vec_operands(kind, a, packed))
            regs = []
            for p in packed:
                halves = [w.reg(T.b16), w.reg(T.b16)]
                w.instr("mov.b32", f"{{{halves[0]}, {halves[1]}}}", p)
                for h in halves:
                    lo, hi = w.reg(t.elem), w.reg(t.elem)
                    w.instr("and.b16", lo, h, "255")
                    w.instr("shr.u16", hi, h, "8")
                    regs += [lo, hi]
            return regs
        packed = []
        for j in range(words):
            halves = []
            for i in (4 * j, 4 * j + 2):
                h = w.reg(T.b16)
                w.instr("shl.b16", h, values[i + 1], "8")
                w.instr("or.b16", h, h, values[i])
                halves.append(h)
            p = w.reg(T.b32)
            w.instr("mov.b32", p, f"{{{halves[0]}, {halves[1]}}}")
            packed.append(p)
        w.instr(f"{kind}{suffix}", *_vec_operands(kind, a, packed))
        return values

    # ------------------------------------------------------------------ expressions

    def ev_reg(self, e: ir.Expr) -> str:
        """An expression in a register (immediates are moved into one)."""
        v = self.ev(e)
        if v.startswith("%"):
            return v
        t = e.type
        if t == T.pred:
            r = self.w.reg(T.pred)
            self.w.instr("setp.ne.u32", r, v, "0")
            return r
        return self.copy(v, t)  # type: ignore[arg-type]

    def ev_vec(self, e: ir.Expr) -> list[str]:
        if isinstance(e, ir.Var):
            return self.lookup(e.name)
        if isinstance(e, ir.Load):
            return self.load(e)
        if isinstance(e, ir.Pack):
            return [self.ev_reg(x) for x in e.elems]
        raise TypeError(f"no vector value for {type(e).__name__}")

    def ev(self, e: ir.Expr) -> str:
        """An expression as a PTX operand: a register or an immediate."""
        w = self.w
        t = e.type
        if isinstance(e, ir.Const):
            if t == T.pred:
                return "1" if e.value else "0"
            if t in (T.f16, T.bf16) or t.is_fp8:  # type: ignore[attr-defined]
                r = w.reg(t)
                w.instr("mov.b16", r, immediate(e.value, t))  # type: ignore[arg-type]
                return r
            return immediate(e.value, t)  # type: ignore[arg-type]
        if isinstance(e, ir.Var):
            return self.lookup(e.name)
        if isinstance(e, ir.SReg):
            return self.sreg(e)
        if isinstance(e, ir.Load):
            return self.load(e)
        if isinstance(e, ir.Extract):
            return self.element(self.ev_vec(e.vec), e.index, e.loc)
        if isinstance(e, ir.Binary):
            return self.binary(e)
        if isinstance(e, ir.Compare):
            return self.compare(e)
        if isinstance(e, ir.Unary):
            x = self.ev_reg(e.x)
            r = w.reg(t)
            if e.op == "neg":
                w.instr(f"neg.{mem_type(t) if t in (T.f16, T.bf16) else t.name}", r, x)  # type: ignore[attr-defined]
            elif t == T.pred:
                w.instr("not.pred", r, x)
            else:
                w.instr(f"not.b{t.nbits}", r, x)  # type: ignore[attr-defined]
            return r
        if isinstance(e, ir.Cast):
            return self.cast(e)
        if isinstance(e, ir.Select):
            c = self.ev_reg(e.cond)
            a, b = self.ev(e.a), self.ev(e.b)
            r = w.reg(t)
            if t == T.pred:
                w.instr("mov.pred", r, self.ev_reg(e.b))
                w.instr("mov.pred", r, self.ev_reg(e.a), guard=c)
            else:
                w.instr(f"selp.{reg_type(t)}", r, a, b, c)  # type: ignore[arg-type]
            return r
        if isinstance(e, ir.Call):
            return self.call(e)
        d = EXPR_REGISTRY.get(type(e))
        if d is not None:
            return d.emit(self, e)
        raise TypeError(f"no PTX value for {type(e).__name__}")

    def element(self, regs: list[str], index: ir.Expr, loc: Span | None) -> str:
        """The register of element `index` of a vector or register array. The builder checks
        constant indices; one computed from unrolled loop variables is known only here, in
        the iteration being emitted."""
        try:
            i = self.const_index(index)
        except ZeroDivisionError:
            i = None
        if i is None or not 0 <= i < len(regs):
            at = ", ".join(f"{name} = {v}" for name, v in self.unrolled)
            what = "divides by zero" if i is None else f"is {i}, out of range [0, {len(regs)})"
            raise CompileError(Diagnostic(f"this element index {what} in the unrolled "
                                          f"iteration {at or '(none)'}", loc))
        return regs[i]

    def const_index(self, e: ir.Expr) -> int:
        """The value of a vector index: constants and unrolled loop variables only."""
        if isinstance(e, ir.Const):
            return int(e.value)
        if isinstance(e, ir.Var):
            return int(self.lookup(e.name))
        if isinstance(e, ir.Binary):
            a, b = self.const_index(e.a), self.const_index(e.b)
            ops = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
                   "div": lambda: a // b, "rem": lambda: a % b, "and": lambda: a & b,
                   "or": lambda: a | b, "xor": lambda: a ^ b, "shl": lambda: a << b,
                   "shr": lambda: a >> b, "min": lambda: min(a, b), "max": lambda: max(a, b)}
            return ops[e.op]()
        raise TypeError(f"vector index is not constant: {type(e).__name__}")


def _vec_operands(kind: str, a: str, regs: list[str]) -> tuple[str, str]:
    group = regs[0] if len(regs) == 1 else "{" + ", ".join(regs) + "}"
    return (group, a) if kind.startswith("ld") else (a, group)


def kernel_info(k: ir.Kernel, layout: Layout, target: Target, sites: tuple[str, ...] = (),
                watchdog_ms: int = 0) -> KernelInfo:
    params = []
    swizzles = tmap_swizzles(k, layout)
    aligns = tile_aligns(k, layout)
    for p in k.params:
        t = p.type
        if isinstance(t, T.TensorMap):
            swz, buf = swizzles.get(p.name, (None, ""))
            align, tile = aligns.get(p.name, (0, ""))
            params.append(ParamInfo(p.name, "tmap", t.elem, t.rank, swz, buf, align, tile))
        elif isinstance(t, T.Ptr):
            params.append(ParamInfo(p.name, "ptr", t.elem))
        else:
            params.append(ParamInfo(p.name, "scalar", t))  # type: ignore[arg-type]
    pdl = target.griddepcontrol and any(isinstance(s, ir.GridDepWait) for s in ir.walk(k.body))
    return KernelInfo(k.name, tuple(params), k.threads, k.cluster, layout.request_bytes,
                      target.name, sites, watchdog_ms, pdl)


def emit_module(m: ir.Module, target: Target, source_name: str | None = None,
                watchdog_ms: int = 0) -> PtxModule:
    """PTX text for every kernel of a lowered module, with each kernel's launch contract.
    `watchdog_ms` > 0 bounds mbarrier waits and spins on global memory (AsyncOps.give_up_after)."""
    require_features(m, target)
    parts = [f"// Generated by ptxdsl{f' from {source_name}' if source_name else ''}. "
             "Do not edit.", header(target, ptx_version(m, target))]
    infos = []
    if any(layout_kernel(k).items for k in m.kernels):
        parts.append(f".extern .shared .align 16 .b8 {SMEM_SYMBOL}[];\n")
    if watchdog_ms:
        parts.append(f".visible .global .align 8 .u64 {WATCHDOG_SYMBOL};\n")
    for k in m.kernels:
        layout = layout_kernel(k)
        em = KernelEmitter(k, layout, target, watchdog_ms)
        parts.append(em.emit())
        infos.append(kernel_info(k, layout, target, tuple(em.sites), watchdog_ms))
    return PtxModule("\n".join(parts), tuple(infos), target.name)
