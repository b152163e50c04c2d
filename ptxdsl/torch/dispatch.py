"""`register(spec)`: `torch.ops.ptxdsl.<name>` for an OpSpec, with the least host time per call.

The op is defined on a `torch.library.Library` with a CUDA kernel, a fake kernel (what
torch.compile traces: the same checks, the same output, on fake tensors) and a CPU kernel
that names the argument not on the GPU. `torch.library.custom_op` would wrap the CUDA
kernel in Python layers of its own (aliasing checks, a Dynamo-disabled frame): 11.7 us a call
of an empty op against 4.2 us through the Library on the H200 host (2026-11-28).

A call looks its signature up among the launch plans the op has made (OpSpec.plan): the
first call of a signature runs every check, tunes and builds the plan; a later call
allocates its output and runs the plan, which re-points addresses and launches on torch's
current stream (so CUDA graphs capture it). The signature holds everything the checks read
except the addresses, and each address's alignment, so a call that changes what a plan
depends on makes a plan of its own, after the checks.

An op that writes tensors in place (TensorParam.mutated, `Tensor(a!)`) bumps their autograd
version counters at every call, as torch's own in-place ops do (a tensor saved for a backward
and then overwritten is an error, not a wrong gradient), and refuses inputs that need a
gradient."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import autotune
from .opspec import OpSpec, Run, TensorParam

_PLANS = 4096  # plans kept per op (a serving loop has a few dozen signatures)
_LIB = torch.library.Library("ptxdsl", "FRAGMENT")  # noqa: TOR901 (ops defined below)


def current_device() -> int:
    """torch's current CUDA device (the C accessor torch.cuda.current_device wraps)."""
    return torch._C._cuda_getDevice()


def raw_stream_getter() -> Callable[[int], int]:
    """`get(device_index)`: the CUstream handle of torch's current stream there (inductor's own
    accessor, several microseconds cheaper than torch.cuda.current_stream)."""
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if get is not None:
        return get
    return lambda index: int(torch.cuda.current_stream(index).cuda_stream)


raw_stream = raw_stream_getter()


def signer(tensors: int, optional: int = 0) -> Callable[[tuple], tuple]:
    """`signature(raw)` of an op whose first `tensors` arguments are tensors (the schema makes
    them so), the last `optional` of them optional: what a plan depends on, each tensor's
    dtype, shape, strides, device and address modulo 16 (an optional one's, or that it is
    None or left out), then the scalars; generated flat, as it runs at every call."""
    parts = ""
    for i in range(tensors):
        one = (f"r[{i}].dtype, r[{i}].shape, r[{i}].stride(), r[{i}].get_device(), "
               f"r[{i}].data_ptr() & 15")
        if i >= tensors - optional:
            one = f"({one}) if len(r) > {i} and r[{i}] is not None else None"
        parts += one + ", "
    env: dict[str, Any] = {}
    exec(f"def signature(r):\n    return ({parts}r[{tensors}:])", env)  # noqa: S102
    return env["signature"]


class Plan:
    """One signature's output rule and launch."""

    __slots__ = ("allocate", "run", "device")

    def __init__(self, allocate: Callable[[torch.Tensor], Any], run: Run | None, device: int):
        self.allocate, self.run, self.device = allocate, run, device


def allocator(first: torch.Tensor, shape: tuple[int, ...],
              dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    """The cheapest torch call that makes a contiguous `shape` x `dtype` tensor on `first`'s
    device (empty_like when the first input is already that)."""
    if tuple(first.shape) == tuple(shape) and first.dtype == dtype and first.is_contiguous():
        return torch.empty_like
    return lambda t: t.new_empty(shape, dtype=dtype)


def allocators(first: torch.Tensor,
               outputs: list[tuple[tuple[int, ...], torch.dtype]]) -> Callable[[torch.Tensor], Any]:
    """An op's output allocator: one output's, or for several one that returns the tuple."""
    if len(outputs) == 1:
        return allocator(first, *outputs[0])
    each = tuple(allocator(first, shape, dtype) for shape, dtype in outputs)
    return lambda t: tuple(a(t) for a in each)


class Op:
    """A registered op: calling it calls `torch.ops.ptxdsl.<name>`."""

    def __init__(self, spec: OpSpec, plans: dict[tuple, Plan]):
        self.spec = spec
        self._plans = plans

    @property
    def plans(self) -> int:
        """How many launch plans the op holds."""
        return len(self._plans)

    def __call__(self, *args: Any) -> Any:
        return getattr(torch.ops.ptxdsl, self.spec.name).default(*args)


def _nothing(first: torch.Tensor) -> None:
    """The output rule of an op that returns nothing (it writes its mutated tensors)."""


def register(spec: OpSpec, *, backward: Callable[..., Any] | None = None,
             setup_context: Callable[..., Any] | None = None,
             forward: Callable[..., Any] | None = None) -> Op:
    """Define `torch.ops.ptxdsl.<spec.name>` and its kernels; `backward(ctx, *grads)` and
    `setup_context(ctx, inputs, output)` as torch.library.register_autograd takes them (an op
    without a backward raises when autograd reaches it, not a silent zero gradient).
    `forward`: an op that autograd runs in this one's place, with the same arguments,
    returning this op's output first and then what the backward needs (setup_context gets
    them all): the call that needs no gradient pays for none of it."""
    plans: dict[tuple, Plan] = {}
    nt = spec.tensors
    signature = signer(nt, sum(isinstance(p, TensorParam) and p.optional for p in spec.params))

    def build(raw: tuple) -> tuple[Plan, torch.Tensor | None]:
        """The plan of a new signature, after every check, and this call's output (the plan
        was made over it)."""
        args = spec.bind(raw)
        spec.validate(args, real=True)
        first = raw[0]
        allocate = _nothing if spec.output is None else \
            allocators(first, [rule(args) for rule in spec.outputs])
        device = first.get_device()
        out = allocate(first)
        work = first if out is None else out[0] if spec.extra_outputs else out
        run = spec.plan(args, out, raw_stream(device)) if work.numel() else None
        plan = Plan(allocate, run, device)
        if autotune.tuning_allowed():  # a plan made while capturing may hold an untuned choice
            if len(plans) >= _PLANS:
                plans.clear()
            plans[signature(raw)] = plan
        return plan, out

    def call(raw: tuple, plan: Plan | None) -> Any:
        if plan is None:
            plan, out = build(raw)
        else:
            out = plan.allocate(raw[0])
        if plan.run is not None:
            plan.run(raw[:nt], out, raw_stream(plan.device))
        return out

    def cuda_impl(*raw: Any) -> Any:
        plan = plans.get(signature(raw))
        if plan is not None and plan.device == current_device():
            return call(raw, plan)
        # ATen's device guard: the launch makes the tensors' device current for the driver,
        # and torch would report it as the current device afterwards
        with torch.cuda.device(raw[0].get_device()):
            return call(raw, plan)

    def fake_impl(*raw: Any) -> Any:
        args = spec.bind(raw)
        spec.validate(args, real=False)
        first = args[spec.params[0].name]
        outs = tuple(first.new_empty(shape, dtype=dtype)
                     for shape, dtype in (rule(args) for rule in spec.outputs))
        return None if not outs else outs if spec.extra_outputs else outs[0]

    def misplaced(*raw: Any) -> torch.Tensor:
        # inputs on the CPU reach this instead of the CUDA implementation: the checks name
        # the argument that is not on the GPU
        spec.validate(spec.bind(raw), real=False)
        raise AssertionError(f"{spec.name}: the checks let a CPU tensor through")

    _LIB.define(spec.name + spec.schema)
    _LIB.impl(spec.name, cuda_impl, "CUDA")
    _LIB.impl(spec.name, misplaced, "CPU")
    torch.library.register_fake(f"ptxdsl::{spec.name}", fake_impl, lib=_LIB)
    op = getattr(torch.ops.ptxdsl, spec.name).default
    if spec.mutated:
        bump = _version_bump(spec.mutated)
        _LIB.impl(spec.name, _views_kernel(op, bump), "ADInplaceOrView", with_keyset=True)
        autograd = _autograd_kernel(spec, op, cuda_impl, _no_backward(spec.name), None, None,
                                    bump)
    else:
        autograd = _autograd_kernel(spec, op, cuda_impl, backward or _no_backward(spec.name),
                                    setup_context, forward)
    _LIB.impl(spec.name, autograd, "Autograd", with_keyset=True)
    return Op(spec, plans)


_BELOW_AUTOGRAD = torch._C._after_autograd_keyset
_BELOW_VIEWS = torch._C._after_ADInplaceOrView_keyset
_CUDA = torch._C.DispatchKey.CUDA
_VIEWS = torch._C.DispatchKey.ADInplaceOrView  # a fallthrough for a functional op


def _version_bump(mutated: tuple[int, ...]) -> Callable[[tuple], None]:
    """`bump(args)`: the version counters of the tensors at positions `mutated` go up."""
    increment = torch.autograd.graph.increment_version

    def bump(args: tuple) -> None:
        for i in mutated:
            if i < len(args) and args[i] is not None:
                increment(args[i])

    return bump


def _views_kernel(op: Any, bump: Callable[[tuple], None]) -> Callable[..., Any]:
    """A mutating op's kernel for the ADInplaceOrView key (what a redispatched call meets):
    on to the backend, then the version bump (a call its checks refuse bumps nothing)."""

    def kernel(keyset: Any, *args: Any) -> Any:
        out = op.redispatch(keyset & _BELOW_VIEWS, *args)
        bump(args)
        return out

    return kernel


def _autograd_kernel(spec: OpSpec, op: Any, cuda_impl: Callable[..., Any],
                     backward: Callable[..., Any], setup_context: Callable[..., Any] | None,
                     forward: Callable[..., Any] | None,
                     bump: Callable[[tuple], None] | None = None) -> Callable[..., Any]:
    """The op's kernel for the Autograd key. A call that needs no gradient on plain CUDA
    tensors goes straight to `cuda_impl` (what the dispatcher would reach, one Python
    trampoline sooner: torch.library.register_autograd's kernel redispatches, about 6 us a
    call on the H200 host), after `bump` for a mutating op (the ADInplaceOrView kernel it
    skips); fake tensors, dispatch modes and subclasses redispatch; a call that needs a
    gradient records `backward` through an autograd.Function (running `forward` in the op's
    place where given: its first output is the result, the rest are saved; a mutating op
    raises: it has no output to record it on)."""

    class Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, keyset: Any, *args: Any) -> Any:
            with torch._C._AutoDispatchBelowAutograd():
                if forward is None:
                    out = op.redispatch(keyset & _BELOW_AUTOGRAD, *args)
                else:  # below autograd already: the call reaches its kernel or the modes
                    out = forward(*args)
            ctx.nargs = len(args)
            if setup_context is not None:  # it sees every argument, defaults filled in
                filled = tuple(spec.bind(args)[p.name] for p in spec.params)
                setup_context(ctx, filled, out)
            return out if forward is None else out[0]

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> tuple:
            grads = backward(ctx, *grads)
            grads = grads if isinstance(grads, tuple) else (grads,)
            return (None, *grads[:ctx.nargs])

    Function.__name__ = Function.__qualname__ = f"{spec.name}_backward"

    straight: dict[int, bool] = {}  # a keyset's bits -> whether nothing stands between the
    # Autograd key and the CUDA kernel (keyset arithmetic costs microseconds from Python)

    def kernel(keyset: Any, *args: Any) -> Any:
        if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
            if bump is not None:
                raise RuntimeError(f"torch.ops.ptxdsl.{spec.name} writes its inputs in place "
                                   "and has no backward: call it on tensors that do not "
                                   "require grad, or under torch.no_grad()")
            return Function.apply(keyset, *args)
        bits = keyset.raw_repr()
        direct = straight.get(bits)
        if direct is None:
            below = (keyset & _BELOW_AUTOGRAD).remove(_VIEWS)
            direct = straight[bits] = below.highestPriorityTypeId() == _CUDA
        if direct:
            out = cuda_impl(*args)
            if bump is not None:  # after the checks and the launch, as torch's in-place ops
                bump(args)
            return out
        with torch._C._AutoDispatchBelowAutograd():
            return op.redispatch(keyset & _BELOW_AUTOGRAD, *args)

    return kernel


def _no_backward(name: str) -> Callable[..., Any]:
    def backward(ctx: Any, *grads: Any) -> Any:
        raise RuntimeError(f"torch.ops.ptxdsl.{name} has no backward: call it on tensors that "
                           "do not require grad, or under torch.no_grad()")

    return backward
