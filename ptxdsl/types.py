"""The value types of ptxdsl: scalars, short vectors, global pointers, tensor maps, and the
reference types of shared buffers and mbarriers."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np


class Type:
    """Base of all ptxdsl types."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Scalar(Type):
    """A scalar register type; `kind` is one of u, s, f, b, pred."""

    name: str
    nbytes: int
    kind: str

    def __str__(self) -> str:
        return self.name

    @property
    def is_int(self) -> bool:
        return self.kind in ("u", "s", "b")

    @property
    def is_signed(self) -> bool:
        return self.kind == "s"

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_pred(self) -> bool:
        return self.kind == "pred"

    @property
    def is_fp8(self) -> bool:
        """e4m3 / e5m2: a memory and conversion type; it computes only after conversion."""
        return self.kind == "f" and self.nbytes == 1

    @property
    def nbits(self) -> int:
        return self.nbytes * 8

    @property
    def ptx(self) -> str:
        """The PTX type suffix (`.u32`, `.bf16`, ...), without the dot."""
        return self.name


u8 = Scalar("u8", 1, "u")
u16 = Scalar("u16", 2, "u")
u32 = Scalar("u32", 4, "u")
u64 = Scalar("u64", 8, "u")
s8 = Scalar("s8", 1, "s")
s16 = Scalar("s16", 2, "s")
s32 = Scalar("s32", 4, "s")
s64 = Scalar("s64", 8, "s")
b16 = Scalar("b16", 2, "b")
b32 = Scalar("b32", 4, "b")
b64 = Scalar("b64", 8, "b")
f16 = Scalar("f16", 2, "f")
bf16 = Scalar("bf16", 2, "f")
f32 = Scalar("f32", 4, "f")
f64 = Scalar("f64", 8, "f")
e4m3 = Scalar("e4m3", 1, "f")  # fp8: 4 exponent bits, 3 mantissa bits, no infinities
e5m2 = Scalar("e5m2", 1, "f")  # fp8: 5 exponent bits, 2 mantissa bits
pred = Scalar("pred", 1, "pred")

SCALARS: dict[str, Scalar] = {
    t.name: t
    for t in (u8, u16, u32, u64, s8, s16, s32, s64, b16, b32, b64, f16, bf16, f32, f64, e4m3,
              e5m2, pred)
}


@dataclass(frozen=True, slots=True)
class Vector(Type):
    """A short vector held in consecutive registers; moved by 8- or 16-byte vector ld/st."""

    elem: Scalar
    n: int

    def __str__(self) -> str:
        return f"{self.elem.name}x{self.n}"

    @property
    def nbytes(self) -> int:
        return self.elem.nbytes * self.n


def vector_type(elem: Scalar, n: int) -> Vector | None:
    """The vector type `elem x n`, or None when it is not a legal 4/8/16-byte vector (fp8
    vectors: 4, 8 or 16 elements, moved as 32-bit words)."""
    widths = (4, 8, 16) if elem.is_fp8 else (2, 4, 8)
    if elem.is_pred or (elem.nbytes < 2 and not elem.is_fp8) or n not in widths \
            or elem.nbytes * n not in (4, 8, 16):
        return None
    return Vector(elem, n)


@dataclass(frozen=True, slots=True)
class RegArray(Type):
    """A register array (`f32[128]`): `prod(shape)` registers of `elem`, indexed only with
    compile-time indices (constants and `unroll` loop variables); wgmma fragments."""

    elem: Scalar
    shape: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.elem}" + "".join(f"[{d}]" for d in self.shape)

    @property
    def n(self) -> int:
        return prod(self.shape)


@dataclass(frozen=True, slots=True)
class Ptr(Type):
    """A pointer to global memory with a typed element (a `.u64` kernel parameter)."""

    elem: Scalar

    def __str__(self) -> str:
        return f"ptr<{self.elem}>"


@dataclass(frozen=True, slots=True)
class TensorMap(Type):
    """A 128-byte CUtensorMap passed by value; `rank` 1..5, `elem` the element type."""

    elem: Scalar
    rank: int

    def __str__(self) -> str:
        return f"tmap<{self.elem}, {self.rank}>"


@dataclass(frozen=True, slots=True)
class SharedRef(Type):
    """A view of a shared-memory buffer: element type and the shape still to be indexed."""

    elem: Scalar
    shape: tuple[int, ...]

    def __str__(self) -> str:
        dims = "".join(f"[{d}]" for d in self.shape)
        return f"shared {self.elem}{dims}"

    @property
    def nelems(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.nelems * self.elem.nbytes


@dataclass(frozen=True, slots=True)
class GlobalRef(Type):
    """A place in global memory reached through a typed pointer."""

    elem: Scalar

    def __str__(self) -> str:
        return f"global {self.elem}"


@dataclass(frozen=True, slots=True)
class BarrierRef(Type):
    """One mbarrier object (8 bytes of shared memory), or an array of them when `n` > 0."""

    n: int = 0

    def __str__(self) -> str:
        return "mbarrier" if self.n == 0 else f"mbarrier[{self.n}]"


@dataclass(frozen=True, slots=True)
class PeerShared(SharedRef):
    """A view of a shared-memory buffer in another CTA of the cluster (distributed shared
    memory, reached through `mapa`); loads and stores use `.shared::cluster`."""

    def __str__(self) -> str:
        dims = "".join(f"[{d}]" for d in self.shape)
        return f"cluster shared {self.elem}{dims}"


@dataclass(frozen=True, slots=True)
class PeerBarrier(BarrierRef):
    """An mbarrier of another CTA of the cluster (remote arrive, expect_tx, completion)."""

    def __str__(self) -> str:
        return "cluster mbarrier"


@dataclass(frozen=True, slots=True)
class PipelineRef(Type):
    """A declared pipeline: its stage count."""

    stages: int

    def __str__(self) -> str:
        return f"pipeline[{self.stages}]"


@dataclass(frozen=True, slots=True)
class AsyncRef(Type):
    """A one-shot asynchronous load (`async name { ... }`), awaited with `await(name)`."""

    def __str__(self) -> str:
        return "async load"


@dataclass(frozen=True, slots=True)
class ScheduleRef(Type):
    """A declared tile schedule (`schedule work tiles(...) ...;`), walked with `for w in work`."""

    def __str__(self) -> str:
        return "schedule"


@dataclass(frozen=True, slots=True)
class WorkRef(Type):
    """A work item of a schedule: the loop variable of `for w in work`, read through its
    fields (w.m, w.n, w.k0, ...)."""

    def __str__(self) -> str:
        return "work item"


@dataclass(frozen=True, slots=True)
class Void(Type):
    def __str__(self) -> str:
        return "void"


@dataclass(frozen=True, slots=True)
class ErrorType(Type):
    """The type of an expression that already produced a diagnostic (stops cascades)."""

    def __str__(self) -> str:
        return "<error>"


void = Void()
error = ErrorType()

_NUMPY: dict[str, str] = {
    "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64",
    "s8": "int8", "s16": "int16", "s32": "int32", "s64": "int64",
    "b16": "uint16", "b32": "uint32", "b64": "uint64",
    "f16": "float16", "f32": "float32", "f64": "float64", "pred": "bool",
}  # fmt: skip


def numpy_dtype(t: Scalar) -> np.dtype:
    """The numpy dtype that holds values of `t` (bf16: ml_dtypes' bfloat16, a real numpy
    dtype; uint16 bit patterns are accepted where bf16 data is given; e4m3 / e5m2: ml_dtypes'
    float8_e4m3fn / float8_e5m2)."""
    if t.name in ("bf16", "e4m3", "e5m2"):
        import ml_dtypes

        return np.dtype({"bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn,
                         "e5m2": ml_dtypes.float8_e5m2}[t.name])
    return np.dtype(_NUMPY[t.name])


def parse_type_name(name: str) -> Type | None:
    """A scalar (`f32`) or vector (`f32x4`) type from its name, or None."""
    if name in SCALARS:
        return SCALARS[name]
    if "x" in name:
        head, _, tail = name.rpartition("x")
        if head in SCALARS and tail.isdigit():
            return vector_type(SCALARS[head], int(tail))
    return None
