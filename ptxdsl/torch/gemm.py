"""`torch.ops.ptxdsl.gemm(a, b, residual=None)`: C = A @ B^T (+ R) in bf16 (A is M x K, B is
N x K, both with unit inner stride, R M x N contiguous; f32 accumulation), the library's
warp-specialised wgmma GEMM, its tile width, stage count, cluster pairing and walk
(data-parallel or stream-K) tuned per shape; up to SMALLM_MAX_M rows of A (decoding), the
swap-AB split-K kernel (gemm_smallm), its config (weight tile, warpgroups side by side,
cluster pairs, split-K waves) tuned per shape, which adds R as it stores C (a decoder block's
residual add fused into its o_proj and down_proj); from 128 rows on the dense kernel's
configs compete there too, and a deterministic split-K of K (gemm_splitk's two-kernel form,
`splitk_runner`) for the shapes whose tiles leave SMs idle. Past SMALLM_MAX_M rows, and for
the dense candidates, R is added by PyTorch after the GEMM (`unfused`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import torch

from ..compiler import KernelDef
from ..kernels import gemm_smallm, gemm_splitk
from ..kernels.wgmma import tma_shape_error
from ..runtime.driver import device_info
from ..runtime.launch import Kernel
from ..runtime.occupancy import resident_ctas, streamk_workspace, tile_grid
from ..runtime.tensormap import TensorMap
from ..swizzle import chunk_box
from ..tools.autotune import Autotuner
from ..types import bf16, e4m3
from . import autotune
from .dispatch import register
from .kernels import (
    GEMM_BM,
    GEMM_CONFIGS,
    SMALLM_MAX_M,
    SPLITK_CONFIGS,
    gemm_kernel,
    gemm_recipe,
    smallm_configs,
    smallm_fp8_kernel,
    smallm_kernel,
    smallm_recipe,
    smallm_tile,
    splitk_kernel,
    splitk_recipe,
    splitk_reduce_kernel,
)
from .opspec import Args, OpSpec, Run, TensorParam


def _kernel(config: Any) -> KernelDef:
    """The kernel of a dense config (GEMM_CONFIGS; of SPLITK_CONFIGS, the first of the
    two kernels: splitk_runner launches both)."""
    if config.get("splitk"):
        return splitk_kernel(config["stages"], config["cluster"])
    return gemm_kernel(config["bn"], config["stages"], config["cluster"],
                       config.get("streamk", 0))


def _recipe(config: Any) -> Any:
    if config.get("splitk"):
        return splitk_recipe(config["stages"], config["cluster"])
    return gemm_recipe(config["bn"], config["stages"], config["cluster"],
                       config.get("streamk", 0))


TUNER = autotune.tuner("ptxdsl::gemm", GEMM_CONFIGS, _recipe)


def check_operands(args: Args) -> str | None:
    """The checks of a GEMM of a (M x K) and b (N x K) into a bf16 C (M x N): every shape
    TMA addresses (a, b and C are each read or written by a map; `tma_shape_error`); a
    residual (where the op takes one) of C's shape."""
    a, b, r = args["a"], args["b"], args.get("residual")
    (m, k), (n, kb) = a.shape, b.shape
    if k != kb:
        return (f"a (M x K) and b (N x K) must have the same K, got a {tuple(a.shape)} "
                f"and b {tuple(b.shape)}")
    if r is not None and tuple(r.shape) != (m, n):
        return f"residual must be C's shape (M x N) = {(m, n)}, got {tuple(r.shape)}"
    return tma_shape_error(m, n, k, a.element_size())


def output_c(args: Args) -> tuple[tuple[int, ...], torch.dtype]:
    return (args["a"].shape[0], args["b"].shape[0]), torch.bfloat16


@cache
def launchable(kernel: Callable[[Any], KernelDef], config_items: tuple,
               device: int) -> tuple[Kernel, int]:
    """The loaded kernel `kernel(config)` of a persistent GEMM on `device` and the most CTAs
    it keeps resident."""
    config = dict(config_items)
    loaded = kernel(config).program().kernel(device=device)
    return loaded, resident_ctas(loaded, config["cluster"], device)


def persistent_grid(resident: int, m: int, n: int, bn: int, cluster: int) -> int:
    """The grid over M x N in 128 x bn tiles (`occupancy.tile_grid`)."""
    return tile_grid(resident, m, n, GEMM_BM, bn, cluster)


def _runner(config: Any, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Run:
    """The run of `config` over a, b and C's layouts: the maps are templates re-pointed at each
    call's addresses (a, b and C of the plan's shapes and strides)."""
    if config.get("splitk"):
        return splitk_runner(config, a, b)
    kernel, resident = launchable(_kernel, tuple(config.items()), a.device.index)
    bn, cluster = config["bn"], config["cluster"]
    m, k = a.shape
    n = b.shape[0]
    ta = TensorMap(a, box=(GEMM_BM, 64), swizzle="128B")
    tb = TensorMap(b, box=(bn // cluster, 64), swizzle="128B")
    cbox, cswizzle = chunk_box(64, bn, 2)  # the kernel's C chunks (make_gemm)
    tc = TensorMap(c, box=cbox, swizzle=cswizzle)
    if not config.get("streamk"):
        grid = persistent_grid(resident, m, n, bn, cluster)

        def run(tensors: tuple, out: torch.Tensor, stream: int) -> None:
            x, w = tensors[:2]  # then gemm's residual (None where absent)
            kernel[grid, None, stream](ta.at(x.data_ptr()), tb.at(w.data_ptr()),
                                       tc.at(out.data_ptr()), m, n, k)

        return run
    # stream-K over every resident CTA: f32 slots for the parts of shared tiles and a
    # semaphore per warpgroup and shared tile, zero before the launch; both fresh each call
    # and allocated on torch's current stream, the launch's (its allocator orders their
    # reuse after it)
    size, nsem, slots = streamk_workspace(m, n, k, resident, GEMM_BM, bn)

    def run_streamk(tensors: tuple, out: torch.Tensor, stream: int) -> None:
        x, w = tensors[:2]
        ws = x.new_empty(size, dtype=torch.float32)
        sem = x.new_zeros(nsem, dtype=torch.uint32)
        kernel[resident, None, stream](ta.at(x.data_ptr()), tb.at(w.data_ptr()),
                                       tc.at(out.data_ptr()), m, n, k, ws, sem, slots)

    return run_streamk


def splitk_plan(m: int, n: int, k: int, resident: int, cluster: int = 1
                ) -> tuple[int, int]:
    """The ranges a tile's K is cut into and the grid of the split-K kernel over M x N x K
    with `resident` CTAs: as many ranges as fill them once, each of four K steps or more
    (gemm_splitk.pick_splits), at most one CTA an SM. Every tile has that many ranges, so
    every slot of the workspace is written."""
    splits = gemm_splitk.pick_splits(m, n, k, resident)
    return splits, gemm_splitk.launch_grid(m, n, k, splits, sms=resident, cluster=cluster)


@cache
def _reduce(device: int) -> Kernel:
    return splitk_reduce_kernel().program().kernel(device=device)


def splitk_runner(config: Any, a: torch.Tensor, b: torch.Tensor) -> Run:
    """The split-K two-kernel form of `config` (SPLITK_CONFIGS) over a's and b's layouts:
    range s of every tile stores its f32 partial into slot s of a splits x M x N workspace,
    and the second kernel sums the slots in slot order into C (contiguous, as the op
    allocates it): bit-identical repeats. The workspace is fresh each call on torch's
    current stream (the launch's; its allocator orders the reuse after it, and under CUDA
    graph capture it comes from the graph's pool). No semaphores and nothing to zero: every
    slot is rewritten by each launch (the kernel's semaphore, read-back pointer and C
    arguments are unused in this form). Raises ValueError where a tile would get one range
    (its tiles fill the SMs, or K is short): the dense configs run that without the slots'
    round trip, and the tuner skips a candidate that raises."""
    device = a.device.index
    kernel, resident = launchable(_kernel, tuple(config.items()), device)
    cluster = config["cluster"]
    m, k = a.shape
    n = b.shape[0]
    splits, grid = splitk_plan(m, n, k, resident, cluster)
    if splits == 1:
        raise ValueError(f"gemm: split-K of {m} x {n} x {k} over {resident} CTAs takes one "
                         f"range a tile: no split-K candidate at this shape")
    reduce = _reduce(device)
    ta = TensorMap(a, box=(gemm_splitk.BM, gemm_splitk.BK), swizzle="128B")
    tb = TensorMap(b, box=(gemm_splitk.BN // cluster, gemm_splitk.BK), swizzle="128B")
    slots = (splits, m, n)
    # a template for the map's layout; each call's workspace re-points it
    tw = TensorMap(a.new_empty(slots, dtype=torch.float32), box=(1, 64, gemm_splitk.PART),
                   swizzle="128B")
    total = m * n  # a multiple of 8: TMA's 16-byte rows of bf16 C
    sums = -(-total // 1024)  # the reduction's CTAs: 256 threads of four elements

    def run(tensors: tuple, out: torch.Tensor, stream: int) -> None:
        x, w = tensors[:2]
        ws = x.new_empty(slots, dtype=torch.float32)
        kernel[grid, None, stream](ta.at(x.data_ptr()), tb.at(w.data_ptr()),
                                   tw.at(ws.data_ptr()), ws, out, ws.view(torch.uint32),
                                   m, n, k, splits, 0)
        reduce[sums, None, stream](ws, out, total, splits)

    return run


def dense_config(a: torch.Tensor, b: torch.Tensor, stream: int) -> Any:
    """The dense kernel's config for C = a @ b^T, tuned (trials on `stream`) at the first
    call of its shape."""
    m, k = a.shape
    n = b.shape[0]

    def trial(config: Any) -> torch.Tensor:
        c = a.new_empty((m, n))
        _runner(config, a, b, c)((a, b), c, stream)
        return c

    # M is rounded up to a power of two: batch sizes vary, the best tiling barely does; the
    # stream-K config's worth does, with the last wave's fill, so that goes in the key too
    shape = (1 << (m - 1).bit_length(), n, k, wave_fill(m, n, a.device.index))
    return TUNER.choose(shape, trial, autotune.close(2**-6), device=a.device.index,
                        tune=autotune.tuning_allowed())


def unfused(config: Any, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
            epilogue: str | None) -> Run:
    """The dense kernel's run of `config` with the decode kernel's `epilogue` done after it
    by PyTorch (on the launch's stream, torch's current one): "residual" adds the run's
    third tensor to C; "silu_mul" computes C of the interleaved gate-up weight into a
    temporary and stores silu(gate) * up (`silu_mul`). Past SMALLM_MAX_M rows and for the
    dense candidates of a fused decode op's tuning."""
    if epilogue is None:
        return _runner(config, a, b, out)
    full = (a.shape[0], b.shape[0])
    run = _runner(config, a, b, a.new_empty(full))  # its C map re-pointed at each call's

    def run_then(tensors: tuple, out: torch.Tensor, stream: int) -> None:
        x, w, *residual = tensors
        if epilogue == "residual":
            run((x, w), out, stream)
            out.add_(residual[0])
        else:
            c = x.new_empty(full)
            run((x, w), c, stream)
            out.copy_(silu_mul(c))

    return run_then


def silu_mul(c: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of C over the interleaved gate-up weight (gemm_smallm
    .interleave_gate_up): C's columns are groups of gate outputs, each followed by the same
    outputs' up; f32 math, bf16 out, N / 2 columns."""
    m, n = c.shape
    g = gemm_smallm.GATE_UP_GROUP
    pairs = c.view(m, n // (2 * g), 2, g).float()
    return (torch.nn.functional.silu(pairs[:, :, 0]) * pairs[:, :, 1]).to(c.dtype).view(
        m, n // 2)


def wave_fill(m: int, n: int, device: int) -> int:
    """How full the last wave of 128 x 256 tiles is, in eighths (0: the waves come out
    even): what decides whether a stream-K walk pays."""
    sms = device_info(device).sm_count
    tiles = -(-m // GEMM_BM) * -(-n // 256)
    return 0 if tiles % sms == 0 else 1 + (tiles % sms) * 8 // sms


def decode_candidates(mp: int) -> tuple[dict[str, int], ...]:
    """The candidates for up to mp rows of A: the decode kernel's, and from 128 rows on, where
    the work nears the tensor cores' rate, the dense GEMM's as well, data-parallel, on a
    stream-K walk, and split-K (SPLITK_CONFIGS: deterministic, for tiles too few to fill
    the SMs)."""
    return smallm_configs(mp) + (GEMM_CONFIGS + SPLITK_CONFIGS if mp >= 128 else ())


@cache
def smallm_tuner(mp: int, epilogue: str | None = None) -> Autotuner:
    """The tuner for up to mp rows of A (with the decode kernel's fused `epilogue`, which the
    dense candidates do after their GEMM: `unfused`), timing each candidate from a CUDA
    graph (a decode GEMM takes microseconds, less than an eager launch)."""
    fused = f"{epilogue}_" if epilogue else ""
    return autotune.tuner(f"ptxdsl::gemm_smallm_{fused}m{mp}", decode_candidates(mp),
                          lambda c: _recipe(c) if "bn" in c else
                          smallm_recipe(smallm_tile(mp, c), c["bw"], c.get("cols", 1),
                                        c.get("cluster", 1), epilogue),
                          timer=autotune.graph_timer)


_SEMAPHORES: dict[tuple[int, int], torch.Tensor] = {}
_OUTGROWN: list[torch.Tensor] = []  # buffers graphs captured earlier may still point at


def semaphores(device: int, stream: int, size: int) -> torch.Tensor:
    """The decode kernel's split-K semaphores for launches on one stream (which run in turn):
    zeroed once and left zero by every launch. A launch that needs more gets a buffer twice
    as large; the smaller one is kept, never freed (a captured CUDA graph may still use it)."""
    held = _SEMAPHORES.get((device, stream))
    if held is None or len(held) < size:
        with torch.cuda.stream(torch.cuda.ExternalStream(stream, device=device)):
            grown = torch.zeros(max(size, 2 * len(held) if held is not None else 0),
                                device=device, dtype=torch.uint32)
        if held is not None:
            _OUTGROWN.append(held)
        _SEMAPHORES[(device, stream)] = held = grown
    return held


def _smallm_kernel(config: Any) -> KernelDef:
    wide = config["cols"], config["cluster"]
    if "scales" in config:
        return smallm_fp8_kernel(config["mp"], config["bw"], config["scales"], *wide)
    return smallm_kernel(config["mp"], config["bw"], *wide, config.get("epilogue"))


def overlap_error(r: torch.Tensor, c: torch.Tensor) -> str | None:
    """What is wrong with a residual R whose memory overlaps C's: the kernel's threads read
    R while others store C, so an overlap would read outputs already stored."""
    r0, c0 = r.data_ptr(), c.data_ptr()
    if r0 < c0 + c.numel() * c.element_size() and c0 < r0 + r.numel() * r.element_size():
        return (f"the residual (0x{r0:x}, {tuple(r.shape)}) must not overlap C "
                f"(0x{c0:x}, {tuple(c.shape)}): pass a copy")
    return None


def smallm_runner(config: Any, mp: int, a: torch.Tensor, b: torch.Tensor,
                  scales: str | None = None, epilogue: str | None = None) -> Run:
    """The run of the decode kernel's `config` (bw; cols, cluster, waves: 1 if absent) in the
    bucket of mp rows over a's and b's layouts, in activation tiles of smallm_tile rows: an
    f32 slot workspace fresh each call (on torch's current stream, the launch's) and the
    stream's semaphores. `scales` ("tensor" or "row"): the e4m3 kernel, its scale tensors the
    run's third and fourth. `epilogue` (gemm_smallm.EPILOGUES): "residual" adds the run's
    third tensor (refused where it overlaps C: `overlap_error`); "silu_mul" stores
    silu(gate) * up of the interleaved gate-up weight b, C of N / 2 columns."""
    bw, cols, waves = config["bw"], config.get("cols", 1), config.get("waves", 1)
    cluster = config.get("cluster", 1)
    m, k = a.shape
    n = b.shape[0]
    device = a.device.index
    fp8 = (("scales", scales),) if scales else ()
    fused = (("epilogue", epilogue),) if epilogue else ()
    mp = smallm_tile(mp, config, e4m3 if scales else bf16)
    kernel, resident = launchable(_smallm_kernel, (("bw", bw), ("cluster", cluster),
                                                   ("cols", cols), ("mp", mp), *fp8, *fused),
                                  device)
    bk = gemm_smallm.BK_FP8 if scales else gemm_smallm.BK
    splits = gemm_smallm.pick_splits(m, n, k, bw, mp, resident, bk, waves, cluster)
    size, nsem = gemm_smallm.workspace(m, n, k, bw, mp, splits, bk, cols, cluster)
    tw = TensorMap(b, box=(bw, bk), swizzle="128B")
    tx = TensorMap(a, box=(mp // cluster, bk), swizzle="128B")  # a pair's CTA loads half
    grid = gemm_smallm.launch_grid(m, n, k, bw, mp, splits, resident, bk, cluster)
    ntensors = 4 if scales else 3 if epilogue == "residual" else 2  # (gemm's may add None)

    def run(tensors: tuple, out: torch.Tensor, stream: int) -> None:
        x, w, *extra = tensors[:ntensors]  # the scales, or the residual
        if epilogue == "residual" and (problem := overlap_error(extra[0], out)):
            raise ValueError(f"gemm: {problem}")
        ws = x.new_empty(size, dtype=torch.float32)
        sem = semaphores(device, stream, nsem)
        kernel[grid, None, stream](tw.at(w.data_ptr()), tx.at(x.data_ptr()), out, ws, sem,
                                   *extra, m, n, k, splits)

    return run


def smallm_plan(tensors: tuple, out: torch.Tensor, mp: int, tuner: Autotuner,
                dense: Callable[[Any, torch.Tensor], Run] | None = None,
                scales: str | None = None, epilogue: str | None = None) -> Run:
    """The plan for few rows of A (tensors: a, b and any scales or residual) in activation
    tiles of mp rows: `tuner`'s choice at (mp, N, K) among the decode kernel's configs
    (`scales` and `epilogue` as smallm_runner takes them) and, where `dense(config, c)` runs
    them, the dense kernel's (those with "bn")."""
    a, b = tensors[:2]
    n, k = b.shape

    def runner(config: Any, c: torch.Tensor) -> Run:
        if "bn" in config and dense is not None:
            return dense(config, c)
        return smallm_runner(config, mp, a, b, scales, epilogue)

    def trial(config: Any) -> torch.Tensor:
        # on the current stream, which graph_timer's capture makes its own
        c = torch.empty_like(out)
        runner(config, c)(tensors, c, torch.cuda.current_stream(a.device).cuda_stream)
        return c

    config = tuner.choose((mp, n, k), trial, autotune.close(2**-6), device=a.device.index,
                          tune=autotune.tuning_allowed())
    return runner(config, out)


def fused_plan(args: Args, out: torch.Tensor, stream: int, epilogue: str | None) -> Run:
    """The plan of a GEMM of args' a and b with the decode kernel's `epilogue` (or none):
    the decode kernel's up to SMALLM_MAX_M rows, else the dense kernel's and the epilogue in
    PyTorch."""
    a, b, r = args["a"], args["b"], args.get("residual")
    tensors = (a, b) if r is None else (a, b, r)
    if a.shape[0] <= SMALLM_MAX_M:
        mp = gemm_smallm.pad_m(a.shape[0])
        return smallm_plan(tensors, out, mp, smallm_tuner(mp, epilogue),
                           lambda config, c: unfused(config, a, b, c, epilogue),
                           epilogue=epilogue)
    return unfused(dense_config(a, b, stream), a, b, out, epilogue)


def _plan(args: Args, out: torch.Tensor, stream: int) -> Run:
    return fused_plan(args, out, stream, None if args["residual"] is None else "residual")


SPEC = OpSpec(
    name="gemm",
    params=(
        TensorParam(name="a", dtypes=(torch.bfloat16,), rank=2, layout="tma"),
        TensorParam(name="b", dtypes=(torch.bfloat16,), rank=2, layout="tma"),
        TensorParam(name="residual", dtypes=(torch.bfloat16,), rank=2, optional=True,
                    aligned=False),  # read an element at a time
    ),
    check=check_operands,
    output=output_c,
    plan=_plan,
)

gemm = register(SPEC)
