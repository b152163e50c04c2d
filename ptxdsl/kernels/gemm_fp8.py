"""fp8 GEMMs on the tensor cores with the Python API (twin of gemm_fp8.ptxdsl).

C = A @ B^T with A (M x K) and B (N x K) e4m3, both row-major, so both K-major, as fp8 wgmma
needs them (it has no transpose); f32 accumulation; C (M x N, row-major) bf16. The structure
is the bf16 GEMM's (gemm.py): a persistent grid, a producer warpgroup streaming tiles with TMA
(128-byte swizzle) into a ring, two consumer warpgroups issuing wgmma, a bf16 epilogue through
a swizzled shared tile and TMA stores. A 128-byte swizzle row holds 128 fp8, so a stage holds
K = 128 and a consumer issues 4 wgmma k32 steps per stage.

- `gemm_fp8`, per-tensor scales (what torch._scaled_mm computes): C = sa * sb * A @ B^T, with
  sa and sb f32 device scalars (`scales="ptr"`, as torch passes them) or f32 kernel arguments
  (`scales="scalar"`); the product is applied to the f32 accumulator in the epilogue.
- `gemm_fp8_block`, DeepGEMM-style block scales: sfa holds one f32 per row of A and K block
  of 128 (logically [M, K / 128], stored K-block-major as [K / 128][M] so that TMA brings the
  bm scales of a tile with each stage), sfb one f32 per 128 x 128 block of B ([N / 128][K /
  128], row-major, read by the consumers). Each K block is multiplied into a temporary f32
  accumulator, waited for, and promoted: acc += tmp * sa[row] * sb, so the tensor cores'
  limited-precision fp8 accumulation never runs over more than 128 products.

`make_gemm_fp8(...)` builds either for any tile shape, stage count, fp8 input types and
cluster pairing; the module-level kernels are the ones gemm_fp8.ptxdsl spells out."""

import numpy as np

import ptxdsl
from ptxdsl import array, bf16, e4m3, f32, ptr, s32, tmap, u32
from ptxdsl.kernels.family import Family

from .wgmma import (
    block_scaled_loop,
    consumer_lanes,
    first_turn,
    last_turn,
    load_stage,
    main_loop,
    store_c,
)

SWIZZLE = 128  # bytes per shared-memory row: the K extent of a stage (128 fp8)
BK = 128  # K per stage; also the K extent of a block scale
BLOCK = 128  # rows / columns / K of a block scale


def make_gemm_fp8(bm: int = 128, bn: int = 256, stages: int = 3, group: int = 8,
                  consumers: int = 2, cluster: tuple[int, int, int] = (1, 1, 1),
                  producer_regs: int = 40, consumer_regs: int = 232, scales: str = "ptr",
                  block: bool = False, a_type=e4m3, b_type=e4m3,
                  pingpong: bool | None = None) -> ptxdsl.KernelDef:
    """An fp8 GEMM with bm x bn x 128 tiles, `consumers` warpgroups of bm / consumers rows
    each (64 or 128), `stages` pipeline stages, tiles walked in groups of `group` tile-rows.
    `block=True` builds the block-scaled kernel (bn 64 or 128: the tile stays inside one 128-
    column scale block, and the temporary accumulator fits the register budget beside the
    promoted one); otherwise `scales` is "ptr" or "scalar". `cluster=(2, 1, 1)` pairs the
    CTAs of a cluster on two vertically adjacent tiles that share (multicast) the B tile.
    `pingpong` (block-scaled only; the default there) makes the consumer warpgroups take turns
    issuing each K block's wgmmas (named barriers 2 + wg), so that one promotes while the
    tensor cores run the other's group."""
    if pingpong is None:
        pingpong = block and consumers > 1
    cm = cluster[0]
    if tuple(cluster) not in ((1, 1, 1), (2, 1, 1)):
        raise ValueError(f"make_gemm_fp8: cluster is (1, 1, 1) or (2, 1, 1), not {cluster}")
    if scales not in ("ptr", "scalar"):
        raise ValueError(f"make_gemm_fp8: scales is 'ptr' or 'scalar', not {scales!r}")
    assert a_type.is_fp8 and b_type.is_fp8, "inputs are e4m3 or e5m2"
    wm = bm // consumers  # rows per consumer warpgroup
    assert wm in (64, 128) and wm * consumers == bm, "each consumer owns 64 or 128 rows"
    assert bn % 64 == 0 and 64 <= bn <= 256, "bn is 64, 128, 192 or 256"
    assert not block or bn in (64, 128), "block scales: bn is 64 or 128"
    assert not pingpong or (block and consumers > 1), "pingpong: block scales, >1 consumer"
    mw = wm // 64  # m64 wgmmas per k-step
    nacc = bn // 2  # f32 accumulators per thread per m64 block
    chunks = bn // 64  # 128-byte-wide column chunks of the C tile (one TMA store each)
    threads = 128 * (1 + consumers)
    base = "gemm_fp8_block" if block else "gemm_fp8"
    default = (bm, bn, stages, group, consumers, producer_regs, consumer_regs, cm, scales,
               a_type, b_type, pingpong) == (128, 128 if block else 256, 5 if block else 3, 8,
                                             2, 40, 232, 1, "ptr", e4m3, e4m3, block)
    name = base if default else (
        f"{base}_{a_type}{b_type}_{bm}x{bn}_s{stages}_c{consumers}_g{group}_r{producer_regs}_"
        f"{consumer_regs}{'_x2' if cm == 2 else ''}{'_scalar' if scales == 'scalar' else ''}"
        f"{'_pp' if pingpong else ''}")

    def coords(k, t, tiles_m, grp):
        """The tile (m0, n0) of work item t; with a cluster pair, t is a pair of tiles and
        the CTA of rank r takes its r-th row."""
        first = k.let("first", t / grp * group)
        rows = k.let("rows", k.min(tiles_m - first, group))
        mt = first + t % grp % rows
        if cm > 1:
            mt = mt * cm + k.cluster_ctarank
        m0 = k.let("m0", mt * bm)
        n0 = k.let("n0", t % grp / rows * bn)
        return m0, n0

    def body(k, a, b, c, sfa, sfb, m, n, kk_):
        stage = {"a": (a_type, [bm, BK], 1024, SWIZZLE),
                 "b": (b_type, [cm, bn // cm, BK] if cm > 1 else [bn, BK], 1024, SWIZZLE)}
        if block:
            stage["sa"] = (f32, [1, bm], 128)
        ring = k.pipeline("ring", stages, **stage)
        cs = k.shared("cs", bf16, [consumers, mw * chunks, 64, 64], align=1024,
                      swizzle=SWIZZLE)
        tiles_m = k.let("tiles_m", (m + (bm * cm - 1)) / (bm * cm))
        tiles_n = k.let("tiles_n", (n + (bn - 1)) / bn)
        ktiles = k.let("ktiles", (kk_ + (BK - 1)) / BK)
        ntiles = k.let("ntiles", tiles_m * tiles_n)
        grp = k.let("group", group * tiles_n)
        first_item, items_step = (k.clusterid.x, k.nclusterid.x) if cm > 1 else \
            (k.ctaid.x, k.nctaid.x)
        with k.role("producer", 0, 4, regs=producer_regs):
            with k.if_((k.warp == 0) & k.elect()):
                with k.for_("t", first_item, ntiles, items_step) as t:
                    m0, n0 = coords(k, t, tiles_m, grp)
                    with k.for_("kt", 0, ktiles) as kt:
                        load_stage(k, ring, a, b, (kt * BK).to(s32), [m0.to(s32)],
                                   [n0.to(s32)], (n0, bn) if cm > 1 else None)
                        if block:  # the tile's row scales of this K block
                            k.tma_load(ring.sa, sfa, [m0.to(s32), kt.to(s32)])
                        k.commit(ring)
        with k.role("consumer", 4, 4 * (1 + consumers), regs=consumer_regs):
            wg, leader, row, col = consumer_lanes(k)
            if not block:
                scale = k.let("scale", sfa[0] * sfb[0] if scales == "ptr" else sfa * sfb)
            if pingpong:
                first_turn(k, wg, consumers)
            with k.for_("t", first_item, ntiles, items_step) as t:
                m0, n0 = coords(k, t, tiles_m, grp)
                suffix = [("" if r == 0 else str(r)) for r in range(mw)]
                if block:
                    accs = [k.let(f"acc{s}", 0.0, array(f32, nacc)) for s in suffix]
                    tmps = [k.let(f"tmp{s}", type=array(f32, nacc)) for s in suffix]
                    sb_row = k.let("sb_row", n0 / BLOCK * ktiles)
                    block_scaled_loop(k, ring, accs, tmps, wg, ktiles, sfb, sb_row, row,
                                      nacc=nacc, wm=wm, consumers=consumers,
                                      pingpong=pingpong, cluster=cm)
                else:
                    accs = [k.let(f"acc{s}", type=array(f32, nacc)) for s in suffix]
                    main_loop(k, ring, accs, wg, 0, ktiles, steps=BK // 32, wm=wm, kw=32,
                              cluster=cm)
                store_c(k, accs, cs, c, m0, n0, wg, leader, row, col, bn=bn, wm=wm,
                        chunks=chunks, scale=None if block else scale)
            with k.if_(leader):
                k.bulk_wait(0)
            if pingpong:
                last_turn(k, wg)

    if block:
        def gemm(k, a: tmap(a_type, 2), b: tmap(b_type, 2), c: tmap(bf16, 2),
                 sfa: tmap(f32, 2), sfb: ptr(f32), m: u32, n: u32, kdim: u32):
            body(k, a, b, c, sfa, sfb, m, n, kdim)
    elif scales == "ptr":
        def gemm(k, a: tmap(a_type, 2), b: tmap(b_type, 2), c: tmap(bf16, 2),
                 scale_a: ptr(f32), scale_b: ptr(f32), m: u32, n: u32, kdim: u32):
            body(k, a, b, c, scale_a, scale_b, m, n, kdim)
    else:
        def gemm(k, a: tmap(a_type, 2), b: tmap(b_type, 2), c: tmap(bf16, 2),
                 scale_a: f32, scale_b: f32, m: u32, n: u32, kdim: u32):
            body(k, a, b, c, scale_a, scale_b, m, n, kdim)

    return ptxdsl.kernel(threads=threads, name=name, **({"cluster": cm} if cm > 1 else {}))(gemm)


gemm_fp8 = make_gemm_fp8()
gemm_fp8_block = make_gemm_fp8(bn=128, stages=5, block=True, pingpong=True)

SMS = 132  # H100 / H200
SMALL = {"m": 256, "n": 256, "k": 256, "grid": 2}


def quantize_blocks(x: np.ndarray, rows: int, t=e4m3) -> tuple[np.ndarray, np.ndarray]:
    """fp8 data and f32 scales of `x` (R x K) in blocks of `rows` x 128: each block divided
    by its largest magnitude / the type's largest value (K a multiple of 128)."""
    from ptxdsl.fp8 import MAX, quantize

    r, kdim = x.shape
    rb, kb = -(-r // rows), kdim // BLOCK
    pad = np.zeros((rb * rows, kdim), np.float32)
    pad[:r] = x
    blocks = pad.reshape(rb, rows, kb, BLOCK)
    amax = np.abs(blocks).max(axis=(1, 3))
    scale = np.where(amax > 0, amax / MAX[t.name], 1.0).astype(np.float32)  # (rb, kb)
    q = quantize(blocks / scale[:, None, :, None], t).reshape(rb * rows, kdim)[:r]
    return q, scale


def example(rng: np.random.Generator, m: int = 1000, n: int = 1528, k: int = 1024,
            grid: int | None = None, kernel: str = "gemm_fp8", bm: int = 128,
            bn: int | None = None, cluster: int = 1, scales: str = "ptr",
            types: tuple = (e4m3, e4m3)) -> dict:
    """Random inputs and an f32 reference of the dequantised product (m and n need not be
    tile multiples; n and k are multiples of 16 and, for the block-scaled kernel, k of 128 and
    m of 4, as TMA wants 16-byte row pitches). `bm`, `bn`, `cluster`, `scales` and `types`
    (of A and B) say how the kernel was made.

    gemm_fp8: A and B standard normal in fp8, per-tensor scales in [0.5, 2).
    gemm_fp8_block: rows and columns of magnitudes 2^-8 .. 2^8, quantised in blocks (1 x 128
    for A, 128 x 128 for B) with per-block scales, as an fp8 training step would; each
    element of C is checked against the magnitude of its own row and column."""
    from ptxdsl.fp8 import quantize

    block = kernel.startswith("gemm_fp8_block")
    bn = bn or (128 if block else 256)
    box = {"swizzle": "128B"}
    maps = {"a": {"box": (bm, BK), **box}, "b": {"box": (bn // cluster, BK), **box},
            "c": {"box": (64, 64), **box}}
    if block:
        rmag = np.exp2(rng.integers(-8, 9, m)).astype(np.float32)
        cmag = np.exp2(rng.integers(-8, 9, n)).astype(np.float32)
        x = rng.standard_normal((m, k)).astype(np.float32) * rmag[:, None]
        w = rng.standard_normal((n, k)).astype(np.float32) * cmag[:, None]
        a, sa_blocks = quantize_blocks(x, 1, types[0])
        b, sb = quantize_blocks(w, BLOCK, types[1])
        sfa = np.ascontiguousarray(sa_blocks[:m].T)  # [K / 128][M]
        a_deq = a.astype(np.float32) * np.repeat(sa_blocks[:m], BLOCK, axis=1)
        b_deq = b.astype(np.float32) * np.repeat(np.repeat(sb, BLOCK, axis=0)[:n], BLOCK, axis=1)
        ref = a_deq.astype(np.float64) @ b_deq.T.astype(np.float64)
        inputs = {"a": a, "b": b, "sfa": sfa, "sfb": sb, "m": m, "n": n, "kdim": k}
        maps["sfa"] = {"box": (1, bm)}
        atol = 2 ** -8 * np.sqrt(k) * np.outer(rmag, cmag)
    else:
        a = quantize(rng.standard_normal((m, k)), types[0])
        b = quantize(rng.standard_normal((n, k)), types[1])
        sa, sb = rng.uniform(0.5, 2.0, 2).astype(np.float32)
        ref = (a.astype(np.float64) @ b.astype(np.float64).T) * (float(sa) * float(sb))
        inputs = {"a": a, "b": b, "scale_a": np.array([sa]), "scale_b": np.array([sb]),
                  "m": m, "n": n, "kdim": k}
        if scales == "scalar":
            inputs["scale_a"], inputs["scale_b"] = float(sa), float(sb)
        atol = 2 ** -8 * np.sqrt(k) * 4 * float(sa) * float(sb)
    items = -(-m // (bm * cluster)) * -(-n // bn)
    default_grid = min(SMS // cluster, items) * cluster
    return {"kernel": kernel, "grid": grid or default_grid, "inputs": inputs,
            "tensor_maps": maps, "outputs": {"c": np.zeros((m, n), np.uint16)},
            "expected": {"c": ref}, "rtol": 2 ** -7, "atol": atol}


# the benchmarked default configuration (BENCHMARKS.md)
FAMILY = Family(
    name="gemm_fp8",
    summary="e4m3 GEMM, bf16 C: per-tensor scales (block=True: DeepGEMM-style block scales)",
    factory=make_gemm_fp8,
    defaults={"bm": 128, "bn": 256, "stages": 3},
    source="gemm_fp8.ptxdsl",
)
