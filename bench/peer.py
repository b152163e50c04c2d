"""GPU-to-GPU copy bandwidth: ptxdsl TMA copies against the copy engine and an SM copy.

    NCCL_NVLS_ENABLE=0 python samples/bench_peer.py [--quick] [--out results.md]

Both directions are issued by GPU 0: push (GPU 0 -> GPU 1 memory) and pull (GPU 1 -> GPU 0).
Memory is cudaMalloc'd by torch with peer access on (the "cuMemAlloc plus peer access" kind).
Rows, per size from 64 KiB to 1 GiB, in one process and one run:
  CE cuMemcpyPeerAsync   the copy engine through the driver (what cudaMemcpyPeerAsync does)
  CE torch copy_         torch's cross-device copy_ (copy engine, plus torch's stream syncs)
  TMA bulk <chunk>x<stages>, TMA tile   ptxdsl kernels, at most a quarter of the SMs
  SM copy 1/4, SM copy all   16-byte vector loads/stores, on a quarter of the SMs / all
Times: the stream is first held by a sleep kernel so that every copy is queued before the
GPU reaches it; then `reps` copies run back to back between two events, and the per-copy
time is the median of 3 such batches. GB/s counts the bytes copied (one way), 1e9 B/s.
Every method's result is checked against the source at every size before it is timed.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import peer_copy as pc  # noqa: E402

from ptxdsl import runtime as rt  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
BULK_CONFIGS = ((1024, 8), (4096, 4), (8192, 4), (8192, 6))  # (u32 words a chunk, stages)


def machine() -> list[str]:
    def sh(*cmd: str) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError) as e:
            return f"({' '.join(cmd)} failed: {e})"

    drv = rt.driver.driver()
    lines = [
        "GPUs: " + sh("nvidia-smi", "--query-gpu=index,name,driver_version,pci.bus_id,"
                      "clocks.max.sm,clocks.max.mem", "--format=csv,noheader").replace("\n", "; "),
        f"cuDriverGetVersion: {drv.cuDriverGetVersion()[1]}; torch {torch.__version__}",
        "topology (nvidia-smi topo -m):", *("    " + ln for ln in sh("nvidia-smi", "topo", "-m")
                                             .splitlines()[:4]),
    ]
    links = [ln.strip() for ln in sh("nvidia-smi", "nvlink", "-s", "-i", "0").splitlines()]
    lines.append("GPU 0 NVLink (nvidia-smi nvlink -s): " + (f"{len(links) - 1} links, "
                 + links[1] if len(links) > 1 else "n/a"))
    return lines


def latency(fn, stream: torch.cuda.Stream, trials: int = 30) -> float:
    """Median time in ms of one copy alone: each sits between two events after a short
    sleep kernel, so it starts on an idle stream and nothing overlaps its start or end."""
    fn()
    torch.cuda.synchronize(0)
    pairs = []
    with torch.cuda.stream(stream):
        torch.cuda._sleep(5_000_000)
        for _ in range(trials):
            torch.cuda._sleep(20_000)  # ~10 us gap
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(stream)
            fn()
            b.record(stream)
            pairs.append((a, b))
    pairs[-1][1].synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in pairs)


def timed(fn, reps: int, stream: torch.cuda.Stream) -> float:
    """Median over 3 batches of the per-copy time in ms of `reps` back-to-back copies."""
    fn()
    torch.cuda.synchronize(0)
    out = []
    for _ in range(3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            torch.cuda._sleep(5_000_000)  # ~2.5 ms: the host queues everything meanwhile
            a.record(stream)
            for _ in range(reps):
                fn()
            b.record(stream)
        b.synchronize()
        out.append(a.elapsed_time(b) / reps)
    return statistics.median(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer sizes")
    ap.add_argument("--out", help="also write the Markdown tables here")
    args = ap.parse_args()
    if torch.cuda.device_count() < 2:
        print("bench_peer needs two GPUs")
        return 1
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    quarter = sms // 4
    rt.enable_all_peer_access([0, 1])
    drv = rt.driver.driver()
    ctx = [rt.driver.device_context(d).handle for d in (0, 1)]
    top = 256 * MiB if args.quick else GiB
    sizes = [64 * KiB << i for i in range((top // (64 * KiB)).bit_length())]
    buf = {d: torch.randint(-2**31, 2**31 - 1, (top // 4,), dtype=torch.int32,
                            device=f"cuda:{d}") for d in (0, 1)}
    out = {d: torch.empty_like(buf[d]) for d in (0, 1)}
    stream = torch.cuda.Stream(device=0)
    s_handle = stream.cuda_stream
    bulk = [(w, s, pc.make_bulk_copy(w, s).program().kernel(device=0)) for w, s in BULK_CONFIGS]
    tile = pc.peer_copy_tile.program().kernel(device=0)
    smk = pc.sm_copy.program().kernel(device=0)
    lat: dict[tuple, float] = {}
    report = [f"## GPU-to-GPU copies ({datetime.date.today()}, samples/bench_peer.py)", "",
              *(f"    {ln}" for ln in machine()), ""]

    for direction, (sd, dd) in (("push GPU 0 -> GPU 1", (0, 1)), ("pull GPU 1 -> GPU 0", (1, 0))):
        names = ["CE cuMemcpyPeerAsync", "CE torch copy_",
                 *(f"TMA bulk {w * 4 // KiB}K x{s}" for w, s in BULK_CONFIGS),
                 "TMA tile 16x256 x4", f"SM copy {quarter} CTAs", "SM copy all SMs"]
        rows = []
        lat_names = (names[0], names[2], names[-2])
        for n in sizes:
            src, dst = buf[sd], out[dd]
            sp, dp = rt.DevicePointer(src.data_ptr()), rt.DevicePointer(dst.data_ptr())

            def ce(n=n, sp=sp, dp=dp, sd=sd, dd=dd):
                r = drv.cuMemcpyPeerAsync(dp.address, ctx[dd], sp.address, ctx[sd], n, s_handle)
                assert r[0] == 0, r

            def torch_copy(n=n, src=src, dst=dst):
                with torch.cuda.stream(stream):
                    dst[: n // 4].copy_(src[: n // 4], non_blocking=True)

            methods = [ce, torch_copy]
            for w, _s, k in bulk:
                chunk = w * 4

                def tma_bulk(k=k, n=n, sp=sp, dp=dp, chunk=chunk):
                    k[min(quarter, n // chunk), None, stream](sp, dp, n // chunk)

                methods.append(tma_bulk if n % chunk == 0 else None)
            rows_n = n // (pc.COLS * 4)
            maps = None
            if rows_n % pc.ROWS == 0:
                maps = [rt.TensorMap(p, (pc.ROWS, pc.COLS), dtype="f32",
                                     shape=(rows_n, pc.COLS), device=0) for p in (sp, dp)]

            def tma_tile(maps=maps, rows_n=rows_n):
                tile[min(quarter, rows_n // pc.ROWS), None, stream](maps[0], maps[1],
                                                                    rows_n // pc.ROWS)

            methods.append(tma_tile if maps else None)

            def sm(grid, n=n, sp=sp, dp=dp):
                return lambda: smk[grid, None, stream](sp, dp, n // 16)

            methods += [sm(quarter), sm(sms * 8)]
            reps = 50 if n <= 4 * MiB else 20 if n <= 64 * MiB else 5
            times = []
            for name, fn in zip(names, methods, strict=True):
                if fn is None:
                    times.append(None)
                    continue
                dst[: n // 4].fill_(0)
                torch.cuda.synchronize(dd)
                fn()
                torch.cuda.synchronize(0)
                if not torch.equal(dst[: n // 4], src[: n // 4].to(dst.device)):
                    print(f"MISMATCH: {name} at {n} bytes ({direction})")
                    return 1
                times.append(timed(fn, reps, stream))
                if n <= MiB and name in (names[0], names[2], names[-2]):
                    lat[(direction, n, name)] = latency(fn, stream)
            rows.append((n, times))
            print(direction, n, [None if t is None else round(n / t / 1e6, 1) for t in times],
                  flush=True)
        report += table(direction, names, rows, quarter, sms)
        report += [f"#### {direction}: one copy alone (us, median of 30)", "",
                   "| size | " + " | ".join(lat_names) + " |", "|---|" + "---|" * len(lat_names)]
        report += [f"| {n // KiB} KiB | " + " | ".join(
            f"{lat[(direction, n, nm)] * 1e3:.1f}" for nm in lat_names) + " |"
            for n in sizes if n <= MiB] + [""]
    report += sweep(bulk, buf, out, stream, sms, drv, ctx, s_handle)
    del buf, out
    torch.cuda.empty_cache()
    try:
        report += vmm_rows(bulk[1][2], stream, quarter, drv, s_handle)
    except Exception as e:  # a record of what failed beats losing the tables above
        report += [f"VMM rows failed: {type(e).__name__}: {e}", ""]
    text = "\n".join(report) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


def sweep(bulk, buf, out, stream, sms, drv, ctx, s_handle) -> list[str]:
    """256 MiB through each bulk configuration on 8 .. all SMs: where the bandwidth saturates."""
    n = 256 * MiB
    grids = [g for g in (4, 8, 16, sms // 4, sms // 2, sms) if g <= sms]
    lines = ["### 256 MiB by CTA count (GB/s; one CTA per SM)", "",
             "| direction | config | " + " | ".join(f"{g} CTAs" for g in grids) + " | CE |",
             "|---|---|" + "---|" * (len(grids) + 1)]
    for direction, (sd, dd) in (("push", (0, 1)), ("pull", (1, 0))):
        sp, dp = rt.DevicePointer(buf[sd].data_ptr()), rt.DevicePointer(out[dd].data_ptr())
        ce_ms = timed(lambda sp=sp, dp=dp, sd=sd, dd=dd: drv.cuMemcpyPeerAsync(
            dp.address, ctx[dd], sp.address, ctx[sd], n, s_handle), 5, stream)
        for w, s, k in bulk:
            chunk = w * 4
            row = []
            for g in grids:
                ms = timed(lambda k=k, g=g, sp=sp, dp=dp, chunk=chunk:
                           k[g, None, stream](sp, dp, n // chunk), 5, stream)
                row.append(f"{n / ms / 1e6:.1f}")
            lines.append(f"| {direction} | bulk {chunk // KiB}K x{s} | " + " | ".join(row) +
                         f" | {n / ce_ms / 1e6:.1f} |")
    return [*lines, ""]


def vmm_rows(k, stream, quarter, drv, s_handle) -> list[str]:
    """256 MiB between VMM allocations (one on each GPU, both mapped for both GPUs)."""
    import numpy as np

    n = 256 * MiB
    a = {d: rt.vmm_alloc(n, d, access=[0, 1]) for d in (0, 1)}
    host = np.random.default_rng(1).integers(0, 1 << 32, n // 4, dtype=np.uint32)
    lines = ["### 256 MiB on VMM memory (cuMemCreate on each GPU, mapped for both)", "",
             "| direction | CE cuMemcpyDtoDAsync GB/s | TMA bulk 16K x4, "
             f"{quarter} CTAs GB/s | TMA / CE |", "|---|---|---|---|"]
    for direction, (sd, dd) in (("push GPU 0 -> GPU 1", (0, 1)), ("pull GPU 1 -> GPU 0", (1, 0))):
        src, dst = a[sd].array(n // 4, "u32", device=0), a[dd].array(n // 4, "u32", device=0)
        src.copy_from_host(host)
        rt.check_reachable(src, 0)
        rt.check_reachable(dst, 0)

        def ce(src=src, dst=dst):
            assert drv.cuMemcpyDtoDAsync(dst.ptr, src.ptr, n, s_handle)[0] == 0

        def tma(src=src, dst=dst):
            k[quarter, None, stream](src, dst, n // 16384)

        ms = []
        for fn in (ce, tma):
            dst.copy_from_host(np.zeros(n // 4, np.uint32))
            fn()
            torch.cuda.synchronize(0)
            if not np.array_equal(dst.copy_to_host(), host):
                return [*lines, f"MISMATCH on VMM memory ({direction})", ""]
            ms.append(timed(fn, 5, stream))
        lines.append(f"| {direction} | {n / ms[0] / 1e6:.1f} | {n / ms[1] / 1e6:.1f} | "
                     f"{ms[0] / ms[1]:.2f}x |")
    for x in a.values():
        x.free()
    return [*lines, ""]


def table(direction: str, names: list[str], rows: list, quarter: int, sms: int) -> list[str]:
    def size(n: int) -> str:
        return f"{n // GiB} GiB" if n >= GiB else f"{n // MiB} MiB" if n >= MiB else \
            f"{n // KiB} KiB"

    tma_cols = [i for i, nm in enumerate(names) if nm.startswith("TMA")]
    head = ["size", *names, "best TMA / CE", "best TMA us", "CE us"]
    lines = [f"### {direction} (GB/s; TMA at most {quarter} of {sms} SMs)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n, times in rows:
        bw = ["-" if t is None else f"{n / t / 1e6:.1f}" for t in times]
        best = min(times[i] for i in tma_cols if times[i] is not None)
        lines.append(f"| {size(n)} | " + " | ".join(bw) +
                     f" | {times[0] / best:.2f}x | {best * 1e3:.1f} | {times[0] * 1e3:.1f} |")
    return [*lines, ""]


if __name__ == "__main__":
    raise SystemExit(main())
