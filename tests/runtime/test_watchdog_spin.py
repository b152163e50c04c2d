"""The hang watchdog's bound on spin loops: a `while` whose condition reads global memory
through an ordered load or an atomic gives up after `watchdog_ms`, like an mbarrier wait,
and the host names the loop. Emission and ptxas checks run anywhere; the launch needs a GPU."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import ROOT, assemble

import ptxdsl
from ptxdsl.kernelinfo import WATCH_SPIN, KernelInfo
from ptxdsl.runtime.watchdog import timeout_message

SPIN = """
kernel spin(flag: ptr<u32>, out: ptr<u32>) threads(32) {
    if %tid.x == 0 {
        while ld_acquire(flag[0], sys) != 1 {
        }
    }
    out[%tid.x] = 1;
}
"""

COUNT = """
kernel count(out: ptr<u32>, n: u32) threads(32) {
    let i: u32 = 0;
    while i < n {
        i = i + 1;
    }
    out[%tid.x] = i;
}
"""

# an mbarrier wait (site 1), then a lock taken with atomic_cas (site 2)
LOCK = """
kernel lock(sem: ptr<u32>, out: ptr<u32>) threads(32) {
    mbarrier bar count 32;
    if %tid.x == 0 {
        mbarrier_init(bar);
        fence_mbarrier_init();
    }
    bar_sync(0);
    mbarrier_arrive(bar);
    mbarrier_wait(bar, 0);
    if %tid.x == 0 {
        while atomic_cas(sem[0], 0, 1, acquire, gpu) != 0 {
        }
        out[0] = out[0] + 1;
        st_release(sem[0], 0);
    }
}
"""


def _loop(ptx: str) -> list[str]:
    """The lines of the (one) while loop, from its label to its end label."""
    top = re.search(r"^\$L_while_\d+:$", ptx, re.M)
    end = re.search(r"^\$L_endwhile_\d+:$", ptx, re.M)
    assert top and end, ptx
    return ptx[top.end():end.start()].splitlines()


def test_spin_loop_is_bounded_inside_the_loop(tmp_path):
    ptx = ptxdsl.compile(SPIN, watchdog_ms=5).ptx
    # the clock starts right before the loop, and each turn that goes on measures from it
    start = re.search(r"mov\.u64 (%rd\d+), %globaltimer;\n\$L_while_\d+:\n", ptx)
    assert start, ptx
    loop = "\n".join(_loop(ptx))
    assert loop.index("ld.acquire.sys.global.u32") < loop.index("%globaltimer")
    assert re.search(rf"sub\.u64 (%rd\d+), \1, {start.group(1)};", loop), loop
    assert re.search(r"setp\.lt\.u64 %p\d+, %rd\d+, 5000000;", loop), loop
    assert "atom.global.cas.b32" in loop and "trap;" in loop
    assert re.search(rf"st\.global\.u32 \[%rd\d+\+20\], {WATCH_SPIN};", loop)  # the kind
    assemble(ptx, tmp_path)


def test_atomic_in_the_condition_is_bounded_too(tmp_path):
    prog = ptxdsl.compile(LOCK, watchdog_ms=5)
    ptx = prog.ptx
    loop = "\n".join(_loop(ptx))
    assert loop.index("atom.acquire.gpu.global.cas.b32") < loop.index("%globaltimer")
    sites = prog.ptx_module.kernel().watch_sites
    assert [s.split(" ")[0] for s in sites] == ["mbarrier", "spin"]
    assert sites[1].startswith("spin loop `while atomic_cas(sem[0], 0, 1, acquire) != 0` at ")
    # the device reports the loop as site 2, the mbarrier wait as site 1
    assert re.search(r"atom\.global\.cas\.b32 %r\d+, \[%rd\d+\], 0, 2;", ptx)
    assert re.search(r"atom\.global\.cas\.b32 %r\d+, \[%rd\d+\], 0, 1;", ptx)
    assemble(ptx, tmp_path)


def test_a_loop_without_global_reads_is_not_bounded():
    prog = ptxdsl.compile(COUNT, watchdog_ms=5)
    assert "%globaltimer" not in prog.ptx and "trap" not in prog.ptx
    assert prog.ptx_module.kernel().watch_sites == ()
    body = ptxdsl.compile(COUNT).ptx.split("{", 1)[1]
    assert prog.ptx.split("{", 1)[1] == body


def test_without_the_watchdog_the_spin_loop_is_unchanged():
    prog = ptxdsl.compile(SPIN, watchdog_ms=0)
    assert prog.ptx == ptxdsl.compile(SPIN).ptx
    assert "%globaltimer" not in prog.ptx and "$L_spin" not in prog.ptx
    assert "__ptxdsl_watchdog" not in prog.ptx
    assert prog.ptx_module.kernel().watch_sites == ()


def test_watch_sites_name_the_spin_loop_and_its_line():
    sites = ptxdsl.compile(SPIN, watchdog_ms=5).ptx_module.kernel().watch_sites
    assert len(sites) == 1
    assert re.fullmatch(r"spin loop `while ld_acquire\(flag\[0\], sys\) != 1` at .*:4:9",
                        sites[0]), sites


def test_python_api_spin_loop_is_bounded():
    @ptxdsl.kernel(threads=32)
    def spin(k, flag: ptxdsl.ptr(ptxdsl.u32)):
        with k.while_(k.ld_acquire(flag[0], "sys") != 1):
            pass

    sites = spin.program(watchdog_ms=5).ptx_module.kernel().watch_sites
    assert len(sites) == 1
    assert sites[0].startswith("spin loop `while ld_acquire(flag[0], sys) != 1`")


INFO = KernelInfo("k", (), (32, 1, 1), None, 0, "sm_90a",
                  ("mbarrier full in role 'consumer' at k.ptxdsl:9:5",
                   "spin loop `while ld_acquire(flag[0], sys) != 1` at k.ptxdsl:12:9"), 200)


def test_host_message_for_a_spin():
    words = [2, 0, 3, 32, 0, WATCH_SPIN, 0, 0]
    assert timeout_message(INFO, words) == (
        "watchdog: kernel 'k' block 3 thread 32 spun more than 200 ms in spin loop "
        "`while ld_acquire(flag[0], sys) != 1` at k.ptxdsl:12:9; the kernel was stopped with "
        "a trap, so the CUDA context is unusable from now on")


def test_host_message_for_an_mbarrier_wait_is_unchanged():
    words = [1, 1, 0, 64, 24, 0, 0, 0]
    assert timeout_message(INFO, words) == (
        "watchdog: kernel 'k' block 0 thread 64 waited more than 200 ms for parity 1 of "
        "mbarrier full in role 'consumer' at k.ptxdsl:9:5 (barrier index 24); the kernel was "
        "stopped with a trap, so the CUDA context is unusable from now on")


def test_no_message_when_nothing_timed_out():
    assert timeout_message(INFO, [0] * 8) is None


HANG = '''
import sys
import numpy as np
import ptxdsl

prog = ptxdsl.compile("""
kernel spin(flag: ptr<u32>, out: ptr<u32>) threads(32) {
    if %tid.x == 0 {
        while ld_acquire(flag[0], sys) != 1 {
        }
    }
    out[%tid.x] = 1;
}""", watchdog_ms=200)
flag = ptxdsl.to_device(np.zeros(1, np.uint32))   # nobody ever sets it
out = ptxdsl.to_device(np.zeros(32, np.uint32))
try:
    prog.spin[1](flag, out)
except ptxdsl.DeviceError as e:
    print(e)
    sys.exit(3)
print("no error")
'''


@pytest.mark.gpu
def test_watchdog_stops_a_spin_nobody_ends():
    # a trap leaves the CUDA context unusable, so the spinning kernel runs in its own process
    r = subprocess.run([sys.executable, "-c", HANG], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "watchdog: kernel 'spin' block 0 thread 0 spun more than 200 ms in spin loop " \
           "`while ld_acquire(flag[0], sys) != 1`" in r.stdout
    assert ":4:9" in r.stdout  # the while line
