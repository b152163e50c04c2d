"""The PTX writer: the module header (from the `Target`), per-class register counters whose `.reg`
declarations are written last, labels, and the type and immediate spellings of PTX."""

from __future__ import annotations

import struct

from .. import types as T
from ..target import Target

SMEM_SYMBOL = "__ptxdsl_smem"
WATCHDOG_SYMBOL = "__ptxdsl_watchdog"  # .u64: device address of the host-mapped report


def header(target: Target, version: tuple[int, int]) -> str:
    """The PTX header: ISA `version` and the target's `.target`."""
    return f".version {version[0]}.{version[1]}\n.target {target.name}\n.address_size 64\n"


# register class of a scalar: (prefix, declared type)
def reg_class(t: T.Type) -> tuple[str, str]:
    if isinstance(t, (T.Ptr,)):
        return "rd", "b64"
    assert isinstance(t, T.Scalar), t
    if t.is_pred:
        return "p", "pred"
    if t.nbytes <= 2:
        return "rs", "b16"
    if t.nbytes == 4:
        return ("f", "f32") if t == T.f32 else ("r", "b32")
    return ("fd", "f64") if t == T.f64 else ("rd", "b64")


def mem_type(t: T.Scalar) -> str:
    """Type suffix for ld/st/mov/selp: 16-bit floats move as raw .b16, fp8 as .b8."""
    if t.is_fp8:
        return "b8"
    return "b16" if t in (T.f16, T.bf16) else t.name


def reg_type(t: T.Scalar) -> str:
    """Type suffix for mov/selp between registers: 8-bit values live in 16-bit registers
    (PTX has no 8-bit mov), 16-bit floats move as raw .b16."""
    return "b16" if t.nbytes == 1 and not t.is_pred else mem_type(t)


def int_type(t: T.Scalar) -> str:
    """Arithmetic type suffix: bit types compute as unsigned."""
    return f"u{t.nbits}" if t.kind == "b" else t.name


def op_type(t: T.Scalar) -> str:
    """Type suffix of an operation on registers (setp, and, not...): an 8-bit value computes
    in its 16-bit register, which holds it zero- or sign-extended (ld, cvt and mov of an
    immediate all extend it)."""
    if t.nbytes == 1 and not t.is_pred:
        return "s16" if t.is_signed else "u16"
    return int_type(t)


def immediate(value: int | float | bool, t: T.Scalar) -> str:
    if t == T.f32:
        return f"0f{struct.unpack('<I', struct.pack('<f', float(value)))[0]:08X}"
    if t == T.f64:
        return f"0d{struct.unpack('<Q', struct.pack('<d', float(value)))[0]:016X}"
    if t == T.f16:
        return f"0x{struct.unpack('<H', struct.pack('<e', float(value)))[0]:04X}"
    if t == T.bf16:
        bits = struct.unpack("<I", struct.pack("<f", float(value)))[0]
        bits += 0x7FFF + ((bits >> 16) & 1)  # round to nearest even
        return f"0x{(bits >> 16) & 0xFFFF:04X}"
    if t.is_fp8:  # the byte, zero-extended in its 16-bit register
        from ..fp8 import to_bits

        return f"0x{to_bits(float(value), t):04X}"
    return str(int(value))


class PtxWriter:
    """Lines of one entry body plus its register counters."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.counts: dict[str, int] = {}
        self.decl_types: dict[str, str] = {}
        self.nlabels = 0

    def reg(self, t: T.Type) -> str:
        prefix, decl = reg_class(t)
        n = self.counts.get(prefix, 0) + 1
        self.counts[prefix] = n
        self.decl_types[prefix] = decl
        return f"%{prefix}{n}"

    def label(self, kind: str) -> str:
        self.nlabels += 1
        return f"$L_{kind}_{self.nlabels}"

    def place_label(self, name: str) -> None:
        self.lines.append(f"{name}:")

    def instr(self, mnemonic: str, *operands: str, guard: str | None = None) -> None:
        g = f"@{guard} " if guard else ""
        ops = ", ".join(operands)
        self.lines.append(f"    {g}{mnemonic}{' ' + ops if ops else ''};")

    def comment(self, text: str) -> None:
        self.lines.append(f"    // {text}")

    def reg_decls(self) -> list[str]:
        order = ["p", "rs", "r", "rd", "f", "fd"]
        return [f"    .reg .{self.decl_types[p]} %{p}<{self.counts[p] + 1}>;"
                for p in order if p in self.counts]
