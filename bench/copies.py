"""Streaming copy of 2 GiB: ptxdsl's copies against cudaMemcpy D2D and a Triton copy.

    python -m bench copy [--sweep] [--quick]

Every copy is checked bit for bit before it is timed (median of 30 CUDA-event-timed runs,
each launch alone); GB/s count bytes read plus written. By default the four fastest designs
of the last sweep run (one chunk or tile per CTA); `--sweep` measures all 46 variants
(thread counts, loads in flight, cache qualifiers, persistent and one-shot grids, TMA tiles
and 1D bulk copies) and lists them."""

from __future__ import annotations

import argparse
from typing import Any

import ptxdsl

from . import refs
from .common import Row, Section, check_equal, ctas_per_sm, median_ms, sms, twin

ABOUT = ("2 GiB, bf16 rows of 256; GB/s = bytes read + written / median of 30 "
         "CUDA-event-timed runs, each copy checked bit for bit first. References: cudaMemcpy "
         "D2D (torch `copy_`), a Triton load/store copy (best of 3 block shapes).")
LIMITS = ("the grid, not the data path: copies whose CTAs each move one chunk and exit reach "
          "4030-4214 GB/s whatever the instructions (16-byte ld/st, one-stage TMA tile, 1D "
          "bulk); persistent grid-stride pipelines stay at 3600-4000. Cache qualifiers lose "
          "0-9%. Nsight Compute at 1 GiB: vector_copy 87.8% of DRAM peak, Triton 84.5%; "
          "cudaMemcpy runs on the copy engine (no kernel to profile).")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sweep", action="store_true", help="all 46 ptxdsl variants")
    p.add_argument("--quick", action="store_true", help="256 MiB, fewer runs")


# (threads, loads in flight, load qualifier, store qualifier, grids) of vector_copy; grid
# "full": every resident CTA, "half": half of them, "all": one chunk per CTA
VECTOR_DEFAULT = ((1024, 4, "", "", ("all",)), (512, 4, "", "", ("all",)))
VECTOR_SWEEP = (
    *((t, u, "", "", ("full", "half", "all")) for t, u in
      ((256, 4), (256, 8), (512, 4), (512, 8), (1024, 4), (128, 8), (128, 16))),
    *((t, u, ld, st, ("full",)) for t, u in ((256, 8), (512, 4), (128, 16))
      for ld, st in ((".nc.L1::no_allocate", ".cs"), (".L2::256B", ""),
                     (".nc.L1::no_allocate.L2::256B", ""), ("", ".cs"), (".lu", ".cs"))),
)
# (stages, box rows, L2 promotion, grid) of the TMA stream_copy
TILE_DEFAULT = ((1, 32, "none", "all"),)
TILE_SWEEP = ((4, 32, "none", "full"), (3, 128, "256B", "full"), (8, 16, "256B", "full"),
              (1, 32, "none", "all"), (1, 64, "256B", "all"), (1, 128, "256B", "all"))
# (stages, chunk bytes, grid) of the 1D bulk copy
BULK_DEFAULT = ((1, 16384, "all"),)
BULK_SWEEP = ((4, 16384, "full"), (2, 65536, "full"), (1, 16384, "all"), (1, 32768, "all"))


def run(a: argparse.Namespace) -> list[Section]:
    import torch

    from ptxdsl.runtime import TensorMap

    sc, vc = twin("stream_copy"), twin("vector_copy")
    total = (256 if a.quick else 2048) << 20
    reps = 10 if a.quick else 30
    rows = total // (2 * sc.COLS)
    src = torch.randint(-30000, 30000, (rows, sc.COLS), dtype=torch.int16, device="cuda") \
        .view(torch.bfloat16)
    dst = torch.empty_like(src)
    nbytes = 2 * src.numel() * 2

    def checked(what: str, fn: Any) -> float:
        dst.view(torch.int16).fill_(-1)
        fn()
        torch.cuda.synchronize()
        check_equal(what, dst, src)
        return median_ms(fn, reps)

    refs_ms = {"cudaMemcpy D2D (torch copy_)": checked("memcpy", lambda: dst.copy_(src))}
    tri = refs.triton_copy()
    if tri is not None:
        s16, d16 = src.view(torch.int16).view(-1), dst.view(torch.int16).view(-1)
        for block, warps in ((4096, 4), (8192, 8), (16384, 8)):
            refs_ms[f"Triton copy, BLOCK {block}, {warps} warps"] = checked(
                "Triton copy", lambda b=block, w=warps: tri(s16, d16, b, w))

    ours: dict[str, float] = {}
    words, dwords = src.view(torch.uint32).view(-1), dst.view(torch.uint32).view(-1)

    def grid_of(k: Any, g: str, nchunks: int) -> int:
        per_sm = ctas_per_sm(k.info)
        return {"full": sms() * per_sm, "half": sms() * max(1, per_sm // 2), "all": nchunks}[g]

    for i, (threads, unroll, ld, st, grids) in enumerate(VECTOR_SWEEP if a.sweep
                                                         else VECTOR_DEFAULT):
        k = vc.make_vector_copy(threads, unroll, ld, st,
                                name=f"vcopy_{threads}_{unroll}_{i}").program().kernel()
        nchunks = words.numel() // vc.chunk_words(threads, unroll)
        for g in grids:
            launch = k[grid_of(k, g, nchunks)]
            quals = f", ld{ld} st{st}" if ld or st else ""
            ours[f"vector_copy {threads} threads x {unroll} x 16 B{quals}, grid "
                 f"{grid_of(k, g, nchunks)}{' (one chunk a CTA)' if g == 'all' else ''}"] = \
                checked("vector_copy", lambda la=launch, c=nchunks: la(words, dwords, c))
    for stages, box_rows, l2, g in TILE_SWEEP if a.sweep else TILE_DEFAULT:
        k = sc.make_stream_copy(stages, box_rows).program().kernel()
        maps = [TensorMap(t, box=(box_rows, sc.COLS), dtype=ptxdsl.bf16, l2_promotion=l2)
                for t in (src, dst)]
        ntiles = rows // box_rows
        launch = k[grid_of(k, g, ntiles)]
        ours[f"stream_copy (TMA) {stages} x {box_rows}x256, L2 {l2}, grid "
             f"{grid_of(k, g, ntiles)}{' (one tile a CTA)' if g == 'all' else ''}"] = \
            checked("stream_copy", lambda la=launch, m=maps, n=ntiles: la(m[0], m[1], n))
    for stages, chunk, g in BULK_SWEEP if a.sweep else BULK_DEFAULT:
        # samples/peer_copy's pipelined 1D bulk copy, here within one GPU
        k = twin("peer_copy").make_bulk_copy(chunk // 4, stages).program().kernel()
        n = 4 * words.numel() // chunk
        launch = k[grid_of(k, g, n)]
        ours[f"1D bulk copy {stages} x {chunk >> 10} KiB, grid {grid_of(k, g, n)}"
             f"{' (one chunk a CTA)' if g == 'all' else ''}"] = \
            checked("bulk copy", lambda la=launch, n=n: la(words, dwords, n))

    def gbs(ms: float) -> float:
        return nbytes / ms / 1e6

    best_ref = min(refs_ms, key=refs_ms.__getitem__)
    best = min(ours, key=ours.__getitem__)
    s = Section("copy", f"Streaming copy, {total >> 20} MiB", ABOUT, limits=LIMITS)
    s.rows.append(Row(f"copy {total >> 20} MiB", best, gbs(ours[best]), best_ref,
                      gbs(refs_ms[best_ref]), "GB/s", "python -m bench copy", target=0.97))
    s.notes.append(f"{len(ours)} ptxdsl variants measured (`--sweep`: 46), fastest first "
                   "(GB/s): " + ", ".join(f"{name} {gbs(ms):.0f}" for name, ms in
                                          sorted(ours.items(), key=lambda kv: kv[1])[:8]) + ".")
    return [s]
