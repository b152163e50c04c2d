"""The all-reduce (ptxdsl/kernels/all_reduce.py) at 2, 3, 4 and 8 ranks at once in the CPU
interpreter: every rank's output bit-identical to numpy's sum in rank order, over two launches
(the second on the other input slot, the flags' epochs carrying over), with ranks' CTAs
started out of order; a rank that never launches is a located deadlock. One- and two-shot,
bf16 and f32, lengths that are not whole vectors or CTA pieces, builds with several vectors a
thread in flight (lengths not whole chunks of them). One case a mode by default; the rest
under PTXDSL_DEEP=1 (as CI runs). On GPUs (marked gpu, two or more), every GPU of
the host under torchrun (samples/all_reduce_dist.py) against the rank-order sum and NCCL."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assemble, assert_no_spills, sample_module
from fuzzing import DEEP
from test_multigpu import gpu_count, needs_two, torchrun

from ptxdsl.interp import InterpError
from ptxdsl.kernels import all_reduce as ar


def bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint32) if x.dtype == np.float32 else x


# (world, n, dtype, shots, grid, seed, copy): n 1000 bf16 is 125 vectors, two CTAs of 63 and
# 62; 517 leaves a 5-element tail; 3 is all tail; two-shot parts of 4001 f32 at world 3 are
# 334, 334 and 332 vectors
CASES = [(2, 1000, "bf16", 1, 2, 1, True), (3, 517, "f32", 2, 2, 2, True)] + ([
    (2, 1003, "f32", 1, 3, 3, False), (3, 517, "bf16", 1, 2, 4, True),
    (4, 517, "bf16", 1, 2, 5, True), (4, 4001, "f32", 2, 3, 6, True),
    (4, 1003, "bf16", 2, 2, 7, False), (8, 1000, "bf16", 1, 2, 8, True),
    (8, 1000, "f32", 2, 2, 9, True), (8, 4001, "bf16", 2, 3, 10, False),
    (3, 3, "bf16", 1, 2, 11, True), (3, 3, "f32", 2, 1, 12, True),
    (2, 4096, "bf16", 2, 4, 13, True),  # two-shot at world 2: the host never picks it
] if DEEP else [])


def check(r, world, dtype, grid, shots):
    """Every rank's output is the rank-order sum of the last launch's inputs, and every CTA's
    words of round 0 (and 1, two-shot) hold the last epoch, the rank's own not."""
    want = bits(ar.reference(r["inputs"], dtype))
    for rank in range(world):
        np.testing.assert_array_equal(bits(r["out"][rank]), want, err_msg=f"rank {rank}")
    words = r["sig"].reshape(world, 2, grid, world)
    for rnd in range(2):
        want_flags = (1 - np.eye(world, dtype=np.uint32))[:, None, :] * (2 if rnd < shots else 0)
        np.testing.assert_array_equal(words[:, rnd],
                                      np.broadcast_to(want_flags, words[:, rnd].shape))


@pytest.mark.parametrize("world, n, dtype, shots, grid, seed, copy", CASES)
def test_every_rank_gets_the_rank_order_sum(world, n, dtype, shots, grid, seed, copy):
    r = ar.interp(world, n, dtype, shots=shots, grid=grid, seed=seed, copy=copy)
    check(r, world, dtype, grid, shots)


def vectors_for(world, shots, dtype, chunks, rest, tail):
    """n whose part (a world-th two-shot, all one-shot) is `chunks` whole chunks of a thread's
    vectors and `rest` more vectors (of one CTA of 32 threads: a chunk is 32 x unroll vectors),
    the last part world - 1 vectors shorter, and `tail` elements past the whole vectors."""
    parts = world if shots == 2 else 1
    return ((chunks + rest) * parts - (parts - 1)) * ar.vec_width(dtype) + tail


# (world, dtype, shots, unroll, chunks, rest, tail, copy) at 32 threads: every thread several
# chunks, the last partial (a thread's vectors not a multiple of unroll, some threads' last
# chunk with the first vector only, others with none); the last part of a two-shot shorter
UNROLLED = [(2, "bf16", 1, 8, 2 * 32 * 8, 37, 5, True), (4, "f32", 2, 4, 32 * 4, 77, 1, True),
            ] + ([
    (2, "f32", 1, 8, 32 * 8, 255, 3, False), (3, "bf16", 1, 4, 2 * 32 * 4, 100, 7, True),
    (3, "f32", 2, 4, 32 * 4, 33, 2, True), (3, "bf16", 2, 2, 3 * 32 * 2, 1, 0, False),
    (4, "bf16", 1, 2, 32 * 2, 63, 0, True), (4, "bf16", 2, 4, 2 * 32 * 4, 95, 7, False),
    (8, "bf16", 2, 2, 32 * 2, 33, 7, True), (8, "f32", 1, 2, 2 * 32 * 2, 17, 1, True),
    (4, "f32", 2, 4, 0, 20, 3, True),  # less than one chunk: a thread's first vector only
] if DEEP else [])


@pytest.mark.parametrize("world, dtype, shots, unroll, chunks, rest, tail, copy", UNROLLED)
def test_unrolled_builds_get_the_rank_order_sum(world, dtype, shots, unroll, chunks, rest,
                                                tail, copy):
    """Builds with several vectors a thread in flight, on one CTA and on two (whose pieces
    end mid-chunk): loads clamped past a piece read within it, stores past it are skipped."""
    n = vectors_for(world, shots, dtype, chunks, rest, tail)
    for grid in (1, 2) if DEEP else (1,):
        r = ar.interp(world, n, dtype, shots=shots, grid=grid, seed=world + unroll, copy=copy,
                      threads=32, unroll=unroll)
        check(r, world, dtype, grid, shots)


@pytest.mark.skipif(not DEEP, reason="the production build (512 threads) at 8 ranks: PTXDSL_DEEP=1")
@pytest.mark.parametrize("shots", [1, 2])
def test_the_production_build(shots):
    r = ar.interp(8, 5000, "bf16", shots=shots, grid=3, seed=shots, threads=ar.THREADS)
    want = ar.reference(r["inputs"], "bf16")
    for rank in range(8):
        np.testing.assert_array_equal(r["out"][rank], want)


@pytest.mark.skipif(not DEEP, reason="the production build unrolled, at 4 ranks: PTXDSL_DEEP=1")
def test_the_production_build_unrolled():
    """512 threads at the unroll the host picks for large messages at world 4: one CTA's
    piece a chunk and a third."""
    unroll = ar.max_unroll(4)
    n = (4 * ar.THREADS * unroll + 4 * ar.THREADS * unroll // 3) * 8 + 5
    r = ar.interp(4, n, "bf16", shots=2, grid=1, seed=3, threads=ar.THREADS, unroll=unroll)
    check(r, 4, "bf16", 1, 2)


@pytest.mark.parametrize("shots", [1, 2] if DEEP else [2])
def test_a_rank_that_never_launches_is_a_located_deadlock(shots):
    with pytest.raises(InterpError) as e:
        ar.interp(3, 300, shots=shots, launch=[0, 1], epochs=1)
    text = str(e.value)
    assert "deadlock" in text and "rank 0: " in text and "rank 1: " in text, text
    assert "rank 2: " not in text
    assert "all_reduce.py" in text and "ld_acquire(sig[" in text, text


def test_rank_order_makes_the_result_depend_on_order():
    """The reference adds in rank order: with values whose f32 sum depends on the order it
    differs from a reversed sum (so the tests above would see a kernel adding in another
    order)."""
    x = np.array([[1e8], [1.0], [-1e8], [1.0]], np.float32)
    assert ar.reference(x, "f32")[0] != ar.reference(x[::-1], "f32")[0]


def test_arguments_are_the_kernels_parameters_in_order():
    """The host launches with `arguments(...).values()` (positional: the launcher's fast
    path), the interpreter runs above with the dict by name: one order for both."""
    args = ar.arguments(None, "out", "buf", 4096, 1024, "sig", 64, 1, 1000, (1 << 32) + 3, 2)
    assert list(args) == [p.name for p in ar.make_all_reduce().ir.params]
    assert (args["x"], args["epoch"], args["copy"], args["two_shot"]) == ("out", 3, 0, 1)


def test_plan_arithmetic():
    assert ar.slot_elems(1000, "bf16") == 1024 and ar.slot_elems(1, "f32") == 64
    assert not ar.two_shot(1 << 20, "bf16", 2)  # world 2: always one-shot
    assert ar.two_shot(1 << 19, "bf16", 4) and not ar.two_shot((1 << 19) - 8, "bf16", 4)
    assert ar.grid_for(2048, "bf16", 4, 132) == 1  # 4 KB: 256 vectors, one CTA
    assert ar.grid_for(1 << 27, "bf16", 8, 132) == 132
    assert ar.grid_for(1 << 20, "f32", 4, 132, shots=2) == 128  # parts of 65536 vectors
    with pytest.raises(ValueError, match="not 'f16'"):
        ar.make_all_reduce("f16")


def test_the_unroll_the_host_picks():
    """A power of two, at most 16 vectors of loads a thread (U x world); 1 while a thread
    has one vector (small messages keep the smallest code); enough to cover a thread's
    vectors in one chunk, up to the cap."""
    assert [ar.max_unroll(w) for w in (1, 2, 3, 4, 5, 8, 9, 16, 32)] == [8, 8, 4, 4, 2, 2, 1, 1, 1]
    assert [ar.gather_unroll(w, ar.max_unroll(w)) for w in (2, 3, 4, 8)] == [8, 4, 4, 1]
    # 1 MB bf16 at world 4: 16384 vectors a part, 32 CTAs of 512 threads, one vector each
    assert ar.unroll_for(1 << 19, "bf16", 4, 32) == 1
    # 16 MB: 262144 vectors a part over 132 x 512 threads, 3.9 a thread: 4
    assert ar.unroll_for(1 << 23, "bf16", 4, 132) == 4
    assert ar.unroll_for(1 << 23, "bf16", 8, 132) == 2  # 1.9 a thread, at the cap anyway
    assert ar.unroll_for(1 << 27, "bf16", 2, 132) == 8  # one-shot at world 2: capped
    assert ar.unroll_for(132 * 512 * 8 * 3 // 2, "bf16", 2, 132, shots=1) == 2  # 1.5 a thread
    with pytest.raises(ValueError, match="unroll is 1 to 2 at world 8"):
        ar.make_all_reduce("bf16", 8, unroll=4)


@pytest.mark.ptxas
@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("world, unroll", [(w, u) for w in (2, 3, 4, 8) for u in (1, 2, 4, 8)
                                           if u <= ar.max_unroll(w)] if DEEP else [(4, 4), (8, 2)])
def test_builds_assemble_without_spills(dtype, world, unroll, tmp_path):
    log = assemble(ar.make_all_reduce(dtype, world, unroll=unroll).ptx("sm_90a"), tmp_path)
    assert_no_spills(log)


# ----------------------------------------------------------------------------- GPUs


@pytest.mark.gpu
@needs_two
def test_every_gpu_gets_the_rank_order_sum_and_agrees_with_nccl():
    """Every GPU of the host, one process each: both modes, bf16 and f32, seven sizes (1
    element to 6 MB), three calls a plan (in place, into another tensor, through input()):
    the same bits as the rank-order sum of the gathered inputs, close to NCCL's all_reduce."""
    pytest.importorskip("torch")
    world = gpu_count()
    out = torchrun(sample="all_reduce_dist.py", ranks=world)
    assert "MISMATCH" not in out and "FAR" not in out, out[-4000:]
    calls = len(sample_module("all_reduce_dist").SIZES) * 2 * 2 * 3
    for rank in range(world):
        assert out.count(f"rank {rank}: all_reduce bf16") + \
            out.count(f"rank {rank}: all_reduce f32") == calls, out[-4000:]
        assert f"rank {rank}: all_reduce() in place: same bits" in out, out[-4000:]
    assert "all ok" in out


@pytest.mark.gpu
@needs_two
def test_a_rank_that_never_launches_is_a_named_error_on_the_gpu():
    """Rank 1 builds the plan and never launches: rank 0's kernel (with the watchdog) ends in
    a DeviceError naming the spin on rank 1's flag and its line."""
    pytest.importorskip("torch")
    out = torchrun("--hang", timeout=180, sample="all_reduce_dist.py")
    assert "rank 1: not launching" in out, out[-4000:]
    assert "rank 0: named error: error: watchdog: kernel 'all_reduce_bf16_w2'" in out, out[-4000:]
    assert "spun more than 2000 ms in spin loop `while (ld_acquire(sig[" in out, out[-4000:]
    assert "ptxdsl/kernels/all_reduce.py:" in out, out[-4000:]


def test_the_bench_section_from_a_run():
    """bench/allreduce.py's page section from a worker's JSON (no GPU): a row a size against
    the fastest reference (NCCL or torch's symmetric-memory op) with its target, the ratio to
    NCCL and bus bandwidth in the note, and a wrong result refused."""
    import argparse

    from bench import allreduce
    from bench.common import BenchError

    def res(nbytes, ours, nccl, symm, exact=True, err=0.5):
        return {"bytes": nbytes, "shots": 1, "us": {"ours": ours, "nccl": nccl,
                                                     "symm one-shot": symm},
                "errors": {"ours": 0.1, "nccl": err}, "exact": exact, "symm_error": ""}

    a = argparse.Namespace(gpus=4, quick=False)
    s = allreduce.section({"world": 4, "results": [res(4 << 10, 8.0, 12.0, 14.0),
                                                    res(64 << 20, 500.0, 450.0, 400.0)]}, a)
    assert [(r.case, r.target, r.ref) for r in s.rows] == [
        ("4 KB a rank", 1.2, "NCCL"), ("64 MB a rank", 1.0, "torch symm-mem one-shot")]
    assert s.rows[0].ratio == pytest.approx(1.5) and not s.rows[0].missed
    assert s.rows[1].ratio == pytest.approx(0.8) and s.rows[1].missed
    # 64 MiB in 450 us, x 2 x 3 / 4: 224 GB/s
    assert ("64 MB: ptxdsl / NCCL 0.90, bus GB/s ptxdsl 201, NCCL 224 (symm one-shot 400.0 "
            "us)") in s.notes[0]
    for bad in (res(4 << 10, 8.0, 12.0, 14.0, exact=False),
                res(4 << 10, 8.0, 12.0, 14.0, err=2.0)):
        with pytest.raises(BenchError, match="4 KB: wrong results"):
            allreduce.section({"world": 4, "results": [bad]}, a)


@pytest.mark.parametrize("shots", [1, 2])
def test_epochs_wrap_at_two_to_the_32(shots):
    """Launches 2^32 - 1 and 0 (the flags compare a signed difference; the slots' parity
    goes on alternating, 2^32 being even): the second launch still waits for its peers and
    reads the right slot."""
    r = ar.interp(3, 300, "bf16", shots=shots, seed=shots, first=(1 << 32) - 1)
    want = ar.reference(r["inputs"], "bf16")
    for rank in range(3):
        np.testing.assert_array_equal(r["out"][rank], want)


def test_the_plan_refuses_arrays_the_kernel_cannot_take():
    """AllReduce's checks of x and out (no GPU: a plan's fields set by hand, arrays described
    by their ArrayDesc): the element count and type, row-major 16-byte aligned memory, the
    plan's GPU; and a call with neither x nor out."""
    from ptxdsl import bf16, f32
    from ptxdsl.errors import LaunchError
    from ptxdsl.runtime.distributed import AllReduce
    from ptxdsl.runtime.interop import ArrayDesc

    class Array:
        def __init__(self, shape=(10, 100), strides=(200, 2), elem=bf16, ptr=0x10000, device=0):
            self.__ptxdsl_array__ = ArrayDesc(ptr, shape, strides, elem)
            self.device = device

    plan = object.__new__(AllReduce)
    plan.n, plan.dtype, plan.device, plan._checked = 1000, "bf16", 0, {}
    plan._check(Array(), "x")  # any shape of 1000 elements
    for bad, words in ((Array(shape=(999,), strides=(2,)), "must hold 1000 bf16 elements"),
                       (Array(strides=(400, 4), elem=f32), "must hold 1000 bf16 elements"),
                       (Array(strides=(400, 2)), "contiguous and 16-byte aligned"),
                       (Array(ptr=0x10008), "contiguous and 16-byte aligned"),
                       (Array(ptr=0x20000, device=1), "is on GPU 1; this plan runs on GPU 0")):
        with pytest.raises(LaunchError, match=words):
            plan._check(bad, "x")
    with pytest.raises(LaunchError, match="needs an out array"):
        plan()


def test_the_plan_refuses_a_second_stream_and_an_out_over_its_slots():
    """AllReduce._apart (no GPU: a plan's fields set by hand): the first call's stream is
    every call's, and an out overlapping this rank's two input slots is refused, one just
    past them is not. (The refusal of a call under CUDA graph capture asks the driver: it
    runs with the GPU tests.)"""
    from types import SimpleNamespace

    from ptxdsl import bf16
    from ptxdsl.errors import LaunchError
    from ptxdsl.runtime.distributed import AllReduce

    plan = object.__new__(AllReduce)
    plan.n, plan._stream = 1000, None
    plan._all = SimpleNamespace(elem=bf16)
    plan.buf = SimpleNamespace(local=SimpleNamespace(ptr=0x100000), nbytes=4096)
    plan._apart(0x7, 0x200000)
    plan._apart(0x7, 0x200000)
    with pytest.raises(LaunchError, match="one stream: this one first ran on stream 0x7, "
                                          "now 0x8"):
        plan._apart(0x8, 0x200000)
    plan._apart(0x7, 0x100000 + 4096)  # right after the slots
    plan._apart(0x7, 0x100000 - 2000)  # right before them (1000 bf16 end where they start)
    for at in (0x100000, 0x100000 + 4000, 0x100000 - 1998):
        with pytest.raises(LaunchError, match="overlaps this rank's input slots"):
            plan._apart(0x7, at)


def test_a_hang_check_passes_only_on_the_watchdogs_named_error(capsys):
    """expect_named_hang (the torchrun samples' --hang): the absent rank does not launch; a
    launch ending in a DeviceError passes, one that returns fails."""
    from ptxdsl.errors import DeviceError
    from ptxdsl.runtime.distributed import expect_named_hang

    def trapped():
        raise DeviceError("watchdog: kernel 'k' waited more than 2000 ms")

    assert expect_named_hang(lambda: pytest.fail("rank 1 launched"), 1) == 0
    assert expect_named_hang(trapped, 0) == 0
    assert expect_named_hang(lambda: None, 2) == 1
    out = capsys.readouterr().out
    assert "rank 1: not launching" in out and "rank 0: named error: " in out
    assert "watchdog: kernel 'k'" in out
    assert "rank 2: the launch returned without an error" in out
