"""The pieces every warp-specialised wgmma GEMM of the library shares: the producer's stage
load, the consumers' main loop (one wgmma group in flight, a lagging release; for fp8 its
two-level form, promoted_loop, and the block-scaled form, block_scaled_loop), and the
epilogue that stores the accumulators as C through a swizzled shared tile and TMA stores.

The families (gemm, gemm_fp8, gemm_splitk, grouped_gemm, grouped_fp8, ag_gemm, gemm_rs) call
these inside their roles; registers are named by the `k.let` / loop names used here, so every
family's PTX is what it was when each spelled the loops out. A consumer warpgroup `wg` owns
`wm` rows of the tile (one m64 accumulator per 64 of them, `accs`); a thread holds rows `row`
and `row + 8` and columns `col`, `col + 1` of every 8-column group (wgmma's accumulator
layout)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..api import array
from ..types import Scalar, bf16, f32, s32

TMA_DIM_LIMIT = 2**32  # a tensor map's sizes are below this


def tma_shape_error(m: int, n: int, k: int, in_bytes: int, out_bytes: int = 2) -> str | None:
    """Why TMA cannot address a GEMM of A (M x K) and B (N x K), of `in_bytes` elements, into
    C (M x N) of `out_bytes` elements; None when it can. Every size TMA addresses is taken
    (the maps clip and zero-fill the tiles a size does not divide): a map has no empty
    dimension, sizes below 2**32, and the 16-byte rule: its row pitch is a multiple of 16
    bytes."""
    if min(m, n, k) < 1:
        return f"M, N and K must be at least 1, got M={m}, N={n}, K={k}"
    if max(m, n, k) >= TMA_DIM_LIMIT:
        return f"M, N and K must be below 2**32 (TMA's sizes), got M={m}, N={n}, K={k}"
    if k * in_bytes % 16:
        return (f"K={k} breaks TMA's 16-byte rule: a and b are read by rows of K x {in_bytes} "
                f"= {k * in_bytes} bytes, and a row pitch must be a multiple of 16 bytes "
                f"(K a multiple of {16 // in_bytes})")
    if n * out_bytes % 16:
        return (f"N={n} breaks TMA's 16-byte rule: C is written by rows of N x {out_bytes} = "
                f"{n * out_bytes} bytes, and a row pitch must be a multiple of 16 bytes (N a "
                f"multiple of {16 // out_bytes})")
    return None


def consumer_lanes(k: Any) -> tuple[Any, Any, Any, Any]:
    """A consumer thread's place: its warpgroup `wg` (0 for the first consumer, warps 4-7),
    `leader` (the warpgroup's first thread, which issues its bulk copies), and the first
    `row` and `col` of the accumulator fragments it holds."""
    return (k.let("wg", k.warp / 4 - 1), k.let("leader", k.tid.x % 128 == 0),
            k.let("row", k.tid.x % 128 / 32 * 16 + k.laneid / 4),
            k.let("col", k.laneid % 4 * 2))


def load_stage(k: Any, ring: Any, a: Any, b: Any, k0: Any, a_at: list, b_at: list,
               pair: tuple[Any, int] | None = None) -> None:
    """Acquire the next stage of `ring` and start its TMA loads: ring.a from `a` at
    [k0, *a_at], ring.b from `b` at [k0, *b_at]. `pair=(n0, bn)` with a 2-CTA cluster: this
    CTA loads its half of the bn-row B tile at row n0 and multicasts it to both CTAs (b_at
    is then unused). The caller adds any further loads of the stage and commits it."""
    k.acquire(ring)
    k.tma_load(ring.a, a, [k0, *a_at])
    if pair is not None:  # my half of B, to both CTAs of the pair
        n0, bn = pair
        half = k.cluster_ctarank
        k.tma_load_multicast(ring.b[half], b, [k0, (n0 + half * (bn // 2)).to(s32)],
                             k.cluster_mask())
    else:
        k.tma_load(ring.b, b, [k0, *b_at])


def wgmma_group(k: Any, ring: Any, accs: list, wg: Any, *, steps: int, first: bool,
                wm: int = 64, kw: int = 16, cluster: int = 1, b0: Any = 0) -> None:
    """The current stage's wgmmas as one committed group: `steps` k-steps of `kw` for each
    m64 accumulator of the warpgroup. `first`: the stage starts the accumulation (its first
    k-step overwrites the accumulators instead of adding). `b0`: the first row of ring.b the
    warpgroup reads (its N is its accumulators' width), when warpgroups split B's rows; with
    a cluster, which of B's per-CTA parts it starts at (ring.b[b0, 0])."""
    k.wgmma_fence()
    with k.for_("kk", 0, steps, unroll=True) as kk:
        for r, acc in enumerate(accs):
            rows0 = wg * wm + r * 64 if r else wg * wm
            bop = ring.b[b0, 0, kk * kw] if cluster > 1 else ring.b[b0, kk * kw]
            k.wgmma(acc, ring.a[rows0, kk * kw], bop, kk > 0 if first else True)
    k.wgmma_commit()


def main_loop(k: Any, ring: Any, accs: list, wg: Any, k0: Any, k1: Any, *, steps: int,
              wm: int = 64, kw: int = 16, cluster: int = 1, b0: Any = 0) -> None:
    """K steps k0 .. k1 (at least one) of the tile into `accs`. One wgmma group stays in
    flight: after issuing a stage's group, wgmma_wait(1) retires the previous stage's, and
    release hands back the oldest stage held, the one that group read. `b0` as wgmma_group
    takes it."""
    def kblock(first: bool) -> None:
        """Wait for the next stage and issue its wgmmas as one group."""
        k.wait(ring)
        wgmma_group(k, ring, accs, wg, steps=steps, first=first, wm=wm, kw=kw,
                    cluster=cluster, b0=b0)

    kblock(True)
    with k.for_("kt", k0 + 1, k1):
        kblock(False)
        k.wgmma_wait(1)
        k.release(ring)
    k.wgmma_wait(0)
    k.release(ring)


def promoted_loop(k: Any, ring: Any, accs: list, tmps: tuple[list, list], wg: Any, k0: Any,
                  k1: Any, *, nacc: int, steps: int, wm: int = 64, kw: int = 32,
                  cluster: int = 1, b0: Any = 0) -> None:
    """K steps k0 .. k1 (at least one) of the tile summed into `accs` in two levels, for
    fp8, whose products the tensor cores add in limited precision (about 14 bits): each
    stage's wgmmas start one of two temporary accumulators afresh (`tmps`, each like `accs`:
    an f32[nacc] per m64 accumulator), and once its group has retired the temporary is added
    into `accs` in f32 (which the caller has zeroed), so no fp8 sum runs past one stage.

    The steps go in pairs, one temporary each: both groups are issued, the first is waited
    for (wgmma_wait(1)), released and added while the second runs, then the second; an odd
    count leaves one step, issued and added alone. No group is in flight across the loop's
    back edge: with stage i + 1's group issued in one trip and stage i's added in the next
    (the earlier form), ptxas cannot tell which temporary is in flight and serialises every
    wgmma, waiting for each k-step (C7514 "wgmma.mma_async instructions are serialized").
    The sums are added in step order either way. `cluster` and `b0` as wgmma_group takes
    them."""
    def issue(tmp: list) -> None:
        k.wait(ring)
        wgmma_group(k, ring, tmp, wg, steps=steps, first=True, wm=wm, kw=kw, cluster=cluster,
                    b0=b0)

    def retire(tmp: list, pending: int) -> None:
        """Wait for the group before the `pending` newest, hand back its stage, add it."""
        k.wgmma_wait(pending)
        k.release(ring)
        for r, (acc, t) in enumerate(zip(accs, tmp, strict=True)):
            with k.for_(f"p{r}" if r else "p", 0, nacc, unroll=True) as e:
                acc[e] = acc[e] + t[e]

    t0, t1 = tmps
    with k.for_("kt", k0, k1 - 1, 2):  # steps kt (into t0) and kt + 1 (into t1)
        issue(t0)
        issue(t1)
        retire(t0, 1)
        retire(t1, 0)
    # a loop of one trip or none, not an if: a release's threads must be known
    with k.for_("ke", 0, (k1 - k0) % 2):  # an odd count: the last step
        issue(t0)
        retire(t0, 0)


def block_scaled_loop(k: Any, ring: Any, accs: list, tmps: list, wg: Any, ktiles: Any,
                      sfb: Any, sb_row: Any, row: Any, *, nacc: int, wm: int = 64,
                      consumers: int = 2, pingpong: bool = True, cluster: int = 1,
                      sa_first: Any = 0) -> None:
    """K blocks 0 .. ktiles of the tile summed into `accs` (zeroed by the caller) with
    DeepGEMM's block scales: each stage (K = 128) is multiplied into the temporaries `tmps`
    (an f32[nacc] per m64 accumulator) and, once its group has retired, promoted: acc += tmp
    * sa[row] * sb, so the tensor cores' limited-precision fp8 accumulation never runs over
    more than 128 products. sa is the stage's `sa` row scales (ring.sa[0, tile row]); sb is
    sfb[sb_row + kt], the B block's; the tile's first row's scale is at column `sa_first` of
    the stage's `sa`. `pingpong`: the `consumers` warpgroups take turns issuing
    their groups (named barriers 2 + wg, begun by first_turn and ended by last_turn), so that
    one promotes while the tensor cores run another's group."""
    mw = len(accs)
    suffix = [("" if r == 0 else str(r)) for r in range(mw)]
    with k.for_("kt", 0, ktiles) as kt:
        sb = k.let("sb", sfb[sb_row + kt])
        k.wait(ring)
        if pingpong:  # my turn: the previous warpgroup has issued its group
            k.bar_sync(2 + wg, 256)
        # a stage holds K = 128 of fp8: four k32 steps
        wgmma_group(k, ring, tmps, wg, steps=4, first=True, wm=wm, kw=32, cluster=cluster)
        if pingpong:  # the next warpgroup's turn
            k.bar_arrive(2 + (wg + 1) % consumers, 256)
        ss = []  # this thread's two rows' scales times the B block's
        for r in range(mw):
            s = k.let(f"s{suffix[r]}", type=array(f32, 2))
            for i in range(2):
                rr = wg * wm + r * 64 + row + i * 8 if r else \
                    wg * wm + row + i * 8 if i else wg * wm + row
                if not (isinstance(sa_first, int) and sa_first == 0):  # else the IR of
                    rr = rr + sa_first  # gemm_fp8.ptxdsl's twin, which has no offset
                s[i] = ring.sa[0, rr] * sb
            ss.append(s)
        k.wgmma_wait(0)
        k.release(ring)
        for r in range(mw):  # promote: acc += tmp * sa[row] * sb
            with k.for_(f"e{suffix[r]}", 0, nacc, unroll=True) as e:
                accs[r][e] = k.fma(tmps[r][e], ss[r][e % 4 / 2], accs[r][e])


def first_turn(k: Any, wg: Any, consumers: int) -> None:
    """Before the tiles of a block_scaled_loop with turns: the first turn is warpgroup 0's."""
    with k.if_(wg == consumers - 1):
        k.bar_arrive(2, 256)


def last_turn(k: Any, wg: Any) -> None:
    """After the tiles: warpgroup 0 takes the last warpgroup's final turn, so that no
    arrival is left over."""
    with k.if_(wg == 0):
        k.bar_sync(2, 256)


def count_part(k: Any, sem: Any, idx: Any, parts: Any, last: Any, wg: Any, leader: Any,
               before: Callable[[], None] | None = None) -> Any:
    """Split-K's meeting point: once every thread of warpgroup `wg` has stored its part, its
    leader counts the part on semaphore sem[idx] (acq_rel; after `before()`, if given), and
    the part that brings the count to `parts` resets it to zero for the next launch. Returns
    the predicate 'this part completed the count', the same in every thread (through
    last[wg])."""
    k.bar_sync(8 + wg, 128)  # every thread's partial is stored before the count
    with k.if_(leader):
        if before is not None:
            before()
        done = k.let("done", k.atomic_add(sem[idx], 1, "acq_rel") + 1 == parts)
        with k.if_(done):
            sem[idx] = 0  # ready for the next launch
        last[wg] = k.select(done, 1, 0)
    k.bar_sync(8 + wg, 128)
    return k.let("sum", last[wg] != 0)


def stage_c(k: Any, accs: list, cs: Any, wg: Any, row: Any, col: Any, *, bn: int,
            cw: int = 64, chunks: int, dtype: Scalar = bf16, scale: Any = None) -> None:
    """This thread's accumulators (times `scale`, if given), as `dtype`, into the warpgroup's
    swizzled staging tile cs[wg]: chunk r * chunks + h holds columns h * cw .. of m64 block
    r, 64 rows each."""
    per = cw // 8  # 8-column groups a chunk
    for r, acc in enumerate(accs):
        with k.for_(f"j{r}" if r else "j", 0, bn // 8, unroll=True) as j:
            with k.for_(f"i{r}" if r else "i", 0, 2, unroll=True) as i:
                x0, x1 = acc[4 * j + 2 * i], acc[4 * j + 2 * i + 1]
                if scale is not None:
                    x0, x1 = x0 * scale, x1 * scale
                cs[wg, r * chunks + j / per if r else j / per, row + i * 8,
                   j % per * 8 + col] = getattr(k, f"{dtype}x2")(x0.to(dtype), x1.to(dtype))


def store_c(k: Any, accs: list, cs: Any, c: Any, m0: Any, n0: Any, wg: Any, leader: Any,
            row: Any, col: Any, *, bn: int, wm: int = 64, cw: int = 64, chunks: int,
            dtype: Scalar = bf16, scale: Any = None) -> None:
    """The epilogue: the warpgroup's rows of the tile at (m0, n0) into C through the staging
    tile (stage_c) and TMA stores of a chunk each, left in flight (the next tile's main loop
    runs under them; the staging tile is reused once they have read it)."""
    with k.if_(leader):
        k.bulk_wait_read(0)
    k.bar_sync(8 + wg, 128)
    stage_c(k, accs, cs, wg, row, col, bn=bn, cw=cw, chunks=chunks, dtype=dtype, scale=scale)
    k.fence_proxy_async()
    k.bar_sync(8 + wg, 128)
    with k.if_(leader):
        for r in range(len(accs)):
            with k.for_(f"h{r}" if r else "h", 0, chunks, unroll=True) as h:
                m1 = m0 + wg * wm + r * 64 if r else m0 + wg * wm
                k.tma_store(c, [(n0 + h * cw).to(s32), m1.to(s32)],
                            cs[wg, r * chunks + h if r else h])
        k.bulk_commit()
