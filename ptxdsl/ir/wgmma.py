"""Tensor-core operations: warpgroup matrix multiply-accumulate (wgmma) and its fences.

A wgmma reads its shared-memory operands through 64-bit matrix descriptors that the compiler
derives from the operand's buffer declaration (swizzle, row pitch, alignment) and from the
place written in the call (`tile[row, k]`: the 8-row-aligned row and the k offset)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .. import types as T
from .core import Expr, Op, Stmt
from .walk import walk


@dataclass(frozen=True, slots=True, kw_only=True)
class Wgmma(Op):
    """`wgmma.mma_async.sync.aligned.m64nNkK.f32.T.T {d}, a-desc|{a}, b-desc, scale-d,
    imm-scale-a, imm-scale-b[, imm-trans-a, imm-trans-b]`: d (64 x N, N = 2 * registers of
    `d`) = A (64 x K at place `a`, or registers) * B (N x K at place `b`)^T (+ d when
    `accumulate`, default true); `neg_a` / `neg_b` (constants 0/1) negate an input."""

    syntax: ClassVar[str] = "wgmma"
    d: Expr
    a: Expr
    b: Expr
    accumulate: Expr | None = None
    neg_a: Expr | None = None
    neg_b: Expr | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class WgmmaFence(Op):
    """`wgmma.fence.sync.aligned`: order register accesses before the next wgmma."""

    syntax: ClassVar[str] = "wgmma_fence"


@dataclass(frozen=True, slots=True, kw_only=True)
class WgmmaCommit(Op):
    """`wgmma.commit_group.sync.aligned`: the wgmmas issued since the last commit form a group."""

    syntax: ClassVar[str] = "wgmma_commit"


@dataclass(frozen=True, slots=True, kw_only=True)
class WgmmaWait(Op):
    """`wgmma.wait_group.sync.aligned n`: at most n wgmma groups of this thread pending."""

    syntax: ClassVar[str] = "wgmma_wait"
    n: Expr


@dataclass(frozen=True, slots=True, kw_only=True)
class Fragment(Expr):
    """`frag(p, k)`: the A fragment of the k-th k-step held in register array `p` (its
    fragment_elems elements from there: 8 of 16-bit, 16 of fp8). A thread's m64nN
    accumulator and a row of m64 16-bit A fragments share one layout: accumulator elements
    8k .. 8k + 7 are exactly the A fragment of columns 16k .. 16k + 15, so an accumulator
    converted element by element (P = softmax(S) as bf16) feeds the next wgmma from registers
    through `frag(p, k)` with no shuffle. An fp8 fragment (k32) holds columns 4l .. 4l + 3
    and 16 + 4l .. 16 + 4l + 3 of lane l of a quad where the accumulator holds 2l, 2l + 1,
    8 + 2l, ...: its columns are a fixed permutation of the accumulator's within each 16,
    which the other operand's K order can absorb (attention_fp8 permutes V's keys)."""

    syntax: ClassVar[str] = "frag"
    vec: Expr
    k: Expr


def fragment_elems(elem: T.Scalar) -> int:
    """Elements of one A fragment in registers (four 32-bit registers): 8 of a 16-bit type,
    16 of fp8."""
    return 16 // elem.nbytes


def fragment_arrays(body: tuple[Stmt, ...]) -> set[str]:
    """The register arrays that wgmmas in `body` read as A operands (directly or through
    `frag(p, k)`): codegen keeps each packed, two 16-bit or four fp8 elements to a 32-bit
    register."""
    out = set()
    for n in walk(body):
        if isinstance(n, Wgmma) and isinstance(n.a.type, T.RegArray):
            out.add((n.a.vec if isinstance(n.a, Fragment) else n.a).name)  # type: ignore[attr-defined]
    return out
