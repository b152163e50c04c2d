"""The mixture-of-experts grouped fp8 GEMM with DeepGEMM's block scales as two torch ops
(ptxdsl/kernels/grouped_fp8.py's kernel): e4m3 inputs, f32 scales, bf16 output, each 128 of
K summed in the tensor cores and then added in f32 with its scales.

- `torch.ops.ptxdsl.grouped_mm_fp8(a, b, scale_a, scale_b, offs)`, the contiguous layout of
  `torch._grouped_mm`: a is T x K (the tokens of every expert, expert after expert), b is
  E x N x K (C_g = A_g @ B_g^T), offs the E int32 cumulative row ends, made safe on the
  device as `grouped_mm` makes them (ptxdsl/torch/grouped.py); the result is T x N, and rows
  past offs[E - 1] are not written.
- `torch.ops.ptxdsl.grouped_mm_fp8_masked(a, b, scale_a, scale_b, counts)`, decoding's
  layout: a is E x C x K (C rows a expert), counts the E int32 row counts on the GPU (a count
  over C stands for C, a negative one for 0); the result is E x C x N, and an expert's rows
  past its count are neither stored nor read into any stored row: they hold whatever the
  allocator left.

scale_a holds one f32 per row of a and 128 of K ((T, ceil(K / 128)), or (E, C, ceil(K /
128))), scale_b one per 128 x 128 block of each expert's weight ((E, ceil(N / 128), ceil(K /
128))); both row-major. The kernel reads A's scales K-block-major, as TMA brings 128 rows'
scales with each stage: each call copies them transposed into a [ceil(K / 128)][T rounded up
to 4] buffer (1 / 32 of a's bytes). The offsets and counts stay on the device (no
synchronisation), so both ops run inside CUDA graphs. Forward only."""

from __future__ import annotations

from functools import cache

import torch

from ..kernels.grouped_fp8 import SA_BOX
from ..kernels.wgmma import tma_shape_error
from ..runtime.launch import Kernel
from ..runtime.tensormap import TensorMap
from .dispatch import register
from .grouped import check_layout
from .kernels import bounds_kernel, grouped_fp8_kernel
from .opspec import Args, OpSpec, Run, TensorParam

BLOCK = 128  # rows, columns and K of a scale block


def _blocks(x: int) -> int:
    return -(-x // BLOCK)


def _check(a_rows: int, e: int, n: int, k: int, args: Args, rows: str) -> str | None:
    """What is wrong with the sizes (`a_rows` rows of A in all) and the scales' shapes."""
    sa, sb = args["scale_a"], args["scale_b"]
    if min(a_rows, e) < 1:
        return f"a must have rows and b experts, got a {tuple(args['a'].shape)} and b " \
            f"{tuple(args['b'].shape)}"
    problem = tma_shape_error(a_rows, n, k, in_bytes=1)  # M: the rows of a
    if problem is not None:
        return problem
    want_a = (*tuple(args["a"].shape[:-1]), _blocks(k))
    if tuple(sa.shape) != want_a:
        return (f"scale_a must hold one scale per row of a and 128 of K, ({rows}, ceil(K / "
                f"128)) = {want_a}, got {tuple(sa.shape)}")
    want_b = (e, _blocks(n), _blocks(k))
    if tuple(sb.shape) != want_b:
        return (f"scale_b must hold one scale per 128 x 128 block of each expert's weight, "
                f"(E, ceil(N / 128), ceil(K / 128)) = {want_b}, got {tuple(sb.shape)}")
    return None


def check_contiguous(args: Args) -> str | None:
    (t, k), (e, n, _) = args["a"].shape, args["b"].shape
    return check_layout(args) or _check(t, e, n, k, args, "T")


def check_masked(args: Args) -> str | None:
    a, b, counts = args["a"], args["b"], args["counts"]
    (ea, cap, k), (e, n, kb) = a.shape, b.shape
    if (ea, k) != (e, kb):
        return (f"a (E x C x K) and b (E x N x K) must have the same E and K, got a "
                f"{tuple(a.shape)} and b {tuple(b.shape)}")
    if counts.shape != (e,):
        return f"counts must hold one row count per expert ({e}), got shape {tuple(counts.shape)}"
    return _check(e * cap, e, n, k, args, "E, C")


@cache
def _loaded(device: int, masked: bool) -> tuple[Kernel, Kernel | None, int]:
    """The grouped fp8 GEMM and (contiguous layout) the offsets kernel loaded on `device`,
    and the SMs the GEMM's persistent grid covers (CTAs past the tile count find no work)."""
    kernel = grouped_fp8_kernel(masked).program().kernel(device=device)
    bounds = None if masked else bounds_kernel().program().kernel(device=device)
    return kernel, bounds, torch.cuda.get_device_properties(device).multi_processor_count


def _plan_of(masked: bool):
    def plan(args: Args, out: torch.Tensor, stream: int) -> Run:
        a, b = args["a"], args["b"]
        e, n, k = b.shape
        rows = a.numel() // k  # T, or E x C
        cap = a.shape[1] if masked else 0
        kb, pitch = _blocks(k), -(-rows // 4) * 4  # TMA: 16-byte rows of A's scales
        kernel, bounds_of, sms = _loaded(a.device.index, masked)
        a2, out2 = a.view(rows, k), out.view(rows, n)
        ma = TensorMap(a2, box=(128, 128), swizzle="128B")
        mb = TensorMap(b, box=(1, 128, 128), swizzle="128B")
        mc = TensorMap(out2, box=(64, 64), swizzle="128B")
        msa = TensorMap(a.new_empty((kb, pitch), dtype=torch.float32), box=(1, SA_BOX))

        def run(tensors: tuple, out: torch.Tensor, stream: int) -> None:
            ta, tb, sa, sb, offs = tensors
            # the scales K-block-major; columns past `rows` are read only for rows past
            # the end of A, which are never stored
            sat = sa.new_empty((kb, pitch))
            sat[:, :rows].copy_(sa.view(rows, kb).t())
            if bounds_of is None:  # masked: a negative count owns no rows (as a u32, all)
                groups = offs.clamp(min=0).view(torch.uint32)
            else:  # E + 1 non-decreasing offsets from 0 to at most T: no count can wrap
                groups = offs.new_empty(e + 1, dtype=torch.uint32)
                bounds_of[1, None, stream](offs, groups, e, rows)
            kernel[sms, None, stream](ma.at(ta.data_ptr()), mb.at(tb.data_ptr()),
                                      mc.at(out.data_ptr()), out, msa.at(sat.data_ptr()), sb,
                                      groups, e, cap, n, k, rows)

        return run

    return plan


def _params(rows: str, rank: int) -> tuple[TensorParam, ...]:
    fp8, f32 = (torch.float8_e4m3fn,), (torch.float32,)
    return (TensorParam(name="a", dtypes=fp8, rank=rank, layout="tma"),
            TensorParam(name="b", dtypes=fp8, rank=3, layout="tma"),
            # copied transposed at each call (scale_a) and read 4 bytes at a time (scale_b)
            TensorParam(name="scale_a", dtypes=f32, rank=rank, aligned=False),
            TensorParam(name="scale_b", dtypes=f32, rank=3, aligned=False),
            TensorParam(name=rows, dtypes=(torch.int32,), rank=1))


SPEC = OpSpec(
    name="grouped_mm_fp8",
    params=_params("offs", 2),
    check=check_contiguous,
    output=lambda args: ((args["a"].shape[0], args["b"].shape[1]), torch.bfloat16),
    plan=_plan_of(masked=False),
)

SPEC_MASKED = OpSpec(
    name="grouped_mm_fp8_masked",
    params=_params("counts", 3),
    check=check_masked,
    output=lambda args: ((*args["a"].shape[:2], args["b"].shape[1]), torch.bfloat16),
    plan=_plan_of(masked=True),
)

grouped_mm_fp8 = register(SPEC)
grouped_mm_fp8_masked = register(SPEC_MASKED)
