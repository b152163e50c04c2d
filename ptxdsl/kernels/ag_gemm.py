"""All-gather + GEMM (a column-parallel linear layer) with the Python API (twin of
ag_gemm.ptxdsl).

C = all_gather(A) @ B^T on each of `world` ranks: every rank holds m_local rows of A (bf16) in
its slot of a symmetric buffer and its own N-shard B (n x K). Warps 1 and 2 of the first
`pullers` CTAs pull the other ranks' row panels over NVLink into the local buffer (TMA loads
from the stacked view, TMA stores into the local copy), a unit of 128 rows x ck k-blocks at a
time (panel by panel, or with `pace` k-block by k-block across the panels), and flip
each landed unit's bit in `flags` (once a launch: a landed bit reads the epoch's parity);
the GEMM roles (wgmma.py's main loop) walk the tiles with this rank's own panels
first, a remote panel's producer checking each unit's bit before the unit's first k-block
(and with `pace`, a local tile its remote partner's). The host side and multi-rank
interpreter runs are in tp_linear.py; `example` is the one-rank launch (no remote rows: a
plain GEMM)."""

import numpy as np

import ptxdsl
from ptxdsl import array, bf16, f32, ptr, s32, tmap, u32
from ptxdsl.kernels.family import Family
from ptxdsl.swizzle import chunk_columns

from .wgmma import consumer_lanes, load_stage, main_loop

BM, BN, BK = 128, 256, 64  # tile rows, tile columns, k-block


def unit(k, u, pace, rpan, nck):
    """Gather unit u as (remote panel, unit within it): panel by panel, or with `pace`
    k-block by k-block across the panels."""
    return (k.let("pan", k.select(pace != 0, u % rpan, u / nck)),
            k.let("pu", k.select(pace != 0, u / rpan, u % nck)))


def make_ag_gemm(stages: int = 3, cch: int = 4, bn: int = BN) -> ptxdsl.KernelDef:
    """The kernel with bn-wide tiles (64 to 256, in 32s), `stages` pipeline stages, C going out
    in `chunk_columns` chunks (64 columns, or 32 where 64 do not divide bn), `cch` of them
    staged at a time, a divisor of a tile's chunks (the text's STAGES, CCH and BN)."""
    if bn % 32 or not 64 <= bn <= 256 or cch < 1 or (bn // chunk_columns(bn, 2)) % cch:
        raise ValueError(f"make_ag_gemm: tiles are 64 to 256 columns wide in 32s, and the "
                         f"chunks staged at a time divide a tile's; not {bn} and {cch}")
    cw = chunk_columns(bn, 2)

    def ag_gemm(k, a: tmap(bf16, 3), a_pull: tmap(bf16, 4), a_st: tmap(bf16, 3), b: tmap(bf16, 2),
                c: tmap(bf16, 3), flags: ptr(u32), sig: ptr(u32), sig_stride: u32, rank: u32,
                world: u32, m_local: u32, n: u32, kdim: u32, epoch: u32, ck: u32, pace: u32,
                pullers: u32):
        ring = k.pipeline("ring", stages, a=(bf16, [BM, BK], 1024, 128),
                              b=(bf16, [bn, BK], 1024, 128))
        gring = k.pipeline("gring", 2, t=(bf16, [64, BK], 1024, 128))
        cs = k.shared("cs", bf16, [2, cch, 64, cw], align=1024, swizzle=cw * 2)
        ppr = k.let("ppr", (m_local + (BM - 1)) / BM)  # row panels per rank
        tiles_m = k.let("tiles_m", world * ppr)
        ktiles = k.let("ktiles", (kdim + (BK - 1)) / BK)
        nck = k.let("nck", (ktiles + ck - 1) / ck)  # units per panel: ck k-blocks each
        rpan = k.let("rpan", (world - 1) * ppr)  # remote panels
        units = k.let("units", rpan * nck)
        np_ = k.let("np", k.max(k.min(pullers, k.nctaid.x), 1))  # pulling CTAs: 1 .. the grid
        mine = k.let("mine", k.select(k.ctaid.x < np_, units, 0))  # the units it may pull
        nw = k.let("nw", (nck + 31) / 32)  # flag words a remote panel
        par = k.let("par", epoch % 2)  # a landed unit's bit this launch
        work = k.schedule("work", (tiles_m, (n + (bn - 1)) / bn), group=8)
        with k.role("producer", 0, 4, regs=40):
            with k.if_((k.warp == 0) & k.elect()):
                with k.for_("w", work) as w:
                    q = k.let("q", (w.m + rank * ppr) % tiles_m)  # own panels first
                    src = k.let("src", q / ppr)
                    r0 = k.let("r0", (q % ppr * BM).to(s32))
                    remote = k.let("remote", src != rank)
                    # the flag words of this tile's panel, or with `pace` a local tile's partner
                    # (the same panel of the next rank): it waits with it
                    waits = k.let("waits", remote | (pace != 0) & (world > 1))
                    fw = k.let("fw", k.select(remote, w.m - ppr, w.m) * nw)
                    word = k.let("word", 0, type=u32)  # a copy of flag word `held`
                    held = k.let("held", nw)  # (none yet)
                    with k.for_("kt", 0, ktiles) as kt:
                        u = k.let("u", kt / ck)
                        with k.if_(waits & ((held != u / 32) | ((word >> (u % 32)) % 2 != par))):
                            # this k-block's unit has landed: its bit reads par
                            k.assign(held, u / 32)
                            with k.while_((k.ld_acquire(flags[fw + held]) >> (u % 32)) % 2 != par):
                                pass
                            k.assign(word, k.ld_acquire(flags[fw + held]))  # and what landed since
                            k.fence_proxy_async_global()
                        load_stage(k, ring, a, b, (kt * BK).to(s32), [r0, src.to(s32)],
                                   [(w.n * bn).to(s32)])
                        k.commit(ring)
            with k.if_((k.warp == 1) & k.elect()):
                with k.if_(k.ctaid.x == 0):  # this rank's shard is final: tell every peer
                    with k.for_("p", 0, world) as p:
                        with k.if_(p != rank):
                            k.st_release(sig[p * sig_stride + rank], epoch, "sys")
                seen = k.let("seen", world)  # the owner whose start was last seen (none yet)
                with k.for_("u", k.ctaid.x, mine, np_) as u:
                    pan, pu = unit(k, u, pace, rpan, nck)
                    q = k.let("q", ((rank + 1) * ppr + pan) % tiles_m)
                    src = k.let("src", q / ppr)
                    with k.if_(src != seen):
                        with k.while_((k.ld_acquire(sig[rank * sig_stride + src], "sys") - epoch)
                                      .to(s32) < 0):
                            pass
                        k.fence_proxy_async_global()
                        k.assign(seen, src)
                    kb0 = k.let("kb0", pu * ck)
                    with k.for_("kb", kb0, k.min(kb0 + ck, ktiles)) as kb:
                        with k.for_("h", 0, 2) as h:
                            k.acquire(gring)
                            k.tma_load(gring.t, a_pull, [(kb * BK).to(s32),
                                                         (q % ppr * BM + h * 64).to(s32),
                                                         src.to(s32), src.to(s32)])
                            k.commit(gring)
            with k.if_((k.warp == 2) & k.elect()):
                with k.for_("u", k.ctaid.x, mine, np_) as u:
                    pan, pu = unit(k, u, pace, rpan, nck)
                    q = k.let("q", ((rank + 1) * ppr + pan) % tiles_m)
                    src = k.let("src", q / ppr)
                    kb0 = k.let("kb0", pu * ck)
                    with k.for_("kb", kb0, k.min(kb0 + ck, ktiles)) as kb:
                        with k.for_("h", 0, 2) as h:
                            k.wait(gring)
                            k.tma_store(a_st, [(kb * BK).to(s32), (q % ppr * BM + h * 64).to(s32),
                                               src.to(s32)], gring.t)
                            k.bulk_commit()
                            k.bulk_wait_read(0)
                            k.release(gring)
                    # every box of this unit has been read from its owner: count its k-blocks
                    k.let("pulled", k.atomic_add(sig[src * sig_stride + world],
                                                 k.min(kb0 + ck, ktiles) - kb0, "relaxed", "sys"))
                    k.bulk_wait(0)  # complete: the bit's flip publishes the unit
                    k.fence_proxy_async_global()
                    k.let("landed", k.atomic_xor(flags[pan * nw + pu / 32], 1 << (pu % 32),
                                                 "release"))
                with k.if_(k.ctaid.x == 0):  # every peer has pulled what it needs from this rank
                    want = k.let("want", (world - 1) * ppr * ktiles)
                    with k.while_(k.ld_acquire(sig[rank * sig_stride + world], "sys") != want):
                        pass
                    sig[rank * sig_stride + world] = 0
        with k.role("consumer", 4, 12, regs=232):
            wg, leader, row, col = consumer_lanes(k)
            with k.for_("w", work) as w:
                q = k.let("q", (w.m + rank * ppr) % tiles_m)
                acc = k.let("acc", type=array(f32, bn // 2))
                main_loop(k, ring, [acc], wg, 0, ktiles, steps=BK // 16)
                # C out through the staging tile, cch chunks at a time
                with k.for_("h0", 0, bn // cw, cch, unroll=True) as h0:
                    with k.if_(leader):
                        k.bulk_wait_read(0)
                    k.bar_sync(8 + wg, 128)
                    with k.for_("jj", 0, cch * (cw // 8), unroll=True) as jj:
                        with k.for_("i", 0, 2, unroll=True) as i:
                            per = cw // 8  # 8-column groups a chunk
                            j = h0 * per + jj
                            cs[wg, jj / per, row + i * 8, jj % per * 8 + col] = k.bf16x2(
                                acc[4 * j + 2 * i].to(bf16), acc[4 * j + 2 * i + 1].to(bf16))
                    k.fence_proxy_async()
                    k.bar_sync(8 + wg, 128)
                    with k.if_(leader):
                        with k.for_("h", 0, cch, unroll=True) as h:
                            k.tma_store(c, [(w.n * bn + (h0 + h) * cw).to(s32),
                                            (q % ppr * BM + wg * 64).to(s32), (q / ppr).to(s32)],
                                        cs[wg, h])
                        k.bulk_commit()
            with k.if_(leader):
                k.bulk_wait(0)

    return ptxdsl.kernel(threads=384)(ag_gemm)


ag_gemm = make_ag_gemm()


SMALL = {"m_local": 200, "n": 136, "k": 200}


def example(rng: np.random.Generator, m_local: int = 1000, n: int = 1528, k: int = 1000,
            grid: int | None = None) -> dict:
    """One rank (world = 1): random bf16 A (m_local x k) in the rank's slot of the gathered
    buffer and B (n x k); the reference is A @ B^T in f32. With no peer there is nothing to
    gather (no remote panels: `flags` is one unused word) and the signal words stay zero. The maps
    `a`, `a_pull` and `a_st` wrap views of one buffer, as tp_linear.AllGatherGemm's do
    (m_local, n, k need not be tile multiples; k and n are multiples of 8, as TMA wants
    16-byte row pitches)."""
    from ptxdsl.runtime.dtypes import bf16_to_f32, f32_to_bf16

    world = 1
    a = f32_to_bf16(rng.standard_normal((world, m_local, k), np.float32))
    b = f32_to_bf16(rng.standard_normal((n, k), np.float32))
    ref = bf16_to_f32(a) @ bf16_to_f32(b).T
    box = {"swizzle": "128B"}
    tiles = world * -(-m_local // BM) * -(-n // BN)
    return {"grid": grid or min(tiles, 132),
            "inputs": {"a": a, "a_pull": a.reshape(1, world, m_local, k), "a_st": a, "b": b,
                       "flags": np.zeros(1, np.uint32),
                       "sig": np.zeros(world + 1, np.uint32), "sig_stride": world + 1,
                       "rank": 0, "world": world, "m_local": m_local, "n": n, "kdim": k,
                       "epoch": 1, "ck": 4, "pace": 0,  # pace: no peer to keep pace with
                       "pullers": 1},
            "tensor_maps": {"a": {"box": (1, BM, BK), **box},
                            "a_pull": {"box": (1, 1, 64, BK), **box},
                            "a_st": {"box": (1, 64, BK), **box}, "b": {"box": (BN, BK), **box},
                            "c": {"box": (1, 64, 64), **box}},
            "outputs": {"c": np.zeros((world, m_local, n), np.uint16)},
            "expected": {"c": ref, "sig": np.zeros(world + 1, np.uint32)},
            "rtol": 2 ** -7, "atol": 2 ** -7 * float(np.sqrt(k)) * 4}


# the benchmarked default configuration (BENCHMARKS.md)
FAMILY = Family(
    name="ag_gemm",
    summary="all-gather + GEMM over NVLink (column-parallel linear), one kernel per rank",
    factory=make_ag_gemm,
    defaults={"stages": 3, "cch": 4, "bn": 256},
    source="ag_gemm.ptxdsl",
)
