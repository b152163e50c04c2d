"""wgmma A fragments in registers: a register array that wgmmas read as their A operand
also lives packed, two 16-bit or four fp8 elements per .b32 register (`name#b32`), repacked
where an element is written, so that the packing happens before wgmma_fence() and ptxas need
not fence each wgmma again."""

from __future__ import annotations

from typing import Any

from .. import ir
from .. import types as T
from .writer import reg_type


class Fragments:
    """Mixed into KernelEmitter (which provides `w`, `lookup`, `ev` and `fp8_cast`)."""

    w: Any
    packed: set[str]  # the arrays read as A fragments (ir.fragment_arrays)
    # an element register of a packed fp8 array -> a register of its own that holds the f32
    # it was converted from (set_fp8), so that repack converts the pairs at once
    f32_of: dict[str, str]

    def lookup(self, name: str) -> Any:
        raise NotImplementedError  # KernelEmitter's

    def ev(self, e: ir.Expr) -> str:
        raise NotImplementedError  # KernelEmitter's

    def fp8_cast(self, x: str, src_t: T.Scalar, dst_t: T.Scalar) -> str:
        raise NotImplementedError  # Arithmetic's

    def repack(self, name: str, regs: list[str], i: int, elem: T.Scalar) -> None:
        """Keep the packed twin of an A-fragment array in step with element i. fp8: where
        all four elements of its register were converted from f32 (set_fp8), two
        `cvt.rn.satfinite.e4m3x2.f32` make it (ptxas drops the elements' own conversions,
        which nothing else reads); else an element's 16-bit register holds its byte
        zero-extended, two pairs of them make (b0, 0, b1, 0) and (b2, 0, b3, 0), and prmt
        gathers the bytes."""
        if name not in self.packed:
            return
        w = self.w
        if not elem.is_fp8:
            j = i // 2
            pair = f"{{{regs[2 * j]}, {regs[2 * j + 1]}}}"
            w.instr("mov.b32", self.lookup(f"{name}#b32")[j], pair)
            return
        j = i // 4
        four = regs[4 * j:4 * j + 4]
        packed = self.lookup(f"{name}#b32")[j]
        if all(r in self.f32_of for r in four):
            lo, hi = w.reg(T.b16), w.reg(T.b16)
            for half, (a, b) in ((lo, four[:2]), (hi, four[2:])):  # the first goes high
                w.instr(f"cvt.rn.satfinite.{elem.name}x2.f32", half, self.f32_of[b],
                        self.f32_of[a])
            w.instr("mov.b32", packed, f"{{{lo}, {hi}}}")
            return
        lo, hi = w.reg(T.b32), w.reg(T.b32)
        w.instr("mov.b32", lo, f"{{{four[0]}, {four[1]}}}")
        w.instr("mov.b32", hi, f"{{{four[2]}, {four[3]}}}")
        w.instr("prmt.b32", packed, lo, hi, "0x6420")

    def set_fp8(self, value: ir.Expr, dst: str, t: T.Scalar) -> None:
        """An element of a packed fp8 array := value; an f32 converted keeps that f32 in a
        register of its own (later writes to the source's register do not reach it)."""
        if isinstance(value, ir.Cast) and value.x.type == T.f32:
            keep = self.w.reg(T.f32)
            self.w.instr("mov.f32", keep, self.ev(value.x))
            self.w.instr(f"mov.{reg_type(t)}", dst, self.fp8_cast(keep, T.f32, t))
            self.f32_of[dst] = keep
            return
        self.w.instr(f"mov.{reg_type(t)}", dst, self.ev(value))
        self.f32_of.pop(dst, None)
