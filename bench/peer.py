"""GPU-to-GPU copy bandwidth: ptxdsl TMA copies (samples/peer_copy.py) against the copy
engine and an SM copy. Needs two GPUs.

    NCCL_NVLS_ENABLE=0 python -m bench peer [--sizes all] [--sweep] [--vmm] [--quick]

Both directions are issued by GPU 0: push (GPU 0 -> GPU 1 memory) and pull (GPU 1 -> GPU 0).
Memory is torch's cudaMalloc with peer access on. Rows per size: the copy engine
(cuMemcpyPeerAsync, what cudaMemcpyPeerAsync does; torch's cross-device copy_), ptxdsl's TMA
bulk and tile copies on at most a quarter of the SMs, an SM load/store copy. Throughput:
copies queued back to back behind a sleep kernel; latency: one copy alone on an idle stream.
Every result is checked against its source at every size before it is timed. `--sweep`
adds chunk / stage configurations and the 256 MiB sweep over CTA counts, `--vmm` VMM memory."""

from __future__ import annotations

import argparse
from typing import Any

from .common import BenchError, Row, Section, Unavailable, alone_ms, queued_ms, sh, twin

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
BULK = ((1024, 8), (4096, 4))  # (u32 words a chunk, stages)
BULK_SWEEP = ((1024, 8), (4096, 4), (8192, 4), (8192, 6))
SIZES = (64 * KiB, MiB, 16 * MiB, 256 * MiB, GiB)
ALONE = (64 * KiB, MiB)  # sizes also timed one copy alone
ABOUT = ("Two H200 linked by NV18 (18 NVLink 4 links, 478 GB/s each way), NVLink multicast "
         "off; GB/s counts bytes copied one way. The copy engine (`cuMemcpyPeerAsync`) is the "
         "strongest reference at every size (torch's `copy_` adds stream syncs); ptxdsl: the "
         "best TMA copy on at most a quarter of the SMs. Throughput rows: copies queued back "
         "to back; \"alone\" rows: one copy on an idle stream (us).")
LIMITS = ("the link protocol for SM-issued traffic, not the SMs: TMA saturates at 33 CTAs and "
          "an SM copy on all 132 SMs reaches the same ceiling, ~77% (writes) and ~78% (reads) "
          "of the link against the copy engine's 83%; chunk size and stage count move it "
          "1-2%. Queued small pushes cost the copy engine 2.7 us, a kernel ~3 us.")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", default="", help="'all': every power of two from 64 KiB to "
                   "1 GiB (default: 64 KiB, 1 MiB, 16 MiB, 256 MiB, 1 GiB)")
    p.add_argument("--sweep", action="store_true", help="more bulk configurations, CTA sweep")
    p.add_argument("--vmm", action="store_true", help="also 256 MiB on VMM memory")
    p.add_argument("--quick", action="store_true", help="sizes up to 256 MiB")


def size_name(n: int) -> str:
    return f"{n // GiB} GiB" if n >= GiB else f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB"


def run(a: argparse.Namespace) -> list[Section]:
    import torch

    from ptxdsl import runtime as rt

    if torch.cuda.device_count() < 2:
        raise Unavailable("the GPU-to-GPU copies need two GPUs")
    pc = twin("peer_copy")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    quarter = sms // 4
    rt.enable_all_peer_access([0, 1])
    drv = rt.driver.driver()
    ctx = [rt.driver.device_context(d).handle for d in (0, 1)]
    top = 256 * MiB if a.quick else GiB
    sizes = [64 * KiB << i for i in range((top // (64 * KiB)).bit_length())] \
        if a.sizes == "all" else [n for n in SIZES if n <= top]
    buf = {d: torch.randint(-2**31, 2**31 - 1, (top // 4,), dtype=torch.int32,
                            device=f"cuda:{d}") for d in (0, 1)}
    out = {d: torch.empty_like(buf[d]) for d in (0, 1)}
    stream = torch.cuda.Stream(device=0)
    bulk = [(w, st, pc.make_bulk_copy(w, st).program().kernel(device=0))
            for w, st in (BULK_SWEEP if a.sweep else BULK)]
    tile = pc.peer_copy_tile.program().kernel(device=0)
    smk = pc.sm_copy.program().kernel(device=0)
    s = Section("peer", "GPU-to-GPU copies", ABOUT, limits=LIMITS)
    s.notes.append("GPUs: " + sh("nvidia-smi", "--query-gpu=index,name,driver_version,"
                                 "clocks.max.sm", "--format=csv,noheader").replace("\n", "; "))
    for direction, (sd, dd) in (("push GPU 0 -> 1", (0, 1)), ("pull GPU 1 -> 0", (1, 0))):
        cmd = "NCCL_NVLS_ENABLE=0 python -m bench peer" + (" --sizes all" if a.sizes else "")
        for n in sizes:
            src, dst = buf[sd], out[dd]
            sp, dp = rt.DevicePointer(src.data_ptr()), rt.DevicePointer(dst.data_ptr())
            methods = methods_for(n, sp, dp, sd, dd, src, dst, stream, drv, ctx, bulk, tile,
                                  smk, quarter, sms, pc)
            reps = 50 if n <= 4 * MiB else 20 if n <= 64 * MiB else 5
            ms, alone = {}, {}
            for name, fn in methods.items():
                dst[: n // 4].fill_(0)
                torch.cuda.synchronize(dd)
                fn()
                torch.cuda.synchronize(0)
                if not torch.equal(dst[: n // 4], src[: n // 4].to(dst.device)):
                    raise BenchError(f"{name} copied {n} bytes wrongly ({direction})")
                ms[name] = queued_ms(fn, reps, stream)
                if n in ALONE and name in ("CE cuMemcpyPeerAsync", f"TMA bulk "
                                           f"{bulk[0][0] * 4 // KiB}K x{bulk[0][1]}"):
                    alone[name] = alone_ms(fn, stream)
            tma = min((m for m in ms if m.startswith("TMA")), key=ms.__getitem__)
            ce = "CE cuMemcpyPeerAsync"
            s.rows.append(Row(f"{direction}, {size_name(n)}", f"{tma}, <= {quarter} CTAs",
                              n / ms[tma] / 1e6, ce, n / ms[ce] / 1e6, "GB/s", cmd,
                              target=0.95 if n >= 256 * MiB else None))
            if alone:
                t = next(m for m in alone if m.startswith("TMA"))
                s.rows.append(Row(f"{direction}, {size_name(n)}, one copy alone", t,
                                  alone[t] * 1e3, ce, alone[ce] * 1e3, "us", cmd,
                                  target=1.0 if n < MiB else None))
    if a.sweep:
        s.notes += cta_sweep(bulk, buf, out, stream, sms, drv, ctx)
    del buf, out
    torch.cuda.empty_cache()
    if a.vmm:
        s.notes += vmm_notes(next(k for w, st, k in bulk if (w, st) == (4096, 4)), stream,
                             quarter, drv)
    return [s]


def methods_for(n: int, sp: Any, dp: Any, sd: int, dd: int, src: Any, dst: Any, stream: Any,
                drv: Any, ctx: list, bulk: list, tile: Any, smk: Any, quarter: int, sms: int,
                pc: Any) -> dict[str, Any]:
    """Every way to copy n bytes from sp to dp that fits n, by name."""
    import torch

    from ptxdsl import runtime as rt

    def ce():
        r = drv.cuMemcpyPeerAsync(dp.address, ctx[dd], sp.address, ctx[sd], n,
                                  stream.cuda_stream)
        assert r[0] == 0, r

    def torch_copy():
        with torch.cuda.stream(stream):
            dst[: n // 4].copy_(src[: n // 4], non_blocking=True)

    out = {"CE cuMemcpyPeerAsync": ce, "CE torch copy_": torch_copy}
    for w, st, k in bulk:
        if n % (w * 4) == 0:
            out[f"TMA bulk {w * 4 // KiB}K x{st}"] = \
                lambda k=k, c=w * 4: k[min(quarter, n // c), None, stream](sp, dp, n // c)
    rows = n // (pc.COLS * 4)
    if rows % pc.ROWS == 0:
        maps = [rt.TensorMap(p, (pc.ROWS, pc.COLS), dtype="f32", shape=(rows, pc.COLS),
                             device=0) for p in (sp, dp)]
        out[f"TMA tile {pc.ROWS}x{pc.COLS} x4"] = lambda: tile[
            min(quarter, rows // pc.ROWS), None, stream](maps[0], maps[1], rows // pc.ROWS)
    out[f"SM copy {quarter} CTAs"] = lambda: smk[quarter, None, stream](sp, dp, n // 16)
    out["SM copy all SMs"] = lambda: smk[sms * 8, None, stream](sp, dp, n // 16)
    return out


def cta_sweep(bulk: list, buf: dict, out: dict, stream: Any, sms: int, drv: Any,
              ctx: list) -> list[str]:
    """256 MiB through each bulk configuration on 4 .. all SMs: where the bandwidth saturates."""
    from ptxdsl import runtime as rt

    n = 256 * MiB
    grids = [g for g in (4, 8, 16, sms // 4, sms // 2, sms) if g <= sms]
    lines = ["256 MiB by CTA count (GB/s):", ""]
    for direction, (sd, dd) in (("push", (0, 1)), ("pull", (1, 0))):
        sp, dp = rt.DevicePointer(buf[sd].data_ptr()), rt.DevicePointer(out[dd].data_ptr())
        ce = queued_ms(lambda sp=sp, dp=dp, sd=sd, dd=dd: drv.cuMemcpyPeerAsync(
            dp.address, ctx[dd], sp.address, ctx[sd], n, stream.cuda_stream), 5, stream)
        for w, st, k in bulk:
            bw = [n / queued_ms(lambda k=k, g=g, sp=sp, dp=dp, c=w * 4:
                                k[g, None, stream](sp, dp, n // c), 5, stream) / 1e6
                  for g in grids]
            lines.append(f"- {direction}, bulk {w * 4 // KiB}K x{st}: " + ", ".join(
                f"{g} CTAs {v:.1f}" for g, v in zip(grids, bw, strict=True)) +
                f"; CE {n / ce / 1e6:.1f}")
    return lines


def vmm_notes(k: Any, stream: Any, quarter: int, drv: Any) -> list[str]:
    """256 MiB between VMM allocations (one on each GPU, both mapped for both GPUs)."""
    import numpy as np
    import torch

    from ptxdsl import runtime as rt

    n = 256 * MiB
    host = np.random.default_rng(1).integers(0, 1 << 32, n // 4, dtype=np.uint32)
    lines = []
    with rt.vmm_alloc(n, 0, access=[0, 1]) as a0, rt.vmm_alloc(n, 1, access=[0, 1]) as a1:
        a = {0: a0, 1: a1}
        for direction, (sd, dd) in (("push", (0, 1)), ("pull", (1, 0))):
            src, dst = a[sd].array(n // 4, "u32", device=0), a[dd].array(n // 4, "u32", device=0)
            src.copy_from_host(host)

            def ce(src=src, dst=dst):
                assert drv.cuMemcpyDtoDAsync(dst.ptr, src.ptr, n, stream.cuda_stream)[0] == 0

            def tma(src=src, dst=dst):
                k[quarter, None, stream](src, dst, n // 16384)

            ms = []
            for fn in (ce, tma):
                dst.copy_from_host(np.zeros(n // 4, np.uint32))
                fn()
                torch.cuda.synchronize(0)
                if not np.array_equal(dst.copy_to_host(), host):
                    raise BenchError(f"a copy on VMM memory was wrong ({direction})")
                ms.append(queued_ms(fn, 5, stream))
            lines.append(f"256 MiB on VMM memory, {direction}: CE {n / ms[0] / 1e6:.1f} GB/s, "
                         f"TMA bulk 16K x4 {n / ms[1] / 1e6:.1f} GB/s ({ms[0] / ms[1]:.2f}x).")
    return lines
