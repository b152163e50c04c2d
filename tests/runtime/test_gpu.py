"""Driver-level runs of ptxdsl kernels on the GPU, compared with numpy on fresh random data.

Marked `gpu`: skipped where no CUDA GPU is present; run them with `pytest -m gpu`."""

import numpy as np
import pytest
from conftest import SAMPLES, assert_ok, sample_module, sample_path

import ptxdsl
from ptxdsl.tools.runner import run_example, run_sample

pytestmark = pytest.mark.gpu




@pytest.mark.parametrize("name", ["add_one", "pipeline", "stream_copy", "norms", "colsum",
                                  "cuda_pipeline"])
def test_sample_matches_numpy(name):
    for _kernel, results in run_sample(sample_path(name)):
        assert_ok(results)


@pytest.mark.parametrize("stages", [1, 2, 3, 6])
def test_stream_copy_any_stage_count(stages):
    mod = sample_module("stream_copy")
    ex = mod.example(np.random.default_rng(), ntiles=61)  # not a multiple of the grid
    assert_ok(run_example(mod.make_stream_copy(stages), ex))


@pytest.mark.parametrize("kind", ["rmsnorm", "softmax", "layernorm"])
def test_norms_f32_inputs(kind):
    mod = sample_module("norms")
    kd = mod.make_norm(kind, n=4096, dtype=ptxdsl.f32, stages=3, consumer_warps=4)
    ex = mod.example(np.random.default_rng(), kernel=kd.name, rows=50, n=4096,
                     dtype=ptxdsl.f32)
    assert_ok(run_example(kd, ex))


@pytest.mark.parametrize("kind", ["rmsnorm", "softmax", "layernorm"])
@pytest.mark.parametrize("dtype, warps, minctas", [(ptxdsl.bf16, 4, None),
                                                   (ptxdsl.f32, 16, None),
                                                   (ptxdsl.f32, 8, 4)])
def test_norm_rows_one_cta_per_row(kind, dtype, warps, minctas):
    """The one-row-per-CTA form as the benchmark launches it: a CTA per row."""
    mod = sample_module("norms")
    kd = mod.make_norm_row(kind, 8192, dtype, warps, minctas=minctas)
    ex = mod.example(np.random.default_rng(), kernel=kd.name, rows=300, n=8192, dtype=dtype)
    assert_ok(run_example(kd, {**ex, "grid": 300}))


TILE_KERNEL = """
kernel tile_affine(src: tmap<f32, 2>, dst: tmap<f32, 2>) threads(128) {
    shared tile: f32[32][32] align 1024;
    mbarrier bar count 1;
    let tid = %tid.x;
    let x0 = (%ctaid.x * 32) as s32;
    let y0 = (%ctaid.y * 32) as s32;
    if tid == 0 {
        mbarrier_init(bar);
        fence_mbarrier_init();
    }
    bar_sync(0);
    if tid == 0 {
        mbarrier_arrive_expect_tx(bar, sizeof(tile));
        tma_load(tile, src, [x0, y0], bar);
    }
    mbarrier_wait(bar, 0);
    for i in 0 .. 8 {
        let r = i * 4 + (tid >> 5);
        let c = tid & 31;
        tile[r, c] = tile[r, c] * 2.0 + 1.0;
    }
    fence_proxy_async();
    bar_sync(0);
    if tid == 0 {
        tma_store(dst, [x0, y0], tile);
        bulk_commit();
        bulk_wait_read(0);
    }
}
"""


@pytest.mark.parametrize("swizzle", ["none", "128B"])
@pytest.mark.parametrize("shape", [(128, 96), (100, 72)])  # the second hangs over both edges
def test_tensor_map_tile_load_compute_store(swizzle, shape):
    prog = ptxdsl.compile(TILE_KERNEL)
    x = np.random.default_rng().standard_normal(shape).astype(np.float32)
    grid = (-(-shape[1] // 32), -(-shape[0] // 32))
    box = {"box": (32, 32), "swizzle": swizzle}
    ex = {"grid": grid, "inputs": {"src": x}, "outputs": {"dst": np.empty_like(x)},
          "tensor_maps": {"src": box, "dst": box}, "expected": {"dst": x * 2.0 + 1.0}}
    assert_ok(run_example(prog, ex))


def test_more_than_48k_dynamic_shared_memory():
    prog = ptxdsl.compile("""
    kernel big(out: ptr<f32>) threads(256) {
        shared buf: f32[16384] align 128;     // 64 KiB
        let tid = %tid.x;
        for i in 0 .. 64 { buf[i * 256 + tid] = ((i * 256 + tid) as f32) * 0.5; }
        bar_sync(0);
        for i in 0 .. 64 { out[i * 256 + tid] = buf[16383 - (i * 256 + tid)]; }
    }""")
    assert prog.kernels[0].smem_bytes > 49152
    want = (np.arange(16384, dtype=np.float32) * 0.5)[::-1].copy()
    ex = {"grid": 1, "inputs": {}, "outputs": {"out": np.empty(16384, np.float32)},
          "expected": {"out": want}}
    assert_ok(run_example(prog, ex))


def test_cluster_of_two_reads_its_rank():
    prog = ptxdsl.compile("""
    kernel rank(out: ptr<u32>) threads(32) cluster(2) {
        if %tid.x == 0 { out[%ctaid.x] = %cluster_ctarank + 100 * %cluster_nctarank; }
    }""")
    want = (np.arange(16) % 2 + 200).astype(np.uint32)
    ex = {"grid": 16, "inputs": {}, "outputs": {"out": np.empty(16, np.uint32)},
          "expected": {"out": want}}
    assert_ok(run_example(prog, ex))


def test_bad_launches_are_caught_before_the_driver():
    from ptxdsl.runtime import TensorMap, to_device

    prog = ptxdsl.compile(SAMPLES / "stream_copy.ptxdsl")
    k = prog.kernel()
    a = to_device(np.zeros((64, 256), np.uint16), dtype=ptxdsl.bf16)
    with pytest.raises(ptxdsl.LaunchError, match="argument"):
        k[4](a, a, 3)  # pointers where tensor maps are expected
    tm = TensorMap(a, box=(32, 256), dtype=ptxdsl.bf16)
    with pytest.raises(ptxdsl.LaunchError):
        k[4](tm, tm)  # one argument short
    with pytest.raises(ptxdsl.LaunchError, match="232448"):
        k.launch(tm, tm, 2, grid=4, smem=300000)
    with pytest.raises(ptxdsl.LaunchError, match="256"):
        TensorMap(a, box=(32, 300), dtype=ptxdsl.bf16)
    with pytest.raises(ptxdsl.LaunchError, match="aligned"):
        from ptxdsl.runtime import DevicePointer

        TensorMap(DevicePointer(int(a.ptr) + 8), box=(32, 256), dtype=ptxdsl.bf16,
                  shape=(32, 256))
    with pytest.raises(ptxdsl.LaunchError, match="16"):
        TensorMap(DevicePointer(int(a.ptr)), box=(8, 8), dtype=ptxdsl.bf16, shape=(32, 100),
                  strides=(200, 2))
    with pytest.raises((KeyError, ptxdsl.LaunchError)):
        prog.kernel("no_such_kernel")
    a.free()


def test_ptxas_rejection_names_the_kernel():
    prog = ptxdsl.compile('kernel broken() threads(32) { asm "not.an.instruction;"; }')
    with pytest.raises(ptxdsl.CompileError, match="broken"):
        prog.kernel()


def test_launch_overhead_with_cached_tensor_maps(record_property):
    from ptxdsl.runtime import TensorMap, launch_overhead_us, synchronize, to_device

    prog = ptxdsl.compile(SAMPLES / "stream_copy.ptxdsl")
    k = prog.kernel()
    a = to_device(np.zeros((64, 256), np.uint16), dtype=ptxdsl.bf16)
    b = to_device(np.zeros((64, 256), np.uint16), dtype=ptxdsl.bf16)
    src = TensorMap(a, box=(32, 256), dtype=ptxdsl.bf16)
    dst = TensorMap(b, box=(32, 256), dtype=ptxdsl.bf16)
    launch = k[8]
    us = launch_overhead_us(lambda: launch(src, dst, 2), n=2000)
    synchronize()
    record_property("launch_overhead_us", us)
    print(f"\nhost launch overhead, cached tensor maps: {us:.2f} us")
    assert us < 50
    a.free()
    b.free()


HANG = '''
import sys
import numpy as np
import ptxdsl

prog = ptxdsl.compile("""
kernel hang(out: ptr<u32>, n: u32) threads(64) {
    mbarrier done count 2;
    if %tid.x == 0 {
        mbarrier_init(done);
        fence_mbarrier_init();
    }
    bar_sync(0);
    if %tid.x < n {
        mbarrier_arrive(done);
    }
    mbarrier_wait(done, 0);
    out[%tid.x] = 1;
}""", watchdog_ms=300)
out = ptxdsl.to_device(np.zeros(64, np.uint32))
try:
    prog.hang[1](out, 1)   # one arrival where two are expected: the wait can never finish
except ptxdsl.DeviceError as e:
    print(e)
    sys.exit(3)
print("no error")
'''


def test_watchdog_turns_a_hang_into_an_error():
    import subprocess
    import sys

    # a trap leaves the CUDA context unusable, so the hanging kernel runs in its own process
    r = subprocess.run([sys.executable, "-c", HANG], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "watchdog: kernel 'hang'" in r.stdout
    assert "parity 0 of mbarrier done" in r.stdout
    assert ":12:5" in r.stdout  # the mbarrier_wait line


def test_sanitizer_reports_a_planted_out_of_bounds_write(tmp_path):
    """`ptxdsl run --sanitize memcheck` finds what memcheck finds (needs compute-sanitizer)."""
    from ptxdsl.tools.sanitize import sanitize

    (tmp_path / "oob.ptxdsl").write_text(
        "kernel oob(dst: ptr<f32>) threads(32) {\n"
        "    dst[%tid.x + 40] = 1.0;\n"  # 8 elements past the end of a 32-element array
        "}\n")
    (tmp_path / "oob.py").write_text(
        "import numpy as np\n"
        "def example(rng):\n"
        "    return {'grid': 1, 'outputs': {'dst': np.zeros(32, np.float32)},\n"
        "            'expected': {'dst': np.ones(32, np.float32)}}\n")
    (run,) = sanitize(str(tmp_path / "oob.ptxdsl"), ["memcheck"])
    assert run.status == "findings", run.output
    assert "Invalid __global__ write of size 4" in run.output
@pytest.mark.gpu
@pytest.mark.parametrize("n, t", [(2048, ptxdsl.bf16), (4096, ptxdsl.bf16),
                                  (16384, ptxdsl.bf16), (4096, ptxdsl.f32)])
@pytest.mark.parametrize("kind", ["rmsnorm", "softmax", "layernorm", "rmsnorm_row",
                                  "softmax_row", "layernorm_row"])
def test_norms_text_instantiated_for_other_sizes(kind, n, t):
    """norms.ptxdsl with its compile-time parameters set (-D N=n -D T=t)."""
    prog = ptxdsl.compile(sample_path("norms"), defines={"N": n, "T": t})
    ex = sample_module("norms").example(np.random.default_rng(n), kernel=kind, rows=70, n=n,
                                        dtype=t)
    assert_ok(run_example(prog, ex))


@pytest.mark.gpu
def test_bf16_arrays_cross_the_runtime_as_bfloat16_or_uint16_bits():
    import ml_dtypes

    from ptxdsl.runtime import to_device

    x = (np.arange(256, dtype=np.float32) / 8 - 3).astype(ml_dtypes.bfloat16)
    a = to_device(x)
    assert a.elem == ptxdsl.bf16 and a.__cuda_array_interface__["typestr"] == "<u2"
    back = a.numpy()
    assert back.dtype == ml_dtypes.bfloat16 and (back == x).all()
    from_bits = to_device(x.view(np.uint16), dtype=ptxdsl.bf16).numpy()
    assert (from_bits.view(np.uint16) == x.view(np.uint16)).all()
    out = np.empty(256, np.uint16)
    a.copy_to_host(out)
    assert (out == x.view(np.uint16)).all()
