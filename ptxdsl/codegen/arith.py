"""Scalar arithmetic in PTX: special registers, binary operators, comparisons, conversions
between the scalar types (bf16/f16 through f32, saturating and rounding forms) and the
built-in functions (approximate transcendentals, shuffles, elect)."""

from __future__ import annotations

from typing import Any

from .. import ir
from .. import types as T
from ..errors import CompileError, Diagnostic
from ..fp8 import conversion_unsupported
from ..target import Target
from .writer import immediate, int_type, op_type, reg_type

_SREG_PTX = {"clock": "%clock", "clock64": "%clock64", "globaltimer": "%globaltimer"}
_FN_PTX = {
    # ex2 flushes subnormals (as CUDA's fast math does): one MUFU.EX2, where the IEEE form
    # costs a range test and two predicated multiplies around it (softmax's hot loop)
    ("ex2", "f32"): "ex2.approx.ftz.f32", ("lg2", "f32"): "lg2.approx.f32",
    ("rsqrt", "f32"): "rsqrt.approx.f32", ("sqrt", "f32"): "sqrt.approx.f32",
    ("sqrt", "f64"): "sqrt.rn.f64", ("rcp", "f32"): "rcp.approx.f32", ("rcp", "f64"): "rcp.rn.f64",
    ("sin", "f32"): "sin.approx.f32", ("cos", "f32"): "cos.approx.f32",
    ("tanh", "f32"): "tanh.approx.f32",
}  # fmt: skip
_SHFL_PTX = {
    "shfl_xor": ("shfl.sync.bfly.b32", "0x1f"), "shfl_down": ("shfl.sync.down.b32", "0x1f"),
    "shfl_up": ("shfl.sync.up.b32", "0x0"), "shfl_idx": ("shfl.sync.idx.b32", "0x1f"),
}


class Arithmetic:
    """Mixed into KernelEmitter (which provides `w`, `k`, `target`, `ev`, `ev_reg`, `scaled`
    and `immediate_of`)."""

    w: Any
    k: ir.Kernel
    target: Target

    def ev(self, e: ir.Expr) -> str:
        raise NotImplementedError  # KernelEmitter's

    def ev_reg(self, e: ir.Expr) -> str:
        raise NotImplementedError  # KernelEmitter's

    def scaled(self, base: str, idx: ir.Expr, stride: int, off: int,
               t: T.Scalar) -> tuple[str, int]:
        raise NotImplementedError  # KernelEmitter's

    def immediate_of(self, e: ir.Expr) -> int | None:
        raise NotImplementedError  # Addressing's

    def sreg(self, e: ir.SReg) -> str:
        w = self.w
        r = w.reg(e.type)
        if e.name == "warp":
            x, y, z = self.k.threads
            if y == 1 and z == 1:
                w.instr("mov.u32", r, "%tid.x")
            else:  # linear thread index of a 2-D / 3-D CTA
                ty, tz = w.reg(T.u32), w.reg(T.u32)
                w.instr("mov.u32", ty, "%tid.y")
                w.instr("mov.u32", tz, "%tid.z")
                w.instr("mad.lo.u32", ty, tz, str(y), ty)
                w.instr("mov.u32", r, "%tid.x")
                w.instr("mad.lo.u32", r, ty, str(x), r)
            w.instr("shr.u32", r, r, "5")
            return r
        name = _SREG_PTX.get(e.name, f"%{e.name}")
        w.instr(f"mov.{e.type}", r, name)
        return r

    def binary(self, e: ir.Binary) -> str:
        w = self.w
        t = e.type
        if isinstance(t, T.Ptr):
            base = self.ev_reg(e.a)
            r, off = self.scaled(base, e.b, t.elem.nbytes, 0, T.u64)
            if off:
                r2 = w.reg(T.u64)
                w.instr("add.s64", r2, r, str(off if e.op == "add" else -off))
                return r2
            if e.op == "sub":
                r2 = w.reg(T.u64)
                w.instr("sub.s64", r2, base, r if r != base else "0")
                return r2
            return r
        assert isinstance(t, T.Scalar)
        v = self.immediate_of(e)  # constants and unrolled loop variables fold
        if v is not None:
            return str(v)
        a = self.ev_reg(e.a)  # immediates only as the second operand
        b = self.ev(e.b)
        r = w.reg(t)
        op = e.op
        if t.is_pred:
            w.instr(f"{op}.pred", r, a, b)
        elif op in ("and", "or", "xor"):
            w.instr(f"{op}.b{t.nbits}", r, a, b)
        elif op == "shl":
            w.instr(f"shl.b{t.nbits}", r, a, b)
        elif op == "shr":
            w.instr(f"shr.{int_type(t)}", r, a, b)
        elif t.is_float:
            ft = t.name
            mn = {"add": f"add.{ft}", "sub": f"sub.{ft}", "mul": f"mul.{ft}",
                  "div": f"div.rn.{ft}", "min": f"min.{ft}", "max": f"max.{ft}"}[op]
            if t in (T.f16, T.bf16) and op in ("add", "sub", "mul"):
                mn = f"{op}.rn.{ft}"
            w.instr(mn, r, a, b)
        else:
            it = int_type(t)
            mn = {"add": f"add.{it}", "sub": f"sub.{it}", "mul": f"mul.lo.{it}",
                  "div": f"div.{it}", "rem": f"rem.{it}", "min": f"min.{it}",
                  "max": f"max.{it}"}[op]
            w.instr(mn, r, a, b)
        return r

    def compare(self, e: ir.Compare) -> str:
        w = self.w
        t = e.a.type
        r = w.reg(T.pred)
        if t == T.pred:
            a, b = self.ev_reg(e.a), self.ev_reg(e.b)
            w.instr("xor.pred", r, a, b)
            if e.op == "eq":
                w.instr("not.pred", r, r)
            return r
        a = self.ev_reg(e.a)
        b = self.ev(e.b)
        w.instr(f"setp.{e.op}.{op_type(t)}", r, a, b)  # type: ignore[arg-type]
        return r

    def cast(self, e: ir.Cast) -> str:
        w = self.w
        src_t, dst_t = e.x.type, e.type
        assert isinstance(src_t, T.Scalar) and isinstance(dst_t, T.Scalar)
        x = self.ev_reg(e.x)
        if (src_t.is_fp8 or dst_t.is_fp8) and not src_t.is_pred:
            if not self.target.fp8_cvt:
                raise CompileError(Diagnostic(conversion_unsupported(src_t, dst_t,
                                                                     self.target.name), e.loc))
            return self.fp8_cast(x, src_t, dst_t)
        r = w.reg(dst_t)
        if src_t.is_pred:
            w.instr(f"selp.{reg_type(dst_t)}", r, immediate(1, dst_t), immediate(0, dst_t), x)
        elif src_t.nbytes == dst_t.nbytes and src_t.is_int and dst_t.is_int:
            if dst_t.nbytes == 1:  # u8 <-> s8: re-extend the value in its 16-bit register
                w.instr(f"cvt.{dst_t.name}.{src_t.name}", r, x)
            else:
                w.instr(f"mov.b{dst_t.nbits}", r, x)
        elif src_t.is_float and dst_t.is_float:
            narrowing = dst_t.nbytes < src_t.nbytes or (dst_t.nbytes == 2 and src_t.nbytes == 2)
            if src_t.nbytes == 2 and dst_t.nbytes == 2:  # f16 <-> bf16 through f32
                f = w.reg(T.f32)
                w.instr(f"cvt.f32.{src_t.name}", f, x)
                w.instr(f"cvt.rn.{dst_t.name}.f32", r, f)
            else:
                w.instr(f"cvt{'.rn' if narrowing else ''}.{dst_t.name}.{src_t.name}", r, x)
        elif src_t.is_float:
            if src_t.nbytes == 2:  # 16-bit floats convert to integers through f32
                f = w.reg(T.f32)
                w.instr(f"cvt.f32.{src_t.name}", f, x)
                x, src_t = f, T.f32
            w.instr(f"cvt.rzi.{int_type(dst_t)}.{src_t.name}", r, x)
        elif dst_t.is_float:
            if dst_t.nbytes == 2:
                f = w.reg(T.f32)
                w.instr(f"cvt.rn.f32.{int_type(src_t)}", f, x)
                w.instr(f"cvt.rn.{dst_t.name}.f32", r, f)
            else:
                w.instr(f"cvt.rn.{dst_t.name}.{int_type(src_t)}", r, x)
        else:
            w.instr(f"cvt.{int_type(dst_t)}.{int_type(src_t)}", r, x)
        return r

    def fp8_cast(self, x: str, src_t: T.Scalar, dst_t: T.Scalar) -> str:
        """Conversions to and from fp8. PTX converts pairs: `cvt.rn.f16x2.e4m3x2` widens the
        byte (exactly) to the low f16 of a word; `cvt.rn.satfinite.e4m3x2.f32` narrows an f32
        into the low byte beside a converted 0.0, which keeps the register zero-extended.
        Every other source and destination goes through f16 or f32."""
        w = self.w
        if src_t.is_fp8:
            pair = w.reg(T.b32)
            w.instr(f"cvt.rn.f16x2.{src_t.name}x2", pair, x)
            if dst_t.is_fp8:
                r = w.reg(dst_t)
                w.instr(f"cvt.rn.satfinite.{dst_t.name}x2.f16x2", r, pair)
                return r
            h, unused = w.reg(T.f16), w.reg(T.f16)
            w.instr("mov.b32", f"{{{h}, {unused}}}", pair)
            if dst_t == T.f16:
                return h
            f = w.reg(T.f32)
            w.instr("cvt.f32.f16", f, h)
            if dst_t == T.f32:
                return f
            r = w.reg(dst_t)
            if dst_t.is_int:
                w.instr(f"cvt.rzi.{int_type(dst_t)}.f32", r, f)
            else:
                w.instr(f"cvt{'.rn' if dst_t.nbytes < 4 else ''}.{dst_t.name}.f32", r, f)
            return r
        if src_t != T.f32:
            f = w.reg(T.f32)
            if src_t.is_int:
                w.instr(f"cvt.rn.f32.{int_type(src_t)}", f, x)
            else:
                w.instr(f"cvt{'.rn' if src_t == T.f64 else ''}.f32.{src_t.name}", f, x)
            x = f
        zero = w.reg(T.f32)
        w.instr("mov.f32", zero, immediate(0.0, T.f32))
        r = w.reg(dst_t)
        w.instr(f"cvt.rn.satfinite.{dst_t.name}x2.f32", r, zero, x)
        return r

    def call(self, e: ir.Call) -> str:
        w = self.w
        t = e.type
        if e.fn == "elect":
            r = w.reg(T.pred)
            # bar.warp.sync orders the memory accesses of every lane before what the elected
            # lane does next (e.g. its release arrive for the whole warp); elect.sync alone
            # only elects
            w.instr("bar.warp.sync", "0xffffffff")
            if not self.target.elect:  # the lowest active lane
                m, lane = w.reg(T.u32), w.reg(T.u32)
                w.instr("activemask.b32", m)
                w.instr("brev.b32", m, m)
                w.instr("bfind.shiftamt.u32", m, m)
                w.instr("mov.u32", lane, "%laneid")
                w.instr("setp.eq.u32", r, m, lane)
                return r
            w.instr("elect.sync", f"_|{r}", "0xffffffff")
            return r
        args = [self.ev_reg(a) for a in e.args]
        r = w.reg(t)
        if e.fn in _SHFL_PTX:
            mn, clamp = _SHFL_PTX[e.fn]
            w.instr(mn, r, args[0], args[1], clamp, "0xffffffff")
        elif e.fn == "abs":
            w.instr(f"abs.{t}", r, args[0])
        elif e.fn == "fma":
            w.instr(f"fma.rn.{t}", r, *args)
        else:
            w.instr(_FN_PTX[(e.fn, str(t))], r, args[0])
        return r
