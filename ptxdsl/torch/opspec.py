"""A torch op from a declarative description (`OpSpec`): its parameters and the checks they
get, the rule that allocates its output, and the launch plan of its kernels.

`register(spec)` (ptxdsl/torch/dispatch.py) makes `torch.ops.ptxdsl.<name>`. Bad inputs raise
TypeError or ValueError naming the op, the argument and what was expected, before any
launch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

Args = dict[str, Any]  # the op's arguments by name, defaults filled in
Output = Callable[[Args], tuple[tuple[int, ...], torch.dtype]]  # an output's (shape, dtype)
# A launch plan's run: (the call's tensors in parameter order, its output (an op of several
# outputs: the tuple of them; None for an op that only writes its mutated tensors), the
# CUstream handle of torch's current stream, where it allocates any workspace)
Run = Callable[[tuple, Any, int], None]

_TORCH_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}


def dtype_name(dtype: torch.dtype) -> str:
    return _TORCH_NAMES.get(dtype, str(dtype))


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorParam:
    """A tensor argument: its element types, rank (None: any rank >= 1) and layout; or, with
    `numel`, a tensor of exactly that many elements and any rank, 0 included (a scale).

    layout "tma": innermost stride 1, other strides and the address 16-byte aligned (what a
    TMA tensor map needs); "tma_t": a matrix whose transpose is "tma" (column-major, as block
    scales are stored); "contiguous": row-major contiguous, address 16-byte aligned (what
    16-byte vector loads need). `aligned=False` lifts the address rule (the op picks
    narrower loads for such a tensor). `optional`: None is accepted too (the schema's
    `Tensor? name=None`; the checks skip it). `mutated`: the op writes it in place (the
    schema's `Tensor(a!) name`, so that torch.compile's functionalization and autograd's
    version counters know)."""

    name: str
    dtypes: tuple[torch.dtype, ...]
    rank: int | None = None
    layout: str = "contiguous"
    numel: int | None = None
    aligned: bool = True
    optional: bool = False
    mutated: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ScalarParam:
    """A scalar argument with its default: type "float", "int", "bool", or "float?" (a float
    or None)."""

    name: str
    type: str
    default: float | int | bool | None


@dataclass(frozen=True, slots=True, kw_only=True)
class OpSpec:
    """What `register` needs to make an op.

    `check(args)`: the relations between arguments (shapes that must agree, sizes the
    kernel supports); returns what is wrong as "<arg> must ..., got ..." or None.
    `output(args)`: the (shape, dtype) of the output, allocated on the first tensor's device;
    `extra_outputs`: the rules of any further outputs (the op then returns them all as a
    tuple, and its plan and run get them as one). `output` None: the op returns nothing and
    writes its `mutated` tensors (its work is the first tensor's: a call where that is empty
    launches nothing).

    `plan(args, out, stream)`: the launch plan of one signature (every tensor's dtype, shape,
    strides, device and address alignment, and every scalar), made at the first call with
    that signature (only for a non-empty first output): it may tune (launching trials on the
    CUstream handle `stream`), loads the kernels, works out grids and tensor-map templates,
    and returns the `run(tensors, out, stream)` that launches this call and every later one
    of the signature. A run reads from its tensors only what the signature leaves free:
    their addresses (tensor maps re-pointed with `TensorMap.at`). Tensor parameters come
    before scalars."""

    name: str
    params: tuple[TensorParam | ScalarParam, ...]
    check: Callable[[Args], str | None]
    output: Output | None
    plan: Callable[[Args, Any, int], Run]
    extra_outputs: tuple[Output, ...] = ()

    def __post_init__(self) -> None:
        kinds = [isinstance(p, TensorParam) for p in self.params]
        if not kinds or not kinds[0] or kinds != sorted(kinds, reverse=True):
            raise ValueError(f"{self.name}: tensor parameters come first, then scalars")
        optional = [p.optional for p in self.params if isinstance(p, TensorParam)]
        if optional[0] or optional != sorted(optional):
            raise ValueError(f"{self.name}: optional tensors come after the other tensors")
        if self.output is None and not self.mutated:
            raise ValueError(f"{self.name}: an op without an output must mutate a tensor")

    @property
    def tensors(self) -> int:
        """How many tensor parameters the op has (they come first)."""
        return sum(isinstance(p, TensorParam) for p in self.params)

    @property
    def outputs(self) -> tuple[Output, ...]:
        """The rule of every output, in order (none for an op that only mutates)."""
        return () if self.output is None else (self.output, *self.extra_outputs)

    @property
    def mutated(self) -> tuple[int, ...]:
        """The positions of the tensor parameters the op writes in place."""
        return tuple(i for i, p in enumerate(self.params)
                     if isinstance(p, TensorParam) and p.mutated)

    @property
    def schema(self) -> str:
        parts, aliases = [], iter("abcdefghijklmnopqrstuvwxyz")
        for p in self.params:
            if isinstance(p, TensorParam):
                t = f"Tensor({next(aliases)}!)" if p.mutated else "Tensor"
                parts.append(f"{t}? {p.name}=None" if p.optional else f"{t} {p.name}")
            else:
                parts.append(f"{p.type} {p.name}={p.default!r}")
        n = len(self.outputs)
        returns = "()" if n == 0 else "Tensor" if n == 1 else f"({', '.join(['Tensor'] * n)})"
        return f"({', '.join(parts)}) -> {returns}"

    def bind(self, args: tuple) -> Args:
        """The arguments by name (the dispatcher passes them positionally, without the
        trailing defaults)."""
        bound = dict(zip((p.name for p in self.params), args, strict=False))
        for p in self.params[len(args) :]:
            bound[p.name] = p.default if isinstance(p, ScalarParam) else None
        return bound

    def validate(self, args: Args, *, real: bool) -> None:
        """Raise TypeError / ValueError for the first bad argument: kinds, devices, dtypes and
        ranks first, then the relations between arguments, then layouts. `real`: the
        tensors hold memory (not fake), so their addresses are checked too."""
        tensors = [(p, args[p.name]) for p in self.params if isinstance(p, TensorParam)
                   and not (p.optional and args[p.name] is None)]
        for p, t in tensors:
            _check_kind(self.name, p, t)
        (p0, t0), *rest = tensors
        for p, t in rest:
            if t.device != t0.device:
                raise ValueError(f"{self.name}: {p.name} must be on {p0.name}'s device "
                                 f"({t0.device}), got {t.device}")
        problem = self.check(args)
        if problem is not None:
            raise ValueError(f"{self.name}: {problem}")
        for p, t in tensors:
            _check_layout(self.name, p, t, real)


def _check_kind(op: str, p: TensorParam, t: Any) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {p.name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise ValueError(f"{op}: {p.name} must be on a CUDA device, got {t.device}")
    if t.dtype not in p.dtypes:
        allowed = " or ".join(dtype_name(d) for d in p.dtypes)
        raise TypeError(f"{op}: {p.name} must be {allowed}, got {t.dtype}")
    if p.numel is not None:
        if t.numel() != p.numel:
            raise ValueError(
                f"{op}: {p.name} must have {p.numel} element{'s' * (p.numel != 1)}, got "
                f"{t.numel()} (shape {tuple(t.shape)})"
            )
        return
    if p.rank is not None and t.dim() != p.rank:
        raise ValueError(
            f"{op}: {p.name} must have {p.rank} dimensions, got {t.dim()} "
            f"(shape {tuple(t.shape)})"
        )
    if t.dim() == 0:
        raise ValueError(f"{op}: {p.name} must have at least 1 dimension, got a scalar")


def _check_layout(op: str, p: TensorParam, t: Any, real: bool) -> None:
    size = t.element_size()
    if p.layout == "contiguous":
        if not t.is_contiguous():
            raise ValueError(
                f"{op}: {p.name} must be contiguous (row-major), got strides {t.stride()} "
                f"for shape {tuple(t.shape)}; call .contiguous() first"
            )
    elif p.layout == "tma_t":
        if t.dim() != 2 or t.stride(0) != 1 or t.stride(1) * size % 16:
            raise ValueError(
                f"{op}: {p.name} must be column-major with a 16-byte column pitch (strides "
                f"(1, n), n x {size} bytes a multiple of 16), got strides {t.stride()} for "
                f"shape {tuple(t.shape)}; pass s.t().contiguous().t()"
            )
    elif t.stride(-1) != 1:
        raise ValueError(
            f"{op}: {p.name} must have unit stride in its last dimension (TMA), got "
            f"strides {t.stride()}"
        )
    else:
        for d in range(t.dim() - 1):
            if t.stride(d) * size % 16:
                raise ValueError(
                    f"{op}: {p.name}'s stride in dimension {d} must be a multiple of 16 bytes "
                    f"(TMA), got {t.stride(d) * size} bytes (shape {tuple(t.shape)}, strides "
                    f"{t.stride()})"
                )
    if real and p.aligned and t.data_ptr() % 16:
        raise ValueError(
            f"{op}: {p.name}'s address must be 16-byte aligned, got 0x{t.data_ptr():x} "
            f"(a view at an offset of {t.storage_offset()} elements); call .clone() first"
        )
