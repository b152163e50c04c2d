"""The swizzled shared-memory layouts that TMA writes and wgmma reads, in one place.

A buffer declared `swizzle S` (S = 32, 64 or 128 bytes) holds rows of exactly S bytes (its
last dimension); inside every aligned group of 8 rows the 16-byte chunks of a row are permuted
by XOR with address bits [7, 10): physical = a ^ (((a >> 7) & mask) << 4), on the absolute
shared address, which is why the buffer is aligned to 8 * S bytes. `swizzle 16` is the
unswizzled ("interleaved") wgmma layout: rows of 16 bytes, 8 of them one core matrix,
declared [k blocks][rows][16 bytes] so that TMA fills one k block per copy. The wgmma matrix
descriptor of a K-major operand in such a buffer (PTX ISA, "Matrix Descriptor Format"):
  bits  0-13  start address >> 4      (the operand's first row, k offset included)
  bits 16-29  leading byte offset >> 4 (unused for swizzled K-major layouts: 1; MN-major:
              the bytes between blocks of S bytes along M / N, the buffer's third-last stride)
  bits 32-45  stride byte offset >> 4  (8 rows: 8 * S bytes between 8-row core groups, along
              M / N for K-major rows, along K for MN-major rows)
  bits 49-51  base offset             (0: the buffer is aligned to the pattern)
  bits 62-63  layout: 1 = 128B, 2 = 64B, 3 = 32B swizzle
"""

from __future__ import annotations

SWIZZLES = (16, 32, 64, 128)
_MASK = {0: 0, 16: 0, 32: 1, 64: 3, 128: 7}  # 0 or 16: no swizzle
_MODE = {128: 1, 64: 2, 32: 3, 16: 0}
LBO_FIELD = 1


def mask(swizzle: int) -> int:
    """Bits of (address >> 7) that are XORed into the 16-byte chunk index."""
    return _MASK[swizzle]


def physical(addr: int, swizzle: int) -> int:
    """The swizzled shared address of logical address `addr` (absolute)."""
    if not swizzle:
        return addr
    return addr ^ (((addr >> 7) & _MASK[swizzle]) << 4)


def tma_name(swizzle: int) -> str:
    """The tensor-map swizzle mode that writes a buffer declared `swizzle S`."""
    return "none" if swizzle in (0, 16) else f"{swizzle}B"


def chunk_columns(cols: int, elem_bytes: int) -> int:
    """The widest chunk (in elements) of a `cols`-wide tile that one swizzled TMA box holds
    whole: rows of 128 bytes; of 64 where 128 bytes do not divide the tile; of 32 where 64 do
    not either (a 224-wide bf16 tile goes out in 32-column chunks). Its swizzle is the
    chunk's row in bytes."""
    for row in (128, 64, 32):
        if row % elem_bytes == 0 and cols % (row // elem_bytes) == 0:
            return row // elem_bytes
    raise ValueError(f"no swizzled chunk divides a tile of {cols} x {elem_bytes}-byte columns")


def chunk_box(rows: int, cols: int, elem_bytes: int) -> tuple[tuple[int, int], str]:
    """The TMA box and tensor-map swizzle that store a `cols`-wide tile `rows` rows at a time
    in `chunk_columns` chunks (what make_gemm's C stores expect)."""
    cw = chunk_columns(cols, elem_bytes)
    return (rows, cw), tma_name(cw * elem_bytes)


def swizzle_align(swizzle: int) -> int:
    """The alignment (bytes) a TMA tile needs with a swizzle of `swizzle` bytes (0 or 16:
    none): 8 rows of the pattern, so it starts in phase; 128 without swizzle."""
    return 8 * swizzle if swizzle in (32, 64, 128) else 128


def tma_swizzle_bytes(name: str) -> int:
    """The bytes of a tensor-map swizzle mode ("none", "32B", "64B", "128B"); 0 for none."""
    return 0 if name == "none" else int(name.rstrip("B"))


def blocked(swizzle: int, major: str) -> bool:
    """Whether the layout is [blocks][rows][row] with blocks one leading-byte-offset apart:
    MN-major rows (blocks along M / N) and the unswizzled layout (blocks along K)."""
    return major == "mn" or swizzle == 16


def lbo_field(decl_shape: tuple[int, ...], esz: int, major: str, swizzle: int = 0) -> int:
    """The leading-byte-offset field: 1 (unused) for swizzled K-major rows; for blocked
    layouts the stride (>> 4) between blocks (the third-last dimension): along M / N for
    MN-major rows, along K for the unswizzled layout."""
    if not blocked(swizzle, major) or len(decl_shape) < 3:
        return LBO_FIELD
    return (decl_shape[-2] * decl_shape[-1] * esz) >> 4


def undeclared_layout(which: str, buffer: str) -> str:
    """What a wgmma operand in a buffer declared without a swizzle is told (the verifier and
    the interpreter, which runs unverified kernels, say the same): wgmma's descriptor needs
    one of the layouts above."""
    return (f"the wgmma {which} operand is in buffer '{buffer}', which declares no swizzle; "
            "declare its layout ('swizzle 128' with rows of 128 bytes, or 64 / 32, or 16 for "
            "the unswizzled core-matrix layout) so that TMA and the descriptor agree")


def desc_lo(addr: int, lbo: int = LBO_FIELD) -> int:
    """Low word of a descriptor: start address and leading byte offset field."""
    return ((addr & 0x3FFFF) >> 4) | (lbo << 16)


def desc_hi(swizzle: int) -> int:
    """High word of a descriptor with rows of `swizzle` bytes (8-row groups 8 S apart)."""
    return ((8 * swizzle) >> 4) | (_MODE[swizzle] << 30)
