"""The kernel families behind the torch ops, and the configs each may be tuned over.

The kernels are the library's (ptxdsl.kernels.gemm `make_gemm`, ptxdsl.kernels.gemm_smallm
`make_smallm`, bf16 and e4m3, ptxdsl.kernels.gemm_splitk `make_splitk` and
`make_splitk_reduce`, ptxdsl.kernels.gemm_fp8 `make_gemm_fp8`, ptxdsl.kernels.attention
`make_attention`, ptxdsl.kernels.attention_fp8 `make_attention_fp8`,
ptxdsl.kernels.attention_bwd `make_attention_bwd`, `make_preprocess` and `make_finish`,
ptxdsl.kernels.decode_attention `make_decode_attention`,
ptxdsl.kernels.kv_append `make_kv_append`,
ptxdsl.kernels.grouped_gemm `make_grouped`, ptxdsl.kernels.grouped_fp8 `make_grouped_fp8`,
ptxdsl.kernels.norms `make_norm_row`, `make_norm_masked` and `make_norm_loop`), built as
`ptxdsl.tools.precompile.Recipe`s, so that tuning builds them in parallel processes, and the
ops run the kernels that the library's tests and benchmarks check. This module does not import
torch (the norms' ops and launch grid are in ptxdsl/torch/norms.py)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from .. import types as T
from ..compiler import KernelDef
from ..kernels.gemm_smallm import max_mp
from ..tools.precompile import Recipe

# gemm: (bn, stages) pairs whose shared memory fits a CTA (bm = 128: bn 256 and 224 hold 3
# stages, bn 128 up to 6), each with and without a 2 x 1 cluster; the default (first) is the
# benchmarked 128 x 256 x 64, 3-stage kernel; last, that kernel on a stream-K walk (the
# tiles of a partial last wave shared K step by K step over every SM). 224-wide tiles store C
# in 32-column chunks and fill 128 SMs where 256-wide leave 20 idle (decoding: 256 x 14336).
GEMM_CONFIGS: tuple[dict[str, int], ...] = tuple(
    {"bn": bn, "stages": stages, "cluster": cluster}
    for bn, stages in ((256, 3), (224, 3), (128, 3), (128, 4), (128, 6))
    for cluster in (1, 2)
) + ({"bn": 256, "stages": 3, "cluster": 1, "streamk": 1},)
GEMM_BM = 128

# gemm at 128 to SMALLM_MAX_M rows (decoding), beside the configs above: the split-K kernel's
# two-kernel form (ptxdsl.kernels.gemm_splitk `make_splitk(slots=True)`, then
# `make_splitk_reduce`), K cut into as many ranges as fill the SMs once with 128 x 256 tiles.
# Each range stores its f32 partial into a slot of its own and the second kernel sums the
# slots in slot order: deterministic, with no semaphores (the one-kernel forms' need zeroed
# semaphores; the ordered one serialises a tile's ranges). Where data-parallel tiles leave
# most SMs idle: M 256 x N 4096 is 32 tiles for 132 SMs.
SPLITK_CONFIGS: tuple[dict[str, int], ...] = (
    {"bn": 256, "stages": 4, "cluster": 1, "splitk": 1},
)
_SPLITK = "ptxdsl.kernels.gemm_splitk"


def splitk_recipe(stages: int, cluster: int) -> Recipe:
    """The first kernel of the two-kernel split-K: each range's partial into its slot."""
    more = {"cluster": cluster} if cluster > 1 else {}
    return Recipe.of(_SPLITK, "make_splitk", stages=stages, slots=True, **more)


@cache
def splitk_kernel(stages: int, cluster: int) -> KernelDef:
    return splitk_recipe(stages, cluster).build()


@cache
def splitk_reduce_kernel() -> KernelDef:
    """The second kernel of the two-kernel split-K: the slots summed in order into C."""
    return Recipe.of(_SPLITK, "make_splitk_reduce").build()


# gemm at M <= SMALLM_MAX_M (decoding): the swap-AB split-K kernel (ptxdsl.kernels.gemm_smallm),
# tuned per bucket of M (mp: M rounded up to a power of two from 8) over weight tiles of 128
# rows (the default), 64, or 256, with the deepest ring that fits. A config's activation tile
# is mp, or the tallest its registers hold where that is half of mp (M then takes two tiles,
# each reading the weights: `smallm_tile`). From SMALLM_WIDE_MP rows on, where the SMs' fill
# and the weight reads decide: two consumer warpgroups side by side over the activation tile
# ("cols": 2; 256 rows in one tile, e4m3 too), 2-CTA cluster pairs of weight tiles sharing
# the activation tile by multicast ("cluster": 2; half the activation reads from L2), and
# twice the split-K ranges ("waves": 2, a launch parameter: the SMs walk two work items each,
# so one's slot sum runs while the ring loads the next's stages).
SMALLM_MAX_M = 256
SMALLM_MPS = (8, 16, 32, 64, 128, 256)
SMALLM_WIDE_MP = 64
SMALLM_CONFIGS: tuple[dict[str, int], ...] = (
    {"bw": 128}, {"bw": 64}, {"bw": 256},
    {"bw": 64, "cols": 2}, {"bw": 128, "cols": 2}, {"bw": 256, "cols": 2},
    {"bw": 128, "waves": 2}, {"bw": 64, "waves": 2}, {"bw": 64, "cols": 2, "waves": 2},
    {"bw": 128, "cluster": 2}, {"bw": 64, "cols": 2, "cluster": 2},
    {"bw": 128, "cols": 2, "cluster": 2},
)


def smallm_tile(mp: int, config: Mapping[str, Any], dtype: T.Scalar = T.bf16) -> int:
    """The activation tile of decode `config` in the bucket of mp rows of `dtype`: mp, or the
    tallest whose accumulators fit its registers (gemm_smallm.max_mp; 0: none fits)."""
    return min(mp, max_mp(config["bw"], dtype, config.get("cols", 1), config.get("cluster", 1)))


def smallm_configs(mp: int, dtype: T.Scalar = T.bf16) -> tuple[dict[str, int], ...]:
    """The decode kernel's configs for the bucket of mp rows of `dtype`: those whose tile
    holds mp rows or half of them (`smallm_tile`), and below SMALLM_WIDE_MP rows only the
    plain weight tiles."""
    return tuple(c for c in SMALLM_CONFIGS if 2 * smallm_tile(mp, c, dtype) >= mp
                 and (mp >= SMALLM_WIDE_MP or c.keys() == {"bw"}))


def _wide(cols: int, cluster: int) -> dict[str, int]:
    """make_smallm's `cols` and `cluster` where they are not the default (the default
    builds' recipes are what they were before them)."""
    return {name: v for name, v in (("cols", cols), ("cluster", cluster)) if v > 1}


def smallm_recipe(mp: int, bw: int, cols: int = 1, cluster: int = 1,
                  epilogue: str | None = None) -> Recipe:
    """The decode GEMM C = A @ W^T for up to mp rows of A, over bw-row weight tiles, with
    `cols` consumer warpgroups side by side over the activation tile, in `cluster` pairs,
    with a fused `epilogue` ("residual" or "silu_mul": gemm_smallm.EPILOGUES) or none."""
    fused = {"epilogue": epilogue} if epilogue else {}
    return Recipe.of("ptxdsl.kernels.gemm_smallm", "make_smallm", mp=mp, bw=bw,
                     **_wide(cols, cluster), **fused)


# scaled_mm_fp8 at M <= SMALLM_MAX_M: the e4m3 decode GEMM (the same kernel with fp8
# operands, K = 128 per stage, each stage's sums promoted into f32 registers), over the bf16
# one's configs where its registers allow (smallm_configs(mp, e4m3)): one warpgroup's tile
# holds up to 128 rows, so at 129 to 256 rows the plain weight tiles take two activation
# tiles and bw 64 with two warpgroups side by side one. Per scale mode: "tensor"
# (torch._scaled_mm's per-tensor scales, one-element f32 tensors; the op's) or "row" (per
# token of A, per output channel of W).
SMALLM_FP8_SCALES = ("tensor", "row")


def smallm_fp8_recipe(mp: int, bw: int, scales: str, cols: int = 1,
                      cluster: int = 1) -> Recipe:
    """The decode GEMM C = scales x A @ W^T of e4m3 A (up to mp rows) and W (bw-row tiles),
    `cols` and `cluster` as smallm_recipe takes them."""
    return Recipe.of("ptxdsl.kernels.gemm_smallm", "make_smallm", mp=mp, bw=bw,
                     dtype=T.e4m3, scales=scales, **_wide(cols, cluster))


# scaled_mm_fp8 (per-tensor scales, K = 128 per stage): the benchmarked 128 x 256, 3-stage
# kernel first, then 128 x 128 with 6 stages (both fill the shared memory), each with and
# without a 2 x 1 cluster.
FP8_CONFIGS: tuple[dict[str, int], ...] = tuple(
    {"bn": bn, "stages": stages, "cluster": cluster}
    for bn, stages in ((256, 3), (128, 6))
    for cluster in (1, 2)
)


def gemm_recipe(bn: int, stages: int, cluster: int, streamk: int = 0) -> Recipe:
    """The bf16 GEMM C = A @ B^T with 128 x bn x 64 tiles (`streamk`: on a stream-K walk)."""
    more = {"streamk": True} if streamk else {}
    return Recipe.of("ptxdsl.kernels.gemm", "make_gemm", bm=GEMM_BM, bn=bn, stages=stages,
                     cluster=(cluster, 1, 1), **more)


# The *_kernel functions are memoised although Recipe.build keeps one KernelDef per recipe:
# they are on every op call's path, and a cache hit skips building the recipe.


@cache
def gemm_kernel(bn: int, stages: int, cluster: int, streamk: int = 0) -> KernelDef:
    return gemm_recipe(bn, stages, cluster, streamk).build()


@cache
def smallm_kernel(mp: int, bw: int, cols: int = 1, cluster: int = 1,
                  epilogue: str | None = None) -> KernelDef:
    return smallm_recipe(mp, bw, cols, cluster, epilogue).build()


@cache
def smallm_fp8_kernel(mp: int, bw: int, scales: str, cols: int = 1,
                      cluster: int = 1) -> KernelDef:
    return smallm_fp8_recipe(mp, bw, scales, cols, cluster).build()


# attention: head dims the sample builds; per (head dim, causal) the warpgroups take turns or
# not, the wait for P V is held after the softmax (fence_cta) or not, and at head dim 64 three
# consumer warpgroups (192-row tiles) or two; first (what runs untuned, e.g. while a CUDA
# graph is captured) the benchmark's fastest: the hold, no turns, and at head dim 64 three
# warpgroups (BENCHMARKS.md)
ATTENTION_HEAD_DIMS = (64, 128)


def attention_configs(d: int) -> tuple[dict[str, int], ...]:
    two = ({"pingpong": 0, "hold": 1, "nwg": 2}, {"pingpong": 0, "hold": 0, "nwg": 2},
           {"pingpong": 1, "hold": 0, "nwg": 2})
    return ({"pingpong": 0, "hold": 1, "nwg": 3}, *two) if d == 64 else two


def attention_recipe(d: int, causal: bool, pingpong: int, hold: int, nwg: int = 2,
                     window: bool = False, varlen: bool = False, softcap: bool = False
                     ) -> Recipe:
    """The forward attention of head dim d (ptxdsl.kernels.attention `make_attention`);
    `window`: its sliding-window build (the window given at launch; not also causal);
    `varlen`: its build for packed sequences (cu_seqlens); `softcap`: its scores capped."""
    more = _flags(window=window, varlen=varlen, softcap=softcap)
    return Recipe.of("ptxdsl.kernels.attention", "make_attention", d=d, causal=bool(causal),
                     pingpong=bool(pingpong), hold=bool(hold), nwg=nwg, **more)


@cache
def attention_kernel(d: int, causal: bool, pingpong: int, hold: int, nwg: int = 2,
                     window: bool = False, varlen: bool = False, softcap: bool = False
                     ) -> KernelDef:
    return attention_recipe(d, causal, pingpong, hold, nwg, window, varlen, softcap).build()


def _flags(**flags: bool) -> dict[str, bool]:
    """The build flags that are on (a recipe names only those: the plain builds' recipes
    stay as they were)."""
    return {name: True for name, on in flags.items() if on}


@cache
def attention_fp8_kernel(d: int, causal: bool) -> KernelDef:
    """The e4m3 forward attention of head dim d (ptxdsl.kernels.attention_fp8), untuned."""
    return Recipe.of("ptxdsl.kernels.attention_fp8", "make_attention_fp8", d=d,
                     causal=bool(causal)).build()


# attention backward (ptxdsl.kernels.attention_bwd): per head dim and causal or not, the main
# kernel with dK / dV per KV head (bf16) or per query head (f32 partials, GQA), dQ added in
# any order or in key-block order (deterministic), each also in its window, varlen and
# softcap builds; the preprocess per head dim (window, varlen); one finish.
# Not tuned: one kernel per configuration until they have run on a GPU.
ATTENTION_BWD_CONFIGS: tuple[dict[str, int], ...] = tuple(
    {"gqa": g, "deterministic": det} for g in (0, 1) for det in (0, 1))
_ATTENTION_BWD = "ptxdsl.kernels.attention_bwd"


@cache
def attention_bwd_kernel(d: int, causal: bool, gqa: int = 0, deterministic: int = 0,
                         window: bool = False, varlen: bool = False, softcap: bool = False
                         ) -> KernelDef:
    return Recipe.of(_ATTENTION_BWD, "make_attention_bwd", d=d, causal=bool(causal),
                     gqa=bool(gqa), deterministic=bool(deterministic),
                     **_flags(window=window, varlen=varlen, softcap=softcap)).build()


@cache
def attention_bwd_pre_kernel(d: int, window: bool = False, varlen: bool = False
                             ) -> KernelDef:
    return Recipe.of(_ATTENTION_BWD, "make_preprocess", d=d,
                     **_flags(window=window, varlen=varlen)).build()


@cache
def attention_bwd_finish_kernel() -> KernelDef:
    return Recipe.of(_ATTENTION_BWD, "make_finish").build()


def fp8_recipe(bn: int, stages: int, cluster: int) -> Recipe:
    """The e4m3 GEMM C (bf16) = sa * sb * A @ B^T with 128 x bn x 128 tiles, sa and sb read
    from 1-element f32 device tensors."""
    return Recipe.of("ptxdsl.kernels.gemm_fp8", "make_gemm_fp8", bm=GEMM_BM, bn=bn, stages=stages,
                     cluster=(cluster, 1, 1))


@cache
def fp8_kernel(bn: int, stages: int, cluster: int) -> KernelDef:
    return fp8_recipe(bn, stages, cluster).build()


# scaled_mm_fp8_block (DeepGEMM's scales): the benchmarked 128 x 128, 5-stage kernel with the
# consumer warpgroups taking turns first, then its 2 x 1 cluster, 4 stages, and 64-wide tiles
FP8_BLOCK_CONFIGS: tuple[dict[str, int], ...] = (
    {"bn": 128, "stages": 5, "cluster": 1}, {"bn": 128, "stages": 5, "cluster": 2},
    {"bn": 128, "stages": 4, "cluster": 1}, {"bn": 64, "stages": 8, "cluster": 1},
)


def fp8_block_recipe(bn: int, stages: int, cluster: int) -> Recipe:
    """The e4m3 GEMM with 1 x 128 scales on A and 128 x 128 on B, promoted every K block."""
    return Recipe.of("ptxdsl.kernels.gemm_fp8", "make_gemm_fp8", bm=GEMM_BM, bn=bn, stages=stages,
                     cluster=(cluster, 1, 1), block=True)


@cache
def fp8_block_kernel(bn: int, stages: int, cluster: int) -> KernelDef:
    return fp8_block_recipe(bn, stages, cluster).build()


@cache
def grouped_kernel() -> KernelDef:
    """The grouped (mixture-of-experts) GEMM, contiguous layout (ptxdsl.kernels.grouped_gemm)."""
    return Recipe.of("ptxdsl.kernels.grouped_gemm", "make_grouped").build()


@cache
def grouped_fp8_kernel(masked: bool) -> KernelDef:
    """The block-scaled grouped fp8 GEMM, contiguous or masked layout
    (ptxdsl.kernels.grouped_fp8)."""
    return Recipe.of("ptxdsl.kernels.grouped_fp8", "make_grouped_fp8", masked=masked).build()


@cache
def bounds_kernel() -> KernelDef:
    """The grouped GEMM's row offsets from torch's row ends (ptxdsl.kernels.grouped_gemm)."""
    return Recipe.of("ptxdsl.kernels.grouped_gemm", "make_bounds").build()


# norms, one row per CTA in registers: warps per CTA, 8 first (the benchmarked default). A
# thread holds its share of the row in registers; more than NORM_MAX_PER_THREAD elements
# would spill. A warp count whose first round of loads is half masked or more is left out
# (but for a row that short the fewest warps stay).
NORM_WARPS = (8, 4, 16, 2)
NORM_MAX_PER_THREAD = 64
# longer rows (two sweeps): warps per CTA, 16 first, each thread LOOP_UNROLL loads a step
LOOP_WARPS = (16, 32, 8)
LOOP_UNROLL = 4
_NORMS = "ptxdsl.kernels.norms"


def norm_width(n: int, dtype: T.Scalar, addresses: tuple[int, ...] = ()) -> int:
    """The elements a load takes: a 16-byte vector where n and every address (bytes) allow,
    else the widest power of two that divides them."""
    width = 16 // dtype.nbytes
    while width > 1 and (n % width or any(a % (width * dtype.nbytes) for a in addresses)):
        width //= 2
    return width


def norm_configs(n: int, dtype: T.Scalar, vec: int | None = None) -> tuple[dict[str, int], ...]:
    """The candidates for rows of n `dtype` elements loaded `vec` at a time (default: as
    norm_width(n, dtype)): {"warps": w} held in registers, or {"loop": 1, "warps": w}."""
    vec = vec or norm_width(n, dtype)

    def held(w: int) -> int:  # elements a thread holds
        return -(-n // (32 * w * vec)) * vec

    fit = [w for w in NORM_WARPS if held(w) <= NORM_MAX_PER_THREAD]
    row = [w for w in fit if 32 * w * vec < 2 * n]
    if not row and fit:  # a row under half the fewest warps' loads: those, masked
        row = [min(fit)]
    if row:
        return tuple({"warps": w} for w in row)
    return tuple({"loop": 1, "warps": w} for w in LOOP_WARPS)


def norm_recipe(kind: str, n: int, dtype: T.Scalar, eps: float, vec: int,
                config: dict[str, int]) -> Recipe:
    """The normalisation `kind` ("rmsnorm", "layernorm" or "softmax", which ignores eps) of
    rows of n elements, one row per CTA, for one of norm_configs' candidates."""
    w = config["warps"]
    tag = f"w{w}_e{eps:.3g}".replace(".", "p").replace("-", "m")
    if config.get("loop"):
        return Recipe.of(_NORMS, "make_norm_loop", kind=kind, n=n, dtype=dtype, warps=w, vec=vec,
                         unroll=LOOP_UNROLL, eps=eps,
                         name=f"{kind}_loop_{dtype}_{n}_v{vec}_{tag}")
    if vec == 16 // dtype.nbytes and n % (32 * w * vec) == 0:  # the benchmarked kernels
        return Recipe.of(_NORMS, "make_norm_row", kind=kind, n=n, dtype=dtype, warps=w, eps=eps,
                         name=f"{kind}_row_{dtype}_{n}_{tag}")
    return Recipe.of(_NORMS, "make_norm_masked", kind=kind, n=n, dtype=dtype, warps=w, vec=vec,
                     eps=eps, name=f"{kind}_masked_{dtype}_{n}_v{vec}_{tag}")


@cache
def norm_kernel(kind: str, n: int, dtype: T.Scalar, eps: float, vec: int,
                config: tuple[tuple[str, int], ...]) -> KernelDef:
    return norm_recipe(kind, n, dtype, eps, vec, dict(config)).build()


# decode_attention: head dims 64 and 128, each with K / V copies of 128 keys (a contiguous
# cache, pages of 128 keys and more) or of one page below that (16, 32, 64); the ring as deep
# as shared memory allows (ptxdsl.kernels.decode_attention)
DECODE_HEAD_DIMS = (64, 128)
DECODE_BOXES = (128, 64, 32, 16)


def decode_recipe(d: int, box: int) -> Recipe:
    """Split-KV decode attention of head dim d over K / V copies of `box` keys."""
    return Recipe.of("ptxdsl.kernels.decode_attention", "make_decode_attention", d=d, box=box)


@cache
def decode_kernel(d: int, box: int) -> KernelDef:
    return decode_recipe(d, box).build()


# kv_append: one build per head dim (ptxdsl.kernels.kv_append), any multiple of 8 to 512; the
# decoder's are 64 and 128
KV_APPEND_HEAD_DIMS = (64, 128)


@cache
def kv_append_kernel(d: int) -> KernelDef:
    """The KV-cache append of head dim d."""
    return Recipe.of("ptxdsl.kernels.kv_append", "make_kv_append", d=d).build()
