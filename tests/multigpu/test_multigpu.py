"""Several GPUs: device arguments, peer access, VMM memory, handles shared between
processes, and the TMA copies of samples/peer_copy between two GPUs.

The CPU tests (argument checks, error texts, descriptor passing) run everywhere; the tests
marked gpu need two GPUs that can reach each other (two H200s) and are skipped elsewhere."""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import ROOT, gpu_available, sample_module

import ptxdsl
from ptxdsl import runtime as rt
from ptxdsl.errors import DeviceError, LaunchError
from ptxdsl.runtime import peer, vmm

PY = sys.executable
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
       "NCCL_NVLS_ENABLE": "0",
       "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def gpu_count() -> int:
    """The GPUs this process sees (0 where there is no GPU)."""
    if not gpu_available():
        return 0
    from cuda.bindings import driver as drv

    return drv.cuDeviceGetCount()[1]


def two_gpus() -> bool:
    return gpu_count() >= 2


needs_two = pytest.mark.skipif(not two_gpus(), reason="needs two GPUs (run on nvidia-h200-x2)")


# ----------------------------------------------------------------------------- CPU: arguments


@pytest.mark.parametrize("bad, msg", [
    ("1", "device must be a device ordinal (an int), got '1'"),
    (True, "device must be a device ordinal (an int), got True"),
    (-1, "device must be a device ordinal >= 0, got -1"),
    (1.0, "device must be a device ordinal (an int), got 1.0"),
])
def test_device_arguments_are_checked_before_the_driver(bad, msg):
    for call in (lambda: rt.empty(16, "f32", device=bad), lambda: rt.zeros(4, device=bad),
                 lambda: rt.to_device(np.zeros(4, np.float32), device=bad),
                 lambda: rt.use_device(bad).__enter__(), lambda: rt.enable_peer_access(bad, 0),
                 lambda: vmm.vmm_alloc(1024, bad)):
        with pytest.raises(LaunchError) as e:
            call()
        assert msg in str(e.value)


def test_tensor_map_device_is_checked():
    with pytest.raises(LaunchError, match="device must be a device ordinal"):
        rt.TensorMap(rt.DevicePointer(0x7F0000000000), (16, 256), dtype="f32",
                     shape=(64, 256), device="gpu1")


def test_program_device_argument():
    src = "kernel k(x: ptr<f32>) threads(32) { x[%tid.x] = 1.0; }"
    prog = ptxdsl.compile(src, device=1)
    assert prog.device == 1 and prog.on(0).device == 0 and prog.on(0).ptx == prog.ptx
    assert ptxdsl.compile(src).device is None


def test_peer_problems_name_the_devices_and_the_cause():
    assert peer.peer_problem(0, 1, 2, True) is None
    assert "from GPU 1 to itself" in peer.peer_problem(1, 1, 2, None)
    assert peer.peer_problem(0, 3, 2, None) == \
        "GPU 3 does not exist: this process sees 2 device(s) (ordinals 0..1)"
    assert "no CUDA device is visible" in peer.peer_problem(0, 1, 0, None)
    msg = peer.peer_problem(0, 1, 2, False)
    assert msg.startswith("GPU 0 cannot access GPU 1's memory: cuDeviceCanAccessPeer(0, 1) is 0")


def test_enable_peer_access_to_itself_is_refused():
    with pytest.raises(peer.PeerAccessError, match="itself|no CUDA device"):
        rt.enable_peer_access(0, 0)


def test_reach_problems():
    a = 0x7F0000001000
    assert peer.reach_problem(a, 0, 0, None, False, "x") is None  # its own memory
    assert peer.reach_problem(a, 0, 1, None, True, "x") is None  # peer access on
    assert peer.reach_problem(a, 0, 1, True, False, "x") is None  # VMM mapped for GPU 0
    msg = peer.reach_problem(a, 0, 1, None, False, "the tensor map's memory")
    assert msg == ("the tensor map's memory at 0x7f0000001000 is memory of GPU 1, but GPU 0 "
                   "has no peer access to GPU 1; call ptxdsl.runtime.enable_peer_access(0, 1) "
                   "first, or build it for device=1")
    msg = peer.reach_problem(a, 0, 1, False, True, "x")
    assert "(a VMM allocation), but its mapping at this address is not granted to GPU 0" in msg
    assert "set_access([0])" in msg


def test_shareable_handles_are_checked_and_pickle():
    h = vmm.ShareableHandle(pid=123, fd=7, size=2 << 20, nbytes=1000, device=1)
    assert pickle.loads(pickle.dumps(h)) == h
    with pytest.raises(LaunchError, match="ShareableHandle.fd must be an int >= 0, got -1"):
        vmm.ShareableHandle(pid=123, fd=-1, size=2 << 20, nbytes=1, device=0)
    with pytest.raises(LaunchError, match="nbytes .3000000. exceeds its size"):
        vmm.ShareableHandle(pid=1, fd=3, size=2 << 20, nbytes=3_000_000, device=0)
    with pytest.raises(LaunchError, match="takes a ShareableHandle, got tuple"):
        vmm.import_handle((1, 2), access=[0])


def _dead_pid() -> int:
    r = subprocess.run([PY, "-c", "import os; print(os.getpid())"], capture_output=True,
                       text=True, check=True)
    return int(r.stdout)


def test_handle_from_an_exited_process_is_a_clear_error():
    pid = _dead_pid()
    h = vmm.ShareableHandle(pid=pid, fd=5, size=2 << 20, nbytes=64, device=0)
    with pytest.raises(DeviceError) as e:
        vmm.import_handle(h, access=[0])
    assert f"the process that exported the handle (pid {pid}) has exited" in str(e.value)


def test_closed_descriptor_of_this_process():
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    with pytest.raises(DeviceError, match=f"no open handle descriptor {r}"):
        vmm.fd_from_process(os.getpid(), r)


def test_descriptors_travel_between_processes_without_a_socket(tmp_path):
    """The mechanism import_handle uses (pidfd_getfd), on an ordinary file."""
    (tmp_path / "f").write_bytes(b"shared through pidfd_getfd")
    child = subprocess.Popen(
        [PY, "-c", textwrap.dedent(f"""
            import os, sys
            from ptxdsl.runtime.vmm import allow_handle_import
            allow_handle_import()
            fd = os.open({str(tmp_path / 'f')!r}, os.O_RDONLY)
            print(fd, flush=True)
            sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        fd = int(child.stdout.readline())
        mine = vmm.fd_from_process(child.pid, fd)
        try:
            assert os.pread(mine, 100, 0) == b"shared through pidfd_getfd"
        finally:
            os.close(mine)
        with pytest.raises(DeviceError, match=f"process {child.pid} has no open descriptor 999"):
            vmm.fd_from_process(child.pid, 999)
    finally:
        child.stdin.close()
        child.stdout.close()
        child.wait(timeout=30)


def test_distributed_needs_an_initialised_process_group():
    from ptxdsl.runtime import distributed

    with pytest.raises(DeviceError, match="torch.distributed"):
        distributed.SymmetricBuffer(1 << 20, device=0)


# ----------------------------------------------------------------------------- GPU: two devices


PC = None


def pc():
    global PC
    if PC is None:
        PC = sample_module("peer_copy")
    return PC


CASES = [(form, kind, direction, issuer)
         for form in ("bulk", "tile") for kind in ("peer", "vmm", "imported")
         for direction in ("push", "pull") for issuer in (0, 1)]


@pytest.mark.gpu
@needs_two
@pytest.mark.parametrize("form, kind, direction, issuer", CASES,
                         ids=["-".join(map(str, c)) for c in CASES])
def test_copy_between_gpus_matches_numpy(form, kind, direction, issuer):
    rng = np.random.default_rng(abs(hash((form, kind, direction, issuer))) % 2**32)
    got, want = pc().run_case(form, kind, direction, issuer, 1 - issuer, rng)
    assert got.shape == want.shape and np.count_nonzero(got != want) == 0


@pytest.mark.gpu
@needs_two
def test_arrays_streams_and_kernels_follow_their_device():
    a = rt.to_device(np.arange(4096, dtype=np.float32), device=1)
    assert a.device == 1 and peer.owner_of(a.ptr) == 1
    with rt.use_device(1):
        b = rt.empty(4096, "f32")
        assert rt.current_device() == 1
    c = rt.empty(4096, "f32")
    assert peer.owner_of(b.ptr) == 1 and peer.owner_of(c.ptr) == rt.current_device() == 0
    prog = ptxdsl.compile(ROOT / "samples" / "add_one.ptxdsl", device=1)
    s = rt.Stream(device=1)
    prog[2, None, s](a, b)
    s.synchronize()
    np.testing.assert_array_equal(b.numpy(), np.arange(4096, dtype=np.float32) + 1)
    assert prog.kernel().device == 1
    for x in (a, b, c):
        x.free()


@pytest.mark.gpu
@needs_two
def test_memory_of_a_gpu_without_peer_access_is_refused():
    x = rt.empty(1 << 16, "u32", device=1)
    rt.disable_peer_access(0, 1)
    try:
        with pytest.raises(rt.PeerAccessError) as e:
            rt.TensorMap(rt.DevicePointer(x.ptr), (16, 256), dtype="f32", shape=(256, 256),
                         device=0)
        assert "GPU 0 has no peer access to GPU 1" in str(e.value)
        assert "enable_peer_access(0, 1)" in str(e.value)
        with pytest.raises(rt.PeerAccessError, match="is memory of GPU 1, but GPU 0"):
            rt.check_reachable(x, 0)
    finally:
        rt.enable_peer_access(0, 1)
    rt.check_reachable(x, 0)  # fine now
    x.free()


@pytest.mark.gpu
@needs_two
def test_bad_devices_and_unmapped_vmm_are_refused():
    n = gpu_count()  # 2, 4 or 8 on the H200 machines: ask, never assume
    with pytest.raises(rt.PeerAccessError,
                       match=f"GPU {n + 5} does not exist: this process sees {n}"):
        rt.enable_peer_access(0, n + 5)
    with pytest.raises(DeviceError, match=f"device={n + 3}, but only {n} device.s. are visible"):
        rt.empty(16, device=n + 3)
    a = rt.vmm_alloc(1 << 20, 1)  # mapped for GPU 1 only
    try:
        with pytest.raises(rt.PeerAccessError, match="VMM allocation.*not granted to GPU 0"):
            rt.TensorMap(rt.DevicePointer(a.ptr), (16, 256), dtype="f32", shape=(64, 256),
                         device=0)
        a.set_access([0])
        rt.TensorMap(rt.DevicePointer(a.ptr), (16, 256), dtype="f32", shape=(64, 256),
                     device=0)
        assert a.access == (0, 1)
    finally:
        a.free()
    with pytest.raises(LaunchError, match="VMM allocation was freed"):
        a.array()


@pytest.mark.gpu
@needs_two
def test_vmm_handle_of_an_exited_process_is_refused():
    code = textwrap.dedent("""
        from ptxdsl import runtime as rt
        a = rt.vmm_alloc(1 << 20, 1, shareable=True)
        h = a.export()
        print(h.pid, h.fd, h.size, h.nbytes, h.device, flush=True)
    """)
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 0, r.stderr
    pid, fd, size, nbytes, device = map(int, r.stdout.split())
    h = rt.ShareableHandle(pid, fd, size, nbytes, device)
    with pytest.raises(DeviceError, match=f"pid {pid}.*has exited"):
        rt.import_handle(h, access=[0])


@pytest.mark.gpu
@needs_two
def test_two_processes_with_torchrun():
    pytest.importorskip("torch")
    r = subprocess.run([PY, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        str(ROOT / "samples" / "peer_copy_dist.py")],
                       capture_output=True, text=True, env=ENV, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    for rank in (0, 1):
        for step in ("push bulk", "pull bulk", "push tile", "pull tile"):
            assert f"rank {rank} (GPU {rank}): {step}" in out and "MISMATCH" not in out, out
        assert f"rank {rank}: refused as expected" in out
    assert "all ok" in out


# ----------------------------------------------------------------------------- fused TP layers


def torchrun(*args: str, timeout: int = 600, sample: str = "tp_linear_dist.py",
             ranks: int = 2) -> str:
    """`sample` (samples/) on `ranks` GPUs under torchrun: its output, which must exit 0."""
    r = subprocess.run([PY, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
                        str(ROOT / "samples" / sample), *args],
                       capture_output=True, text=True, env=ENV, timeout=timeout)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    return out


@pytest.mark.gpu
@needs_two
def test_fused_tp_layers_match_nccl_and_torch():
    """All-gather + GEMM and GEMM + reduce-scatter (both modes) on two GPUs against NCCL +
    torch on fresh random data, three launches each, five shapes (ragged, decode, several
    waves, and decode-sized with more gather units than pulling CTAs and the reduce-scatter's
    zeroing)."""
    pytest.importorskip("torch")
    out = torchrun()
    assert "MISMATCH" not in out and "DIFFERS" not in out, out[-4000:]
    for rank in (0, 1):
        assert out.count(f"rank {rank}: all-gather GEMM") == 5 * 3, out[-4000:]
        assert out.count(f"rank {rank}: GEMM reduce-scatter") == 5 * 3 * 2, out[-4000:]
    assert "all ok" in out


@pytest.mark.gpu
@needs_two
@pytest.mark.parametrize("layer, spin", [("ag", "ag_gemm.ptxdsl"), ("rs", "gemm_rs.ptxdsl")])
def test_a_rank_that_never_launches_is_a_named_error(layer, spin):
    """Rank 1 builds the plan and never launches: rank 0's kernel (with the watchdog) ends
    in a DeviceError naming the wait and its line, not in a hang. Several waits depend on
    the missing peer, and whichever times out first is named: a spin on a peer's word, or
    an mbarrier wait behind one (the consumers waiting for a producer that spins, or for
    warp 1, which spins for the peer's zeros in the reduce-scatter's `zeroed` mode)."""
    pytest.importorskip("torch")
    out = torchrun("--hang", layer, timeout=180)
    assert "rank 1: not launching" in out, out[-4000:]
    assert "rank 0: named error: error: watchdog: kernel" in out, out[-4000:]
    # a spin on a peer's word, or a wait behind one: a full barrier whose producer spins,
    # or `zready`; not a wait that only a fault within the kernel leaves waiting
    assert re.search(r"spun more than 2000 ms in spin loop `while \(*ld_acquire\(|"
                     r"waited more than 2000 ms for parity \d of mbarrier "
                     r"(\w+\.full\[|zready )", out), out[-4000:]
    assert f"ptxdsl/kernels/{spin}:" in out, out[-4000:]
