"""What the GEMMs run at under the power cap: each contender (checked against an f32
reference first) runs alone for a few seconds, in turns, while nvidia-smi samples this GPU's
SM clock, board power and active clock-throttle reasons; the table gives TFLOP/s, the mean
clock and TFLOP/s per GHz (work per clock), both over the same window: a run's first second
(the clocks settling) is left out of each.

    python -m bench.power [M N K] [--seconds 3] [--rounds 2]

On the H200 (700 W) a sustained bf16 GEMM holds the board at the software power cap
(throttle reason 0x4): the clock, not the kernel's issue rate, sets the time, so a kernel
gains by drawing less power per flop."""

from __future__ import annotations

import argparse
import subprocess
import threading
import time
from datetime import datetime

from .common import twin
from .gemm import checked, gemm_launcher

QUERY = "timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active"


def contenders(m: int, n: int, k: int) -> dict:
    import torch

    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    t = twin("gemm")
    fns = {"cuBLAS": lambda: torch.matmul(x, y.T),
           "ptxdsl": gemm_launcher(t.gemm, x, y, c),
           "ptxdsl stream-K tail": gemm_launcher(t.make_gemm(streamk=True), x, y, c,
                                                 streamk=True),
           "ptxdsl 2x1 cluster": gemm_launcher(t.make_gemm(cluster=(2, 1, 1)), x, y, c,
                                               cluster=2)}
    for name, fn in fns.items():
        if name != "cuBLAS":
            checked(name, fn, c, x, y)
    return fns


def sustained_ms(fn, seconds: float, settle: float = 1.0) -> tuple[float, float, float]:
    """(ms a call, start, end) of `fn` called back to back for `settle` + `seconds`, timed
    (and its start and end given, host clock) over the last `seconds` only."""
    import torch

    def run_until(deadline: float) -> int:
        calls = 0
        while time.time() < deadline:
            for _ in range(10):
                fn()
            calls += 10
            torch.cuda.synchronize()
        return calls

    run_until(time.time() + settle)
    start = time.time()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    calls = run_until(start + seconds)
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / calls, start, time.time()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.power", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mnk", type=int, nargs="*", default=[8192, 8192, 8192], help="M N K")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args(argv)
    if len(a.mnk) != 3:
        ap.error("give M N K")
    m, n, k = a.mnk
    import torch

    fns = contenders(m, n, k)
    gpu = f"GPU-{torch.cuda.get_device_properties(torch.cuda.current_device()).uuid}"
    smi = subprocess.Popen(["nvidia-smi", "-i", gpu, f"--query-gpu={QUERY}",
                            "--format=csv,noheader", "-lms", "200"], stdout=subprocess.PIPE,
                           text=True)
    lines: list[str] = []  # drained as they come, so the pipe never fills
    reader = threading.Thread(target=lambda: lines.extend(smi.stdout or ()), daemon=True)
    reader.start()
    spans = []
    try:
        time.sleep(1.0)
        for _ in range(a.rounds):
            for name, fn in fns.items():
                ms, t0, t1 = sustained_ms(fn, a.seconds)
                spans.append((name, ms, t0, t1))
                time.sleep(0.5)
    finally:
        smi.terminate()
        reader.join(timeout=5)
    samples = []
    for line in lines:
        f = [x.strip() for x in line.split(",")]
        when = datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        samples.append((when, float(f[1].split()[0]), float(f[2].split()[0]), f[3]))
    print(f"{m} x {n} x {k}, {a.seconds:.0f} s a run, nvidia-smi every 200 ms")
    print("| contender | TFLOP/s | SM clock, MHz (mean, range) | power, W | TFLOP/s per GHz "
          "| throttle reasons |")
    print("|---|---|---|---|---|---|")
    for name, ms, t0, t1 in spans:
        got = [s for s in samples if t0 <= s[0] <= t1]
        if not got:
            print(f"| {name} | {2 * m * n * k / ms / 1e9:.0f} | no samples | | | |")
            continue
        clk = [s[1] for s in got]
        mean = sum(clk) / len(clk)
        tf = 2 * m * n * k / ms / 1e9
        print(f"| {name} | {tf:.0f} | {mean:.0f} ({min(clk):.0f}-{max(clk):.0f}) | "
              f"{sum(s[2] for s in got) / len(got):.0f} | {tf / mean * 1e3:.0f} | "
              f"{', '.join(sorted({s[3] for s in got}))} |")


if __name__ == "__main__":
    main()
