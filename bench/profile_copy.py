"""Run each streaming copy once at a given size, between cudaProfilerStart/Stop, for `ncu`:

    ncu --profile-from-start off --clock-control none --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis python -m bench.profile_copy [MiB]

Copies, in order: cudaMemcpy D2D (torch copy_; no kernel to profile when the copy engine does
it), the Triton load/store copy, ptxdsl's vector_copy (1024 threads x 4 loads in flight, one
chunk per CTA; 256 threads x 8 on a persistent grid), and the TMA stream_copy (4 stages of
32 x 256, persistent). Each is warmed up and checked before the profiled run."""

from __future__ import annotations

import argparse

from . import refs
from .common import check_equal, sms, twin


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_copy", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mib", type=int, nargs="?", default=1024, help="MiB to copy")
    a = ap.parse_args(argv)
    import torch

    from ptxdsl.runtime import TensorMap

    stream_copy, vector_copy = twin("stream_copy"), twin("vector_copy")
    src = torch.randint(-30000, 30000, (a.mib << 19,), dtype=torch.int16, device="cuda")
    dst = torch.empty_like(src)
    words, dwords = src.view(torch.uint32), dst.view(torch.uint32)
    runs = [("memcpy", lambda: dst.copy_(src))]
    tri = refs.triton_copy()
    if tri is not None:
        runs.append(("triton", lambda: tri(src, dst, 8192, 8)))
    for threads, unroll, one_chunk_per_cta in ((1024, 4, True), (256, 8, False)):
        k = vector_copy.make_vector_copy(threads, unroll, name=f"vcopy_{threads}_{unroll}")
        n = words.numel() // vector_copy.chunk_words(threads, unroll)
        launch = k.program().kernel()[n if one_chunk_per_cta else sms() * 2048 // threads]
        runs.append((k.name, lambda la=launch, n=n: la(words, dwords, n)))
    rows = src.numel() // stream_copy.COLS
    s2, d2 = src.view(rows, stream_copy.COLS), dst.view(rows, stream_copy.COLS)
    tm_s = TensorMap(s2, box=(32, stream_copy.COLS), dtype="bf16")
    tm_d = TensorMap(d2, box=(32, stream_copy.COLS), dtype="bf16")
    tma = stream_copy.make_stream_copy(4, 32).program().kernel()[sms() * 3]
    runs.append(("stream_copy", lambda: tma(tm_s, tm_d, rows // 32)))
    for name, fn in runs:
        dst.fill_(0)
        fn()
        torch.cuda.synchronize()
        check_equal(name, dst, src)
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        print("profiled", name, flush=True)


if __name__ == "__main__":
    main()
