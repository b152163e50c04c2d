"""Dynamic shared-memory layout: every shared buffer and mbarrier of a kernel gets an offset.

The kernel aligns the dynamic base in-kernel, because the base is only guaranteed 16-byte
aligned (nvJitLink places it right after a 16-byte static segment); the launch therefore
requests `align - 16` bytes of slack on top of the layout.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import ir


@dataclass(frozen=True)
class Slot:
    name: str
    offset: int
    nbytes: int
    align: int
    decl: ir.SharedDecl | ir.BarrierDecl


@dataclass(frozen=True)
class Layout:
    items: tuple[Slot, ...]
    size: int
    align: int

    @property
    def request_bytes(self) -> int:
        """Dynamic shared memory to request at launch (layout plus alignment slack)."""
        if not self.items:
            return 0
        return self.size + (self.align - 16 if self.align > 16 else 0)

    def _slot(self, name: str) -> Slot:
        for s in self.items:
            if s.name == name:
                return s
        raise KeyError(name)

    def decl(self, name: str) -> ir.SharedDecl | ir.BarrierDecl:
        return self._slot(name).decl

    def offset(self, name: str) -> int:
        return self._slot(name).offset

    def shape(self, name: str) -> tuple[int, ...]:
        decl = self._slot(name).decl
        assert isinstance(decl, ir.SharedDecl)
        return decl.shape

    def barrier_count(self, name: str) -> int:
        decl = self._slot(name).decl
        assert isinstance(decl, ir.BarrierDecl)
        return decl.count

    def comments(self) -> list[str]:
        lines = [f"    // shared memory: {self.size} bytes laid out, {self.request_bytes} "
                 "requested at launch"] if self.items else []
        for s in self.items:
            lines.append(f"    //   {s.name}: offset {s.offset}, {s.nbytes} bytes, "
                         f"align {s.align}")
        return lines


def layout_kernel(k: ir.Kernel) -> Layout:
    """Place buffers by decreasing alignment (stable), which wastes no padding between them."""
    decls = [s for s in k.body if isinstance(s, (ir.SharedDecl, ir.BarrierDecl))]

    def size_align(d: ir.SharedDecl | ir.BarrierDecl) -> tuple[int, int]:
        if isinstance(d, ir.SharedDecl):
            return d.nbytes, d.align
        return 8 * max(1, d.n), 8

    ordered = sorted(decls, key=lambda d: -size_align(d)[1])
    slots = []
    off = 0
    for d in ordered:
        nbytes, align = size_align(d)
        off = (off + align - 1) // align * align
        slots.append(Slot(d.name, off, nbytes, align, d))
        off += nbytes
    max_align = max((s.align for s in slots), default=16)
    size = (off + 15) // 16 * 16
    return Layout(tuple(slots), size, max(16, max_align))
