"""GEMM + reduce-scatter (a row-parallel linear layer) with the Python API (twin of
gemm_rs.ptxdsl).

Every rank holds A (M x k_local) and B (n x k_local), a K-shard of the product, and ends with
rows rank * m_local .. (rank + 1) * m_local of C = the sum over ranks of A @ B^T (bf16). The
walk visits row panels owner by owner, this rank's own first: a partial tile is stored into its
own shard, or reduce-added into the owner's over NVLink once the owner's store is in (with
`ordered`, once every earlier step's is), and each contribution then bumps its half-tile's
counter in the owner's `sig`. With `zeroed` (every item in the first wave) warp 1 zeroes
the owner's tiles as the launch starts (and sees the owners' zeros in while the main loop
runs) and every contribution adds as soon as it is done.
The main loop and epilogue staging are wgmma.py's. The host side and multi-rank interpreter
runs are in tp_linear.py; `example` is the one-rank launch."""

import numpy as np

import ptxdsl
from ptxdsl import array, bf16, f32, ptr, s32, tmap, u32
from ptxdsl.kernels.family import Family

from .wgmma import consumer_lanes, load_stage, main_loop, stage_c

BM, BN, BK = 128, 256, 64  # tile rows, tile columns (the default width), k-block
NONE = 0xFFFFFFFF  # no contribution waits to be published


def zeros(k, work, cs, c, sig, sig_stride, rank, world, epoch, ppr, tiles_m, tiles_n, zeroed,
          zready, bn: int) -> None:
    """`zeroed` (warp 1): zeros over this rank's own tiles (what their first contributions
    cover), from the staging tile (the consumers write it only once `zready` completes), each
    half-tile counted in once they are complete; then, while the main loop runs, the owners
    of this CTA's items seen to have theirs in (a remote counter's read costs ~1.5 us)."""
    z8 = k.let("z8", type=ptxdsl.types.vector_type(bf16, 8))  # 16 bytes of zeros
    with k.for_("e", 0, 8, unroll=True) as e:
        z8[e] = 0.0
    with k.for_("i", 0, 64) as i:
        with k.for_("j", 0, 8, unroll=True) as j:
            cs[0, 0, i, j * 8] = z8
    k.fence_proxy_async()
    with k.for_("w", work) as w:
        with k.if_((w.m < ppr) & (w.split == 0)):  # this rank's own tile, its first range
            with k.for_("hr", 0, 2) as hr:
                with k.for_("h", 0, bn // 64) as h:
                    k.tma_store(c, [(w.n * bn + h * 64).to(s32), (w.m * BM + hr * 64).to(s32),
                                    rank.to(s32)], cs[0, 0])
            k.bulk_commit()
            k.bulk_wait(0)
            k.fence_proxy_async_global()
            with k.for_("hr", 0, 2) as hr:
                k.let("z", k.atomic_add(sig[rank * sig_stride + (w.m * tiles_n + w.n) * 2 + hr],
                                        1, "release", "sys"))
    with k.for_("w", work) as w:
        q = k.let("q", (w.m + rank * ppr) % tiles_m)
        with k.for_("hr", 0, 2) as hr:
            cnt = k.let("cnt", q / ppr * sig_stride + ((q % ppr * tiles_n + w.n) * 2 + hr))
            want = k.let("want", (epoch - 1) * (world * w.splits + zeroed) + zeroed)
            with k.while_((k.ld_acquire(sig[cnt], "sys") - want).to(s32) < 0):
                pass
    k.mbarrier_arrive(zready)


def make_gemm_rs(bn: int = BN, stages: int = 3) -> ptxdsl.KernelDef:
    """The kernel with bn-wide tiles (64, 128, 192 or 256) and `stages` pipeline stages (the
    text's BN and STAGES)."""
    if bn % 64 or not 64 <= bn <= 256:
        raise ValueError(f"make_gemm_rs: tiles are 64, 128, 192 or 256 columns wide, not {bn}")

    def gemm_rs(k, a: tmap(bf16, 2), b: tmap(bf16, 2), c: tmap(bf16, 3), sig: ptr(u32),
                sig_stride: u32, rank: u32, world: u32, m_local: u32, n: u32, kdim: u32,
                epoch: u32, ordered: u32, splits: u32, zeroed: u32):
        ring = k.pipeline("ring", stages, a=(bf16, [BM, BK], 1024, 128),
                          b=(bf16, [bn, BK], 1024, 128))
        cs = k.shared("cs", bf16, [2, bn // 64, 64, 64], align=1024, swizzle=128)
        # `zeroed`: the zeros are in, here and at this CTA's owners
        zready = k.mbarrier("zready", count=1)
        ppr = k.let("ppr", (m_local + (BM - 1)) / BM)  # row panels per owner
        tiles_m = k.let("tiles_m", world * ppr)
        tiles_n = k.let("tiles_n", (n + (bn - 1)) / bn)
        ktiles = k.let("ktiles", (kdim + (BK - 1)) / BK)
        work = k.schedule("work", (tiles_m, tiles_n), group=8, ksteps=ktiles, splits=splits)
        with k.if_(k.tid.x == 0):
            k.mbarrier_init(zready)
            k.fence_mbarrier_init()
        k.bar_sync(0)
        with k.role("producer", 0, 4, regs=40):
            with k.if_((k.warp == 0) & k.elect()):
                with k.for_("w", work) as w:
                    q = k.let("q", (w.m + rank * ppr) % tiles_m)  # own panels first
                    r0 = k.let("r0", (q / ppr * m_local + q % ppr * BM).to(s32))
                    with k.for_("kt", w.k0, w.k1) as kt:
                        load_stage(k, ring, a, b, (kt * BK).to(s32), [r0],
                                   [(w.n * bn).to(s32)])
                        k.commit(ring)
            with k.if_((k.warp == 1) & k.elect() & (zeroed != 0)):
                zeros(k, work, cs, c, sig, sig_stride, rank, world, epoch, ppr, tiles_m, tiles_n,
                      zeroed, zready, bn)
        with k.role("consumer", 4, 12, regs=232):
            wg, leader, row, col = consumer_lanes(k)
            pending = k.let("pending", NONE, type=u32)  # the counter the last contribution bumps
            zwait = k.let("zwait", zeroed)  # the zeros are in and `cs` is free: yet to be seen
            with k.for_("w", work) as w:
                q = k.let("q", (w.m + rank * ppr) % tiles_m)
                owner = k.let("owner", q / ppr)
                # its place in the fixed order of the tile's contributions: by K range, then step
                # (the walk's order: ranges are split-major, so what an item waits for comes
                # earlier in some rank's walk, and the ordered chain cannot deadlock)
                idx = k.let("idx", w.split * world + w.m / ppr)
                acc = k.let("acc", type=array(f32, bn // 2))
                main_loop(k, ring, [acc], wg, w.k0, w.k1, steps=BK // 16)
                with k.if_(leader):
                    # the previous tile's contribution has long landed: publish it now
                    with k.if_(pending != NONE):
                        k.bulk_wait(0)
                        k.fence_proxy_async_global()
                        k.let("seen", k.atomic_add(sig[pending], 1, "release", "sys"))
                        k.assign(pending, NONE)
                    k.bulk_wait_read(0)
                    with k.if_(zwait != 0):  # the zeros are in (and out of `cs`)
                        k.mbarrier_wait(zready, 0)
                        k.assign(zwait, 0)
                k.bar_sync(8 + wg, 128)
                stage_c(k, [acc], cs, wg, row, col, bn=bn, chunks=bn // 64)
                k.fence_proxy_async()
                k.bar_sync(8 + wg, 128)
                with k.if_(leader):
                    cnt = k.let("cnt", owner * sig_stride + ((q % ppr * tiles_n + w.n) * 2 + wg))
                    r1 = k.let("r1", (q % ppr * BM + wg * 64).to(s32))
                    with k.if_((idx == 0) & (zeroed == 0)):
                        with k.for_("h", 0, bn // 64, unroll=True) as h:
                            k.tma_store(c, [(w.n * bn + h * 64).to(s32), r1, owner.to(s32)],
                                        cs[wg, h])
                    with k.else_():
                        # every counter held this at the launch's start; then come the zeros
                        base = k.let("base", (epoch - 1) * (world * w.splits + zeroed))
                        want = k.let("want", base + zeroed +
                                     k.select(ordered != 0, idx, 1 - zeroed))
                        with k.if_((zeroed == 0) | (ordered != 0)):  # else warp 1 saw them
                            with k.while_((k.ld_acquire(sig[cnt], "sys") - want).to(s32) < 0):
                                pass
                        k.fence_proxy_async_global()
                        with k.for_("h", 0, bn // 64, unroll=True) as h:
                            k.tma_reduce_add(c, [(w.n * bn + h * 64).to(s32), r1, owner.to(s32)],
                                             cs[wg, h])
                    k.bulk_commit()
                    k.assign(pending, cnt)
            with k.if_(leader):
                with k.if_(pending != NONE):
                    k.bulk_wait(0)
                    k.fence_proxy_async_global()
                    k.let("last", k.atomic_add(sig[pending], 1, "release", "sys"))
            # this rank's shard is whole once every rank has added into the tiles stored here
            with k.for_("w2", work) as w2:
                with k.if_(leader & (w2.m < ppr) & (w2.split == 0)):
                    mine = k.let("mine", rank * sig_stride + ((w2.m * tiles_n + w2.n) * 2 + wg))
                    with k.while_(k.ld_acquire(sig[mine], "sys") !=
                                  epoch * (world * w2.splits + zeroed)):
                        pass

    return ptxdsl.kernel(threads=384)(gemm_rs)


gemm_rs = make_gemm_rs()


SMALL = {"m_local": 200, "n": 136, "k": 200, "splits": 2}


def example(rng: np.random.Generator, m_local: int = 1000, n: int = 1528, k: int = 1000,
            ordered: int = 0, splits: int = 1, grid: int | None = None) -> dict:
    """One rank (world = 1), first launch: random bf16 A (m_local x k) and B (n x k); the
    reference is A @ B^T in f32. With `splits` K ranges a tile, the first range of each tile
    stores and the others add; every range bumps its half-tile counter once, so the counters
    end at world x ranges (m_local, n, k need not be tile multiples; k and n are multiples of
    8, as TMA wants 16-byte row pitches)."""
    from ptxdsl.runtime.dtypes import bf16_to_f32, f32_to_bf16

    world = 1
    a = f32_to_bf16(rng.standard_normal((world * m_local, k), np.float32))
    b = f32_to_bf16(rng.standard_normal((n, k), np.float32))
    ref = bf16_to_f32(a) @ bf16_to_f32(b).T
    box = {"swizzle": "128B"}
    counters = -(-m_local // BM) * -(-n // BN) * 2  # one per 64-row half of each tile
    return {"grid": grid or min(world * counters // 2, 132),
            "inputs": {"a": a, "b": b, "sig": np.zeros(counters, np.uint32),
                       "sig_stride": counters, "rank": 0, "world": world, "m_local": m_local,
                       "n": n, "kdim": k, "epoch": 1, "ordered": ordered, "splits": splits,
                       "zeroed": 0},
            "tensor_maps": {"a": {"box": (BM, BK), **box}, "b": {"box": (BN, BK), **box},
                            "c": {"box": (1, 64, 64), **box}},
            "outputs": {"c": np.zeros((world, m_local, n), np.uint16)},
            "expected": {"c": ref.reshape(world, m_local, n),
                         "sig": np.full(counters, world * max(min(splits, -(-k // BK)), 1),
                                        np.uint32)},
            "rtol": 2 ** -7, "atol": 2 ** -7 * float(np.sqrt(k)) * 4}


# the benchmarked default configuration (BENCHMARKS.md)
FAMILY = Family(
    name="gemm_rs",
    summary="GEMM + reduce-scatter over NVLink (row-parallel linear), one kernel per rank",
    factory=make_gemm_rs,
    defaults={"bn": 256, "stages": 3},
    source="gemm_rs.ptxdsl",
)
