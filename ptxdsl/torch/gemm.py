"""`torch.ops.ptxdsl.gemm(a, b)`: C = A @ B^T in bf16 (A is M x K, B is N x K, both with
unit inner stride; f32 accumulation), the library's warp-specialised wgmma GEMM, its tile
width, stage count, cluster pairing and walk (data-parallel or stream-K) tuned per shape; up
to SMALLM_MAX_M rows of A (decoding), the swap-AB split-K kernel (gemm_smallm), its config
(weight tile, warpgroups side by side, cluster pairs, split-K waves) tuned per shape."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import torch

from ..compiler import KernelDef
from ..kernels import gemm_smallm
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
    gemm_kernel,
    gemm_recipe,
    smallm_configs,
    smallm_fp8_kernel,
    smallm_kernel,
    smallm_recipe,
    smallm_tile,
)
from .opspec import Args, OpSpec, Run, TensorParam


def _kernel(config: Any) -> KernelDef:
    return gemm_kernel(config["bn"], config["stages"], config["cluster"],
                       config.get("streamk", 0))


def _recipe(config: Any) -> Any:
    return gemm_recipe(config["bn"], config["stages"], config["cluster"],
                       config.get("streamk", 0))


TUNER = autotune.tuner("ptxdsl::gemm", GEMM_CONFIGS, _recipe)


def check_operands(args: Args) -> str | None:
    """The checks of a GEMM of a (M x K) and b (N x K) into a bf16 C (M x N): every shape
    TMA addresses (a, b and C are each read or written by a map; `tma_shape_error`)."""
    a, b = args["a"], args["b"]
    (m, k), (n, kb) = a.shape, b.shape
    if k != kb:
        return (f"a (M x K) and b (N x K) must have the same K, got a {tuple(a.shape)} "
                f"and b {tuple(b.shape)}")
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
            x, w = tensors
            kernel[grid, None, stream](ta.at(x.data_ptr()), tb.at(w.data_ptr()),
                                       tc.at(out.data_ptr()), m, n, k)

        return run
    # stream-K over every resident CTA: f32 slots for the parts of shared tiles and a
    # semaphore per warpgroup and shared tile, zero before the launch; both fresh each call
    # and allocated on torch's current stream, the launch's (its allocator orders their
    # reuse after it)
    size, nsem, slots = streamk_workspace(m, n, k, resident, GEMM_BM, bn)

    def run_streamk(tensors: tuple, out: torch.Tensor, stream: int) -> None:
        x, w = tensors
        ws = x.new_empty(size, dtype=torch.float32)
        sem = x.new_zeros(nsem, dtype=torch.uint32)
        kernel[resident, None, stream](ta.at(x.data_ptr()), tb.at(w.data_ptr()),
                                       tc.at(out.data_ptr()), m, n, k, ws, sem, slots)

    return run_streamk


def wave_fill(m: int, n: int, device: int) -> int:
    """How full the last wave of 128 x 256 tiles is, in eighths (0: the waves come out
    even): what decides whether a stream-K walk pays."""
    sms = device_info(device).sm_count
    tiles = -(-m // GEMM_BM) * -(-n // 256)
    return 0 if tiles % sms == 0 else 1 + (tiles % sms) * 8 // sms


def decode_candidates(mp: int) -> tuple[dict[str, int], ...]:
    """The candidates for up to mp rows of A: the decode kernel's, and from 128 rows on, where
    the work nears the tensor cores' rate, the dense GEMM's as well."""
    return smallm_configs(mp) + (GEMM_CONFIGS if mp >= 128 else ())


@cache
def smallm_tuner(mp: int) -> Autotuner:
    """The tuner for up to mp rows of A, timing each candidate from a CUDA graph (a decode
    GEMM takes microseconds, less than an eager launch)."""
    return autotune.tuner(f"ptxdsl::gemm_smallm_m{mp}", decode_candidates(mp),
                          lambda c: _recipe(c) if "bn" in c else
                          smallm_recipe(smallm_tile(mp, c), c["bw"], c.get("cols", 1),
                                        c.get("cluster", 1)),
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
    return smallm_kernel(config["mp"], config["bw"], *wide)


def smallm_runner(config: Any, mp: int, a: torch.Tensor, b: torch.Tensor,
                  scales: str | None = None) -> Run:
    """The run of the decode kernel's `config` (bw; cols, cluster, waves: 1 if absent) in the
    bucket of mp rows over a's and b's layouts, in activation tiles of smallm_tile rows: an
    f32 slot workspace fresh each call (on torch's current stream, the launch's) and the
    stream's semaphores. `scales` ("tensor" or "row"): the e4m3 kernel, its scale tensors the
    run's third and fourth."""
    bw, cols, waves = config["bw"], config.get("cols", 1), config.get("waves", 1)
    cluster = config.get("cluster", 1)
    m, k = a.shape
    n = b.shape[0]
    device = a.device.index
    fp8 = (("scales", scales),) if scales else ()
    mp = smallm_tile(mp, config, e4m3 if scales else bf16)
    kernel, resident = launchable(_smallm_kernel, (("bw", bw), ("cluster", cluster),
                                                   ("cols", cols), ("mp", mp), *fp8), device)
    bk = gemm_smallm.BK_FP8 if scales else gemm_smallm.BK
    splits = gemm_smallm.pick_splits(m, n, k, bw, mp, resident, bk, waves, cluster)
    size, nsem = gemm_smallm.workspace(m, n, k, bw, mp, splits, bk, cols, cluster)
    tw = TensorMap(b, box=(bw, bk), swizzle="128B")
    tx = TensorMap(a, box=(mp // cluster, bk), swizzle="128B")  # a pair's CTA loads half
    grid = gemm_smallm.launch_grid(m, n, k, bw, mp, splits, resident, bk, cluster)

    def run(tensors: tuple, out: torch.Tensor, stream: int) -> None:
        x, w, *scale = tensors
        ws = x.new_empty(size, dtype=torch.float32)
        sem = semaphores(device, stream, nsem)
        kernel[grid, None, stream](tw.at(w.data_ptr()), tx.at(x.data_ptr()), out, ws, sem,
                                   *scale, m, n, k, splits)

    return run


def smallm_plan(tensors: tuple, out: torch.Tensor, mp: int, tuner: Autotuner,
                dense: Callable[[Any, torch.Tensor], Run] | None = None,
                scales: str | None = None) -> Run:
    """The plan for few rows of A (tensors: a, b and any scales) in activation tiles of mp
    rows: `tuner`'s choice at (mp, N, K) among the decode kernel's configs (`scales` as
    smallm_runner takes it) and, where `dense(config, c)` runs them, the dense kernel's
    (those with "bn")."""
    a, b = tensors[:2]
    n, k = b.shape

    def runner(config: Any, c: torch.Tensor) -> Run:
        if "bn" in config and dense is not None:
            return dense(config, c)
        return smallm_runner(config, mp, a, b, scales)

    def trial(config: Any) -> torch.Tensor:
        # on the current stream, which graph_timer's capture makes its own
        c = torch.empty_like(out)
        runner(config, c)(tensors, c, torch.cuda.current_stream(a.device).cuda_stream)
        return c

    config = tuner.choose((mp, n, k), trial, autotune.close(2**-6), device=a.device.index,
                          tune=autotune.tuning_allowed())
    return runner(config, out)


def _plan(args: Args, out: torch.Tensor, stream: int) -> Run:
    a, b = args["a"], args["b"]
    m, k = a.shape
    n = b.shape[0]
    if m <= SMALLM_MAX_M:
        mp = gemm_smallm.pad_m(m)
        return smallm_plan((a, b), out, mp, smallm_tuner(mp),
                           lambda config, c: _runner(config, a, b, c))

    def trial(config: Any) -> torch.Tensor:
        c = torch.empty_like(out)
        _runner(config, a, b, c)((a, b), c, stream)
        return c

    # M is rounded up to a power of two: batch sizes vary, the best tiling barely does; the
    # stream-K config's worth does, with the last wave's fill, so that goes in the key too
    shape = (1 << (m - 1).bit_length(), n, k, wave_fill(m, n, a.device.index))
    config = TUNER.choose(shape, trial, autotune.close(2**-6), device=a.device.index,
                          tune=autotune.tuning_allowed())
    return _runner(config, a, b, out)


SPEC = OpSpec(
    name="gemm",
    params=(
        TensorParam(name="a", dtypes=(torch.bfloat16,), rank=2, layout="tma"),
        TensorParam(name="b", dtypes=(torch.bfloat16,), rank=2, layout="tma"),
    ),
    check=check_operands,
    output=output_c,
    plan=_plan,
)

gemm = register(SPEC)
