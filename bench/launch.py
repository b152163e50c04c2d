"""Host launch cost: a kernel taking a tensor map, a tensor and a u32, launched by ptxdsl,
cupy's RawKernel, torch and Triton, and by C (bench/launch.c, the driver's floor).

    python -m bench launch [--calls 2000]

Every launcher is timed the same way (ptxdsl.runtime.launch_overhead_us: each call timed
alone, the queue drained every 50 calls); medians in microseconds."""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import threading
from pathlib import Path

import ptxdsl
from ptxdsl import b16, bf16, ptr, tmap, u32

from . import refs
from .common import Row, Section

HERE = Path(__file__).resolve().parent
ABOUT = ("Median host microseconds per call, each call timed alone and the queue drained every "
         "50 calls, for a kernel taking a tensor map, a tensor and a u32. References: cupy "
         "RawKernel, torch's elementwise op, Triton's launcher.")
LIMITS = ("the driver call itself: a C loop of `cuLaunchKernel` and cuda-bindings' "
          "`cuLaunchKernelEx` with pre-packed parameters are the floors (3.2-3.9 and 3.3-5.2 us "
          "on the hosts measured); ptxdsl adds 0.5-1.1 us of argument checks and packing plus "
          "~0.5 us of launcher code, so whether it is under 5 us depends on the host. Below "
          "the binding's floor only fewer driver calls help: a CUDA graph.")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calls", type=int, default=2000, help="timed calls per launcher")


@ptxdsl.kernel(threads=128)
def launch_probe(k, m: tmap(bf16, 2), p: ptr(b16), n: u32):
    """Does nothing unless n == 12345: the launch is all there is to time. (`p` is b16 so
    that bf16 torch tensors and uint16 cupy arrays both fit it.)"""
    with k.if_(n == 12345):
        k.tma_prefetch_desc(m)
        p[0] = p[1]


def c_launch_floor(cubin: bytes, name: str, n: int) -> float | str:
    """Median us of cuLaunchKernel from C (bench/launch.c), or why it did not run."""
    with tempfile.TemporaryDirectory() as tmp:
        exe, cub = Path(tmp) / "launch", Path(tmp) / "probe.cubin"
        cub.write_bytes(cubin)
        try:
            subprocess.run(["cc", "-O2", "-o", str(exe), str(HERE / "launch.c"), "-ldl"],
                           check=True, capture_output=True, text=True)
            out = subprocess.run([str(exe), str(cub), name, str(n)], check=True,
                                 capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as e:
            return f"did not run ({type(e).__name__}: {getattr(e, 'stderr', '') or e})"
        return float(out.stdout.strip())


def run(a: argparse.Namespace) -> list[Section]:
    import numpy as np
    import torch

    from ptxdsl.runtime import Stream, TensorMap, capture, launch_overhead_us, to_device

    def us(fn) -> float:
        return launch_overhead_us(fn, n=a.calls)

    prog = launch_probe.program()
    k = prog.kernel()
    src = torch.zeros(64, 256, dtype=torch.bfloat16, device="cuda")
    dst = torch.zeros_like(src)
    tm = TensorMap(src, box=(32, 256))
    arr = to_device(np.zeros((64, 256), np.uint16), dtype="bf16")
    refs_us: dict[str, float] = {}
    for name, fn in refs.cupy_probe() or ():
        if fn is not None:
            refs_us[name] = us(fn)
    x = torch.zeros(64, device="cuda")
    refs_us["torch elementwise x.add_(1)"] = us(lambda: x.add_(1))
    tp = refs.triton_probe()
    if tp is not None:
        refs_us["Triton (a tensor + an int)"] = us(tp)

    launch = k[1]
    bound = us(lambda: launch(tm, dst, 7))
    indexed = us(lambda: k[1](tm, dst, 7))
    with_array = us(lambda: launch(tm, arr, 7))
    packer = k._packers.get(threading.get_ident())
    packing = us(lambda: packer.fast(tm, dst, 7))
    cfg, handle, drv_launch, addr = launch._cfg, k._handle, k._launch_ex, packer.params_address
    binding = us(lambda: drv_launch(cfg, handle, addr, 0))
    floor = c_launch_floor(ptxdsl.runtime.load(prog.ptx_module).cubin, k.name, a.calls)
    with Stream(non_blocking=True) as stream:  # 100 launches captured once, replayed
        on_s = k[1, None, stream]
        on_s(tm, dst, 7)  # checked and prepared before the capture
        stream.synchronize()
        with capture(stream) as g:
            for _ in range(100):
                on_s(tm, dst, 7)
        with g:
            replay = us(g.replay)
    best_ref = min(refs_us, key=refs_us.__getitem__)
    cmd = "python -m bench launch"
    s = Section("launch", "Host launch cost", ABOUT, limits=LIMITS)
    s.rows += [
        Row("bound launcher: tensor map + torch tensor + u32", "`launch = k[1]` once", bound,
            best_ref, refs_us[best_ref], "us", cmd, target=1.0),
        Row("same, against the 5 us target", "`launch = k[1]` once", bound, "target", 5.0,
            "us", cmd, target=1.0),
        Row("`k[1](...)` indexed on every call", "torch tensor", indexed, best_ref,
            refs_us[best_ref], "us", cmd),
        Row("bound launcher with a ptxdsl DeviceArray", "DeviceArray", with_array, best_ref,
            refs_us[best_ref], "us", cmd),
    ]
    s.notes.append(
        "Floors on this host: C loop of `cuLaunchKernel` "
        + (f"{floor:.2f} us" if isinstance(floor, float) else floor)
        + f"; cuda-bindings `cuLaunchKernelEx` with pre-packed parameters {binding:.2f} us; "
        f"ptxdsl's argument checks and packing alone {packing:.2f} us. References: "
        + ", ".join(f"{n} {v:.2f} us" for n, v in refs_us.items()) + "."
        + f" A CUDA graph of 100 captured launches replays for {replay:.2f} us"
        f" ({replay / 100:.3f} us a launch).")
    return [s]
