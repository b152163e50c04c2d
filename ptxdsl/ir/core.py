"""The one IR that the .ptxdsl frontend and the Python API both build.

Nodes are frozen dataclasses. `loc` (a source span) is excluded from equality, so IR built
from text and IR built from Python compare equal when they mean the same kernel. Every
expression carries its type, computed by the builder.

Statement nodes that map onto one PTX instruction family carry a `syntax` class variable:
the name of the function that writes them in .ptxdsl text and the Python API. Their
dataclass fields, in order, are its arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from .. import types as T
from ..errors import Span


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    loc: Span | None = field(default=None, compare=False, repr=False)


# ----------------------------------------------------------------------------- expressions


@dataclass(frozen=True, slots=True, kw_only=True)
class Expr(Node):
    type: T.Type


@dataclass(frozen=True, slots=True, kw_only=True)
class Const(Expr):
    """An immediate operand."""

    value: int | float | bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Var(Expr):
    """A kernel parameter, local variable or loop variable (a register)."""

    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SReg(Expr):
    """A special register such as `%tid.x` (`mov.u32 %r, %tid.x`); `%warp` is `%tid.x >> 5`."""

    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Unary(Expr):
    """`neg`, `not` (logical on pred, bitwise on integers)."""

    op: str
    x: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class Binary(Expr):
    """add sub mul div rem and or xor shl shr min max (`and`/`or` on pred are logical)."""

    op: str
    a: Expr
    b: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class Compare(Expr):
    """`setp.<op>.<type>`: eq ne lt le gt ge; the result is a pred."""

    op: str
    a: Expr
    b: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class Select(Expr):
    """`selp` (or predicated moves): cond ? a : b."""

    cond: Expr
    a: Expr
    b: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class Cast(Expr):
    """`cvt` between scalar types (rounding to nearest for float results)."""

    x: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class Call(Expr):
    """A value-producing intrinsic: ex2/rsqrt/... (`.approx`), fma, shuffles, elect.sync."""

    fn: str
    args: tuple[Expr, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Pack(Expr):
    """A vector built from scalars (`f32x4(a, b, c, d)`): a register group."""

    elems: tuple[Expr, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Extract(Expr):
    """Element `index` of a vector value: a constant, or an expression of unrolled loop
    variables (resolved when the loop is unrolled)."""

    vec: Expr
    index: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class SharedBuf(Expr):
    """A whole shared-memory buffer (type SharedRef); its address is a layout offset."""

    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class BarrierObj(Expr):
    """A declared mbarrier or mbarrier array (type BarrierRef)."""

    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Index(Expr):
    """A place: an element or sub-view of a shared buffer, an element behind a global
    pointer, or one mbarrier of an array. Indices are in elements, outermost first."""

    base: Expr
    indices: tuple[Expr, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Load(Expr):
    """`ld.shared` / `ld.global` of a place; a Vector type makes it `ld.v2`/`ld.v4`."""

    ref: Expr


# ----------------------------------------------------------------------------- statements


@dataclass(frozen=True, slots=True, kw_only=True)
class Stmt(Node):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class SharedDecl(Stmt):
    """A shared-memory buffer, placed by the compiler in dynamic shared memory. `swizzle`
    (0, 32, 64 or 128 bytes) declares the TMA/wgmma swizzled layout: rows of the last
    dimension are `swizzle` bytes whose 16-byte chunks are permuted by the row index; every
    access through the buffer (generic, TMA, wgmma descriptor) uses that one layout. `major`
    says which matrix dimension a row runs along when wgmma reads it: "k" (K-major, a row is
    K-contiguous) or "mn" (MN-major: the row is M- or N-contiguous, rows step along K)."""

    name: str
    elem: T.Scalar
    shape: tuple[int, ...]
    align: int
    swizzle: int = 0
    major: str = "k"  # "mn": rows run along K, the contiguous dimension is M or N (wgmma)

    @property
    def nbytes(self) -> int:
        n = self.elem.nbytes
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True, slots=True, kw_only=True)
class BarrierDecl(Stmt):
    """mbarrier object(s) (`.b64`, 8-byte aligned) with their expected arrival count;
    `n` = 0 declares a single barrier, otherwise an array of `n`."""

    name: str
    n: int
    count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Let(Stmt):
    """A typed local variable (a register), optionally initialised."""

    name: str
    var_type: T.Type
    value: Expr | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Assign(Stmt):
    """`mov`/compute into a local variable."""

    name: str
    value: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class SetElem(Stmt):
    """`mov` into one element of a vector variable (`v[i] = x`); the index is constant or an
    expression of unrolled loop variables."""

    name: str
    index: Expr
    value: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class Store(Stmt):
    """`st.shared` / `st.global` (vector form for vector values)."""

    ref: Expr
    value: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class If(Stmt):
    """Conditional branch (`@!p bra`)."""

    cond: Expr
    then: tuple[Stmt, ...]
    orelse: tuple[Stmt, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class For(Stmt):
    """Counted loop `for var in start .. stop step step` (stop exclusive); `unroll` loops
    have constant bounds and are emitted once per iteration."""

    var: str
    var_type: T.Scalar
    start: Expr
    stop: Expr
    step: Expr
    body: tuple[Stmt, ...]
    unroll: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class While(Stmt):
    """Loop while cond holds."""

    cond: Expr
    body: tuple[Stmt, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Return(Stmt):
    """`ret` (the thread exits)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Asm(Stmt):
    """Raw PTX; `{0}`, `{1}`... name the output variables, then the inputs."""

    template: str
    outs: tuple[str, ...]
    ins: tuple[Expr, ...]


# --- synchronisation and asynchronous copies: one class per PTX family -----------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Op(Stmt):
    """Base of the intrinsic statements written as `syntax(arg, ...)`."""

    syntax: ClassVar[str] = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class MBarrierInit(Op):
    """`mbarrier.init.shared::cta.b64 [bar], count` (count defaults to the declared one)."""

    syntax: ClassVar[str] = "mbarrier_init"
    bar: Expr
    count: Expr | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class MBarrierArrive(Op):
    """`mbarrier.arrive.release.cta.shared::cta.b64 _, [bar]{, count}`."""

    syntax: ClassVar[str] = "mbarrier_arrive"
    bar: Expr
    count: Expr | None = None
    # set by the lowering on a cluster pipeline's release of a stage its threads only read:
    # a peer's barrier is then arrived on with .release.cta (see ops/mbarrier.py)
    reads_only: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class MBarrierArriveExpectTx(Op):
    """`mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [bar], nbytes`."""

    syntax: ClassVar[str] = "mbarrier_arrive_expect_tx"
    bar: Expr
    nbytes: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class MBarrierExpectTx(Op):
    """`mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [bar], nbytes` (no arrival)."""

    syntax: ClassVar[str] = "mbarrier_expect_tx"
    bar: Expr
    nbytes: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class MBarrierWait(Op):
    """A loop on `mbarrier.try_wait.parity.shared::cta.b64` until the phase of parity
    `parity` has completed."""

    syntax: ClassVar[str] = "mbarrier_wait"
    bar: Expr
    parity: Expr
    role: str = ""  # the enclosing role, set by lowering, for the watchdog's report


@dataclass(frozen=True, slots=True, kw_only=True)
class MBarrierInval(Op):
    """`mbarrier.inval.shared::cta.b64 [bar]`."""

    syntax: ClassVar[str] = "mbarrier_inval"
    bar: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class FenceProxyAsync(Op):
    """`fence.proxy.async.shared::cta`: order this thread's generic shared-memory writes
    before later async-proxy (TMA / bulk) accesses."""

    syntax: ClassVar[str] = "fence_proxy_async"


@dataclass(frozen=True, slots=True, kw_only=True)
class FenceMBarrierInit(Op):
    """`fence.mbarrier_init.release.cluster`: publish prior mbarrier.init."""

    syntax: ClassVar[str] = "fence_mbarrier_init"


@dataclass(frozen=True, slots=True, kw_only=True)
class BarSync(Op):
    """`bar.sync id{, nthreads}` (id 0 with no count is the whole CTA)."""

    syntax: ClassVar[str] = "bar_sync"
    id: Expr
    nthreads: Expr | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BarArrive(Op):
    """`bar.arrive id, nthreads`."""

    syntax: ClassVar[str] = "bar_arrive"
    id: Expr
    nthreads: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkLoad(Op):
    """`cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src],
    nbytes, [bar]`."""

    syntax: ClassVar[str] = "bulk_load"
    dst: Expr
    src: Expr
    bar: Expr
    nbytes: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkStore(Op):
    """`cp.async.bulk.global.shared::cta.bulk_group [dst], [src], nbytes`."""

    syntax: ClassVar[str] = "bulk_store"
    dst: Expr
    src: Expr
    nbytes: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkCommit(Op):
    """`cp.async.bulk.commit_group`."""

    syntax: ClassVar[str] = "bulk_commit"


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkWait(Op):
    """`cp.async.bulk.wait_group n`: at most n bulk groups of this thread still pending."""

    syntax: ClassVar[str] = "bulk_wait"
    n: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkWaitRead(Op):
    """`cp.async.bulk.wait_group.read n`: sources of all but n groups have been read."""

    syntax: ClassVar[str] = "bulk_wait_read"
    n: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorLoad(Op):
    """`cp.async.bulk.tensor.Nd.shared::cluster.global.tile.mbarrier::complete_tx::bytes
    [dst], [tmap, {coords}], [bar]` (coords innermost first)."""

    syntax: ClassVar[str] = "tma_load"
    dst: Expr
    tmap: Expr
    coords: tuple[Expr, ...]
    bar: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorStore(Op):
    """`cp.async.bulk.tensor.Nd.global.shared::cta.tile.bulk_group [tmap, {coords}], [src]`."""

    syntax: ClassVar[str] = "tma_store"
    tmap: Expr
    coords: tuple[Expr, ...]
    src: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorMapPrefetch(Op):
    """`prefetch.tensormap [tmap]`: bring the descriptor into the cache."""

    syntax: ClassVar[str] = "tma_prefetch_desc"
    tmap: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorPrefetch(Op):
    """`cp.async.bulk.prefetch.tensor.Nd.L2.global.tile [tmap, {coords}]`: bring a tile into
    L2 ahead of its load."""

    syntax: ClassVar[str] = "tma_prefetch"
    tmap: Expr
    coords: tuple[Expr, ...]


# --- roles (pipelines and their operations: ir/pipeline.py) ------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Role(Stmt):
    """Warp specialisation: warps [warp_start, warp_stop) run `body`; `regs` lowers to
    `setmaxnreg` (consecutive roles become one if/else chain, as ptxas requires)."""

    name: str
    warp_start: int
    warp_stop: int
    regs: int | None
    body: tuple[Stmt, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Turn(Stmt):
    """`turn { ... }` in a role of several warpgroups: they run `body` one at a time, in
    order 0, 1, ..., n - 1, 0, ... (the ping-pong of FlashAttention 3 and CUTLASS: one
    warpgroup's wgmmas issue while the others do their softmax or epilogue). Every turn block
    of a role shares one rotation; lowering (`ptxdsl.lower.turns`) derives its named barriers,
    their thread counts, the first turn's release and the last one's drain."""

    body: tuple[Stmt, ...]


# ----------------------------------------------------------------------------- kernel


@dataclass(frozen=True, slots=True, kw_only=True)
class Param(Node):
    """A kernel parameter: `.param .u64` for pointers, `.param .align 64 .b8 [128]` for
    tensor maps, `.param .<type>` for scalars."""

    name: str
    type: T.Type


@dataclass(frozen=True, slots=True, kw_only=True)
class Kernel(Node):
    """One `.entry`; `threads` is the exact CTA shape (`.reqntid`)."""

    name: str
    params: tuple[Param, ...]
    threads: tuple[int, int, int]
    cluster: tuple[int, int, int] | None = None
    nonportable: bool = False  # clusters of more than 8 CTAs (up to 16) are allowed
    maxnreg: int | None = None
    minctas: int | None = None
    body: tuple[Stmt, ...]

    @property
    def nthreads(self) -> int:
        x, y, z = self.threads
        return x * y * z


@dataclass(frozen=True, slots=True, kw_only=True)
class Module(Node):
    """A translation unit: one or more kernels."""

    kernels: tuple[Kernel, ...]

    def kernel(self, name: str | None = None) -> Kernel:
        if name is None:
            return self.kernels[0]
        for k in self.kernels:
            if k.name == name:
                return k
        raise KeyError(name)


class Unknown(Exception):
    """A value that a static evaluation (which threads run a statement, which CTA of the
    cluster computes an expression) cannot tell: it depends on more than that evaluation
    follows."""
