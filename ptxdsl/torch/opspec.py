"""A torch custom op from a declarative description (`OpSpec`): its parameters and the checks
they get, the rule that allocates its output, and the function that launches its kernel.

`register(spec)` makes `torch.ops.ptxdsl.<name>` with `torch.library.custom_op`: the CUDA
implementation checks the inputs, allocates the output and launches on torch's current
stream (so CUDA graphs capture it); the fake implementation, which torch.compile traces,
runs the same checks and allocates the same output on fake tensors. Bad inputs raise
TypeError or ValueError naming the op, the argument and what was expected, before any
launch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

Args = dict[str, Any]  # the op's arguments by name, defaults filled in

_TORCH_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}


def dtype_name(dtype: torch.dtype) -> str:
    return _TORCH_NAMES.get(dtype, str(dtype))


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorParam:
    """A tensor argument: its element types, rank (None: any rank >= 1) and layout; or, with
    `numel`, a tensor of exactly that many elements and any rank, 0 included (a scale).

    layout "tma": innermost stride 1, other strides and the address 16-byte aligned (what a
    TMA tensor map needs); "contiguous": row-major contiguous, address 16-byte aligned
    (what 16-byte vector loads need). `aligned=False` lifts the address rule (the op picks
    narrower loads for such a tensor)."""

    name: str
    dtypes: tuple[torch.dtype, ...]
    rank: int | None = None
    layout: str = "contiguous"
    numel: int | None = None
    aligned: bool = True


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
    `output(args)`: the (shape, dtype) of the one output, allocated on the first tensor's
    device. `launch(args, out, stream)`: runs the kernel(s) on the CUstream handle `stream`;
    called only for a non-empty output."""

    name: str
    params: tuple[TensorParam | ScalarParam, ...]
    check: Callable[[Args], str | None]
    output: Callable[[Args], tuple[tuple[int, ...], torch.dtype]]
    launch: Callable[[Args, torch.Tensor, int], None]

    @property
    def schema(self) -> str:
        parts = []
        for p in self.params:
            if isinstance(p, TensorParam):
                parts.append(f"Tensor {p.name}")
            else:
                parts.append(f"{p.type} {p.name}={p.default!r}")
        return f"({', '.join(parts)}) -> Tensor"

    def bind(self, args: tuple) -> Args:
        """The arguments by name (the dispatcher passes them positionally, without the
        trailing defaults)."""
        bound = dict(zip((p.name for p in self.params), args, strict=False))
        for p in self.params[len(args) :]:
            if isinstance(p, ScalarParam):
                bound[p.name] = p.default
        return bound

    def validate(self, args: Args, *, real: bool) -> None:
        """Raise TypeError / ValueError for the first bad argument: kinds, devices, dtypes and
        ranks first, then the relations between arguments, then layouts. `real`: the
        tensors hold memory (not fake), so their addresses are checked too."""
        tensors = [(p, args[p.name]) for p in self.params if isinstance(p, TensorParam)]
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

    def signature(self, raw: tuple) -> tuple:
        """What the checks depend on, except the addresses: each tensor's dtype, shape,
        strides and device, and the scalars (raises TypeError for an unhashable argument)."""
        sig = tuple((a.dtype, a.shape, a.stride(), a.device) if isinstance(a, torch.Tensor)
                    else (type(a), a) for a in raw)
        hash(sig)
        return sig

    def check_addresses(self, args: Args) -> None:
        """The per-call part of the checks of a signature already checked: alignment."""
        for p in self.params:
            if isinstance(p, TensorParam) and p.aligned and args[p.name].data_ptr() % 16:
                _check_layout(self.name, p, args[p.name], True)


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


_SIGNATURES = 4096  # checked signatures kept per op


def raw_stream(device: torch.device) -> int:
    """The CUstream handle of torch's current stream on `device` (inductor's own accessor,
    several microseconds cheaper than torch.cuda.current_stream)."""
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if get is not None:
        return int(get(device.index))
    return int(torch.cuda.current_stream(device).cuda_stream)


def register(spec: OpSpec) -> Any:
    """`torch.ops.ptxdsl.<spec.name>`: the CustomOpDef (its `register_autograd` adds a
    backward)."""
    first = next(p.name for p in spec.params if isinstance(p, TensorParam))

    def allocate(args: Args) -> torch.Tensor:
        shape, dtype = spec.output(args)
        return args[first].new_empty(shape, dtype=dtype)

    checked: set[tuple] = set()  # signatures whose checks passed: a call repeats only the
    # address checks (the host cost of an op call is most of a small kernel's time)

    def cuda_impl(*raw: Any) -> torch.Tensor:
        args = spec.bind(raw)
        try:
            sig: tuple | None = spec.signature(raw)
        except TypeError:
            sig = None
        if sig is not None and sig in checked:
            spec.check_addresses(args)
        else:
            spec.validate(args, real=True)
            if sig is not None:
                if len(checked) >= _SIGNATURES:
                    checked.clear()
                checked.add(sig)
        out = allocate(args)
        if out.numel():
            spec.launch(args, out, raw_stream(args[first].device))
        return out

    def fake_impl(*raw: Any) -> torch.Tensor:
        args = spec.bind(raw)
        spec.validate(args, real=False)
        return allocate(args)

    def misplaced(*raw: Any) -> torch.Tensor:
        # inputs on the CPU reach this instead of the CUDA implementation: the checks name
        # the argument that is not on the GPU
        spec.validate(spec.bind(raw), real=False)
        raise AssertionError(f"{spec.name}: the checks let a CPU tensor through")

    op = torch.library.custom_op(
        f"ptxdsl::{spec.name}", cuda_impl, mutates_args=(), device_types="cuda",
        schema=spec.schema,
    )
    op.register_fake(fake_impl)
    op.register_kernel("cpu", misplaced)
    return op
