"""The sm_80 target: Ampere cp.async operations written by hand, the lowering of the Hopper
forms for `--arch sm_80`, its errors, the interpreter on both builds, the runtime's tensor
descriptors, and (marked gpu) both builds on the H200."""

import functools
import os
import re

import numpy as np
import pytest
from conftest import (
    SAMPLES,
    assemble,
    sample_ir,
    sample_module,
    sample_names,
    sample_path,
    sample_ptx,
)

import ptxdsl
from ptxdsl import ir
from ptxdsl.compiler import Program
from ptxdsl.errors import CompileError
from ptxdsl.interp import InterpError, TensorMapModel, run_sample
from ptxdsl.lower import lower
from ptxdsl.tools.cli import main
from ptxdsl.tools.runner import compare

HOPPER_ONLY = ("cp.async.bulk", "try_wait", "elect.sync", "setmaxnreg", "fence.proxy.async",
               "expect_tx", "fence.mbarrier_init", "prefetch.tensormap")




def sm80_error(text: str) -> str:
    with pytest.raises(CompileError) as info:
        ptxdsl.compile(text, arch="sm_80")
    return info.value.render()


# ----------------------------------------------------------------------------- samples


HOPPER_ONLY_ERROR = re.compile(r":\d+:\d+: error: (.* has no sm_80 form \(it needs sm_90"
                               r"|kernel '\w+' needs \d+ bytes of shared memory .*; a CTA has at "
                               r"most 166912 on sm_80)")


def lowers_to_sm80(k: ir.Kernel) -> bool:
    """Whether a kernel has an sm_80 build; if not, the error must be located and name what
    needs Hopper, or the shared memory an A100 lacks (what `ptxdsl compile --arch sm_80`
    reports for such a sample)."""
    try:
        lower(ir.Module(kernels=(k,), loc=k.loc), "sm_80")
    except CompileError as e:
        assert HOPPER_ONLY_ERROR.search(e.render()), e.render()
        return False
    return True


@functools.cache
def sm80_kernels(name: str) -> tuple[ir.Kernel, ...]:
    """The kernels of a sample that have an sm_80 build (decided once per sample: collection
    asks three times)."""
    return tuple(k for k in sample_ir(name).kernels
                 if lowers_to_sm80(k))


DEEP = bool(os.environ.get("PTXDSL_DEEP"))


@pytest.mark.ptxas
@pytest.mark.parametrize("name", sample_names())
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"] if DEEP else ["sm_80"])
def test_every_sample_compiles_and_assembles_for_both_targets(name, arch, tmp_path):
    """Every sample has both builds, or (sm_80) a located error naming its Hopper-only part
    (the sm_90a builds assemble in test_ptxas.py too: here with PTXDSL_DEEP=1 only)."""
    if arch == "sm_80":
        kernels = tuple(sm80_kernels(name))
        module = ir.Module(kernels=kernels)
        if len(kernels) < len(sample_ir(name).kernels):
            with pytest.raises(CompileError) as info:
                ptxdsl.compile(sample_path(name), arch=arch)
            assert HOPPER_ONLY_ERROR.search(info.value.render())
        if not kernels:
            return
        ptx = ptxdsl.compile_module(module, arch=arch).ptx
    else:
        ptx = sample_ptx(name, arch)
    assert f".target {arch}\n" in ptx
    if arch == "sm_80":
        used = [m for m in HOPPER_ONLY if m in ptx]
        assert not used, f"sm_80 PTX still uses {used}"
    assemble(ptx, tmp_path, arch)


# the norms sample's eight kernels share one pipeline: two of them (a pipelined and a
# whole-row form) stand for all by default, every one with PTXDSL_DEEP=1
NORMS_DEFAULT = {"layernorm_row", "softmax"}
SLOW = {"topk"}  # a second of sorting network in the interpreter: PTXDSL_DEEP=1 runs it


def _interp_cases() -> list:
    # every kernel, parsed only: whether it has an sm_80 build is decided in the test, so that
    # collection (in every worker) lowers nothing
    return [pytest.param(name, k.name, "sm_80", id=f"{name}-{k.name}-sm_80")
            for name in sample_names() for k in sample_ir(name).kernels
            if DEEP or (name != "norms" or k.name in NORMS_DEFAULT) and name not in SLOW]


@pytest.mark.parametrize("name, kname, arch", _interp_cases())
def test_every_sample_runs_in_the_interpreter_as_built_for_sm80(name, kname, arch):
    """The sm_80 build of every sample kernel against its numpy reference (the sm_90a build
    of every sample runs in test_interp.py); a kernel without one is refused with a located
    error naming its Hopper-only part (lowers_to_sm80 checks the error)."""
    module = sample_ir(name)
    if not lowers_to_sm80(module.kernel(kname)):
        return
    twin = sample_module(name)
    kwargs = dict(twin.SMALL)
    if len(module.kernels) > 1:
        kwargs["kernel"] = kname
    ex = twin.example(np.random.default_rng(7), **kwargs)
    out = run_sample(module, {"kernel": kname, **ex}, seed=3, arch=arch)
    types = {p.name: getattr(p.type, "elem", None) for p in module.kernel(kname).params}
    for param, want in ex["expected"].items():
        r = compare(param, out[param], want, types[param], ex.get("rtol", 0.0),
                    ex.get("atol", 0.0))
        assert r.ok, f"{param}: {r.detail}"


def test_lowering_rederives_arrival_counts_and_drops_expect_tx():
    ptx = ptxdsl.compile(SAMPLES / "add_one.ptxdsl", arch="sm_80").ptx
    # one elected arrive plus one cp.async arrive-on per lane of warp 0
    assert "mbarrier.init.shared::cta.b64 [%r1+8192], 33;" in ptx
    assert ptx.count("cp.async.cg.shared.global") == 16  # 8 KiB / 32 lanes / 16 bytes
    assert "cp.async.mbarrier.arrive.noinc.shared::cta.b64" in ptx
    assert "mbarrier.test_wait.parity" in ptx
    memcpy = ptxdsl.compile(SAMPLES / "memcpy_async.ptxdsl", arch="sm_80").ptx
    assert "288;" in memcpy  # with_barrier: 256 arrivals + 32 lanes' arrive-ons
    stream = ptxdsl.compile(SAMPLES / "stream_copy.ptxdsl", arch="sm_80").ptx
    assert "ld.param.u64" in stream and "[p_src+32]" in stream  # the tensor descriptor


# ----------------------------------------------------------------------------- explicit ops

OPS = """
kernel ops(src: ptr<u32>, dst: ptr<u32>, n: u32) threads(32) {
    shared a: u32[32][4] align 16;
    shared b: u32[32][4] align 16;
    mbarrier bar count 1;
    let t = %tid.x;
    if t == 0 {
        mbarrier_init(bar);
        fence_mbarrier_init();
    }
    bar_sync(0);
    cp_async(a[t, 0], src[t * 4], 4);
    cp_async(a[t, 1], src[t * 4 + 1], 4);
    cp_async(a[t, 2], src[t * 4 + 2], 8, n);
    cp_async_commit();
    cp_async_cg(b[t, 0], src[128 + t * 4]);
    cp_async_commit();
    cp_async_wait(1);
    dst[t * 4] = a[t, 0] + a[t, 1];
    dst[t * 4 + 1] = a[t, 2];
    dst[t * 4 + 2] = a[t, 3];
    cp_async_wait_all();
    dst[t * 4 + 3] = b[t, 3];
    bar_sync(0);
    cp_async_cg(a[t, 0], src[256 + t * 4], 16, 0);
    cp_async(b[t, 0], src[384 + t * 4], 16);
    cp_async_mbarrier_arrive(bar);
    bar_sync(0);
    if t == 0 {
        mbarrier_arrive(bar);
    }
    mbarrier_test_wait(bar, 0);
    dst[128 + t] = a[t, 0] + b[(t + 1) & 31, 1];
}
"""


def ops_reference(src: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(160, np.uint32)
    s = src[:128].reshape(32, 4)
    out[0:128:4] = s[:, 0] + s[:, 1]
    out[1:128:4] = s[:, 2] if n >= 4 else 0
    out[2:128:4] = s[:, 3] if n >= 8 else 0
    out[3:128:4] = src[128:256].reshape(32, 4)[:, 3]
    out[128:] = np.roll(src[384:512].reshape(32, 4)[:, 1], -1)  # a is zero-filled
    return out


@pytest.mark.ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_explicit_sm80_operations_assemble(arch, tmp_path):
    ptx = ptxdsl.compile(OPS, arch=arch).ptx
    for mn in ("cp.async.ca.shared.global", "cp.async.cg.shared.global", "cp.async.commit_group",
               "cp.async.wait_group 1", "cp.async.wait_all", "cp.async.mbarrier.arrive.shared",
               "mbarrier.test_wait.parity"):
        assert mn in ptx, mn
    assemble(ptx, tmp_path, arch)


@pytest.mark.parametrize("n, seed", [(8, 0), (4, 1), (0, 2)])
def test_explicit_sm80_operations_in_the_interpreter(n, seed):
    src = np.random.default_rng(seed).integers(0, 1 << 30, 512, dtype=np.uint32)
    dst = np.zeros(160, np.uint32)
    ptxdsl.interp.run(ptxdsl.parse(OPS).kernels[0], 1, {"src": src, "dst": dst, "n": n},
                      seed=seed)
    np.testing.assert_array_equal(dst, ops_reference(src, n))


def test_reading_a_cp_async_destination_before_waiting_is_a_race():
    text = OPS.replace("    cp_async_wait(1);\n", "")
    src = np.arange(512, dtype=np.uint32)
    with pytest.raises(InterpError) as info:
        ptxdsl.interp.run(ptxdsl.parse(text).kernels[0], 1,
                          {"src": src, "dst": np.zeros(160, np.uint32), "n": 8})
    assert info.value.kind == "race" and "cp_async" in str(info.value)


def test_cp_async_never_waited_is_a_verifier_error():
    text = """
kernel k(src: ptr<u32>, dst: ptr<u32>) threads(32) {
    shared a: u32[32] align 16;
    cp_async(a[%tid.x], src[%tid.x], 4);
    dst[%tid.x] = 1;
}
"""
    with pytest.raises(CompileError) as info:
        ptxdsl.compile(text, arch="sm_80")
    msg = info.value.render()
    assert "is never waited for" in msg and ":4:5:" in msg


def test_cp_async_operand_checks():
    base = "kernel k(src: ptr<u32>) threads(32) {{ shared a: u32[32] align 16; {} }}"
    with pytest.raises(CompileError, match="copies 4, 8 or 16 bytes, got 12"):
        ptxdsl.parse(base.format("cp_async(a[0], src[0], 12); cp_async_wait_all();"))
    with pytest.raises(CompileError, match="cp_async_cg copies 16 bytes, got 8"):
        ptxdsl.parse(base.format("cp_async_cg(a[0], src[0], 8); cp_async_wait_all();"))
    with pytest.raises(CompileError, match="src_bytes 20"):
        ptxdsl.parse(base.format("cp_async(a[0], src[0], 16, 20); cp_async_wait_all();"))


# ----------------------------------------------------------------------------- errors

CLUSTER = """
kernel k(src: ptr<f32>) threads(64) cluster(2) {
    shared t: f32[64] align 128;
    let x = t[0];
}
"""


def test_a_cluster_beyond_one_cta_is_a_located_sm80_error():
    msg = sm80_error(CLUSTER)
    assert ":2:8:" in msg and "cluster of 2 CTAs" in msg and "no sm_80 form" in msg
    assert ptxdsl.compile(CLUSTER, arch="sm_90a").ptx  # fine on Hopper


def test_samples_with_hopper_only_kernels_get_the_located_error():
    """How the sample tests treat a kernel without an sm_80 build."""
    assert not lowers_to_sm80(ptxdsl.parse(CLUSTER).kernels[0])
    assert lowers_to_sm80(ptxdsl.parse(TILE).kernels[0])


def test_arrive_with_a_count_is_a_located_sm80_error():
    text = """
kernel k() threads(32) {
    mbarrier b count 2;
    if %tid.x == 0 {
        mbarrier_init(b);
        fence_mbarrier_init();
    }
    bar_sync(0);
    if %tid.x == 0 {
        mbarrier_arrive(b, 2);
    }
    mbarrier_wait(b, 0);
}
"""
    msg = sm80_error(text)
    assert ":10:9:" in msg and "mbarrier_arrive with a count has no sm_80 form" in msg


def test_cluster_special_registers_are_located_sm80_errors():
    msg = sm80_error("kernel k(o: ptr<u32>) threads(32) {\n    if %cluster_ctarank == 0 {\n"
                     "        o[%tid.x] = 1;\n    }\n}")
    assert ":2:8: error: '%cluster_ctarank' has no sm_80 form" in msg


def test_any_other_hopper_only_operation_is_named_in_the_error():
    """Operations added later (wgmma, multicast, TMA reduce) reach the sm80 pass as ir.Op nodes it
    does not know: it names them instead of emitting Hopper PTX."""
    from dataclasses import dataclass
    from typing import ClassVar

    @dataclass(frozen=True, slots=True, kw_only=True)
    class FakeWgmma(ir.Op):
        syntax: ClassVar[str] = "wgmma_fake"

    m = ptxdsl.parse("kernel k() threads(128) {\n    bar_sync(0);\n}")
    k = m.kernels[0]
    node = FakeWgmma(loc=k.body[0].loc)
    bad = ir.Module(kernels=(ir.Kernel(name="k", params=(), threads=(128, 1, 1),
                                       body=(node,), loc=k.loc),))
    with pytest.raises(CompileError) as info:
        lower(bad, "sm_80")
    msg = info.value.render()
    assert "'wgmma_fake' has no sm_80 form" in msg and ":2:5:" in msg


def test_cli_check_arch_reports_what_does_not_lower(tmp_path, capsys):
    f = tmp_path / "c.ptxdsl"
    f.write_text(CLUSTER)
    assert main(["check", str(f)]) == 0
    assert main(["check", "--arch", "sm_80", str(f)]) == 1
    err = capsys.readouterr().err
    assert f"{f}:2:8: error: a cluster of 2 CTAs" in err and "sm_80" in err
    assert main(["check", "--arch", "sm_80", str(SAMPLES / "stream_copy.ptxdsl")]) == 0
    assert "lowers to sm_80" in capsys.readouterr().out


def test_cli_compile_arch_sm80(tmp_path):
    out = tmp_path / "a.ptx"
    assert main(["compile", "--arch", "sm_80", str(SAMPLES / "add_one.ptxdsl"), "-o",
                 str(out)]) == 0
    assert ".target sm_80\n" in out.read_text()
    assert main(["interp", "--arch", "sm_80", str(SAMPLES / "pipeline.ptxdsl")]) == 0


# ----------------------------------------------------------------------------- tensor tiles

TILE = """
kernel tile2x(src: tmap<f32, 2>, dst: tmap<f32, 2>) threads(128) {
    shared t: f32[8][32] align 1024;
    mbarrier bar count 1;
    if %tid.x == 0 {
        mbarrier_init(bar);
        fence_mbarrier_init();
    }
    bar_sync(0);
    let x = (%ctaid.x * 32) as s32;
    let y = (%ctaid.y * 8) as s32;
    if %tid.x == 0 {
        mbarrier_arrive_expect_tx(bar, sizeof(t));
        tma_load(t, src, [x, y], bar);
    }
    mbarrier_wait(bar, 0);
    for i in 0 .. 2 {
        let j = %tid.x * 2 + i;
        t[j >> 5, j & 31] = t[j >> 5, j & 31] * 2.0 + 1.0;
    }
    fence_proxy_async();
    bar_sync(0);
    if %tid.x == 0 {
        tma_store(dst, [x, y], t);
        bulk_commit();
        bulk_wait(0);
    }
}
"""


def tile_example(swizzle: str, rows: int = 20, cols: int = 68) -> dict:
    src = np.random.default_rng(5).standard_normal((rows, cols)).astype(np.float32)
    opts = {"box": (8, 32), "swizzle": swizzle}
    return {"grid": (-(-cols // 32), -(-rows // 8)), "inputs": {"src": src},
            "outputs": {"dst": np.empty_like(src)},
            "tensor_maps": {"src": opts, "dst": opts}, "expected": {"dst": src * 2 + 1}}


@pytest.mark.parametrize("swizzle", ["none", "128B"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_tile_over_the_edges_with_swizzle_in_the_interpreter(swizzle, arch):
    ex = tile_example(swizzle)
    out = run_sample(ptxdsl.parse(TILE), ex, arch=arch)["dst"]
    np.testing.assert_array_equal(out, ex["expected"]["dst"])


def test_tile_load_zero_fills_outside_the_tensor_on_sm80():
    text = TILE.replace("t[j >> 5, j & 31] * 2.0 + 1.0", "t[j >> 5, j & 31] + 1.0")
    src = np.full((10, 40), 5.0, np.float32)
    dst = np.zeros((16, 64), np.float32)  # a bigger destination sees the filled elements
    k = ptxdsl.parse(text).kernels[0]
    ptxdsl.interp.run(k, (2, 2), {"src": TensorMapModel(src, box=(8, 32)),
                                  "dst": TensorMapModel(dst, box=(8, 32))}, arch="sm_80")
    want = np.ones((16, 64), np.float32)
    want[:10, :40] = 6.0
    np.testing.assert_array_equal(dst, want)


def test_nan_fill_has_no_sm80_form():
    k = ptxdsl.parse(TILE).kernels[0]
    src = np.ones((8, 32), np.float32)
    with pytest.raises(InterpError, match="on sm_80 cp.async zero-fills"):
        ptxdsl.interp.run(k, 1, {"src": TensorMapModel(src, box=(8, 32), oob_fill="nan"),
                                 "dst": TensorMapModel(src.copy(), box=(8, 32))}, arch="sm_80")


@pytest.mark.ptxas
def test_watchdog_bounds_the_sm80_test_wait(tmp_path):
    ptx = ptxdsl.compile(SAMPLES / "stream_copy.ptxdsl", arch="sm_80", watchdog_ms=100).ptx
    assert "try_wait" not in ptx and "%globaltimer" in ptx and "trap" in ptx
    assemble(ptx, tmp_path, "sm_80")


# ----------------------------------------------------------------------------- runtime


class FakeDeviceArray:
    def __init__(self, shape, typestr, strides=None, ptr=0x7F0000000000):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False),
                                         "strides": strides, "version": 3}


def test_tensor_descriptor_packing():
    import struct

    from ptxdsl.kernelinfo import ParamInfo
    from ptxdsl.runtime.tensordesc import desc_converter, pack_desc

    raw = pack_desc(0x1000, (20, 68), (272, 4), 4, "128B")
    assert len(raw) == 128
    assert struct.unpack_from("<Q2I", raw, 0) == (0x1000, 68, 20)
    assert struct.unpack_from("<I", raw, 28) == (7,)
    assert struct.unpack_from("<2Q", raw, 32) == (1, 68)
    conv = desc_converter(ParamInfo("src", "tmap", ptxdsl.f32, 2))
    got = conv(FakeDeviceArray((64, 256), "<f4", (2048, 4)))
    assert got == pack_desc(0x7F0000000000, (64, 256), (2048, 4), 4)
    from ptxdsl.errors import LaunchError

    with pytest.raises(LaunchError, match="rank 1"):
        conv(FakeDeviceArray((64,), "<f4"))


def test_sm80_programs_pack_descriptors_where_sm90a_packs_tensor_maps():
    from ptxdsl.runtime.args import ArgPacker

    info = ptxdsl.compile(TILE, arch="sm_80").kernels[0]
    assert info.arch == "sm_80"
    a = FakeDeviceArray((64, 256), "<f4")
    assert ArgPacker(info).pack((a, a), {})  # a plain device array stands for the tensor
    info90 = ptxdsl.compile(TILE, arch="sm_90a").kernels[0]
    from ptxdsl.errors import LaunchError

    with pytest.raises(LaunchError, match="must be a ptxdsl TensorMap"):
        ArgPacker(info90).pack((a, a), {})


# ----------------------------------------------------------------------------- GPU


def _gpu_outputs(program, ex: dict) -> dict:
    """Run one example on the GPU; the host copies of its outputs."""
    from ptxdsl.runtime import TensorMap, synchronize, to_device

    info = program.ptx_module.kernel(ex.get("kernel"))
    arrays = {**ex.get("inputs", {}), **ex.get("outputs", {})}
    device, args = {}, []
    for p in info.params:
        v = arrays[p.name]
        if p.kind == "scalar":
            args.append(v)
            continue
        host = np.ascontiguousarray(v)
        if p.name in ex.get("outputs", {}):
            host = np.full(host.nbytes, 0xFF, np.uint8).view(host.dtype).reshape(host.shape)
        dev = device[p.name] = to_device(host, dtype=p.dtype)
        if p.kind == "tmap":
            args.append(TensorMap(dev, dtype=p.dtype, **ex.get("tensor_maps", {}).get(p.name, {})))
        else:
            args.append(dev)
    program.kernel(info.name)[ex["grid"], None, None](*args)
    synchronize()
    out = {n: device[n].copy_to_host() for n in ex.get("outputs", {})}
    for d in device.values():
        d.free()
    return out


def _gpu_cases() -> list:
    return [pytest.param(name, k.name, id=f"{name}-{k.name}")
            for name in ("add_one", "stream_copy", "norms", "memcpy_async", "pipeline",
                         "cuda_pipeline")  # every kernel of these has both builds
            for k in sample_ir(name).kernels]


@pytest.mark.gpu
@pytest.mark.parametrize("name, kname", _gpu_cases())
def test_both_builds_give_identical_results_on_the_gpu(name, kname):
    path = sample_path(name)
    twin = sample_module(name)
    multi = len(ptxdsl.parse_file(path).kernels) > 1
    ex = twin.example(np.random.default_rng(11), **({"kernel": kname} if multi else {}))
    ex.setdefault("kernel", kname)
    one = ir.Module(kernels=(ptxdsl.parse_file(path).kernel(kname),))
    outs = {arch: _gpu_outputs(Program(one, arch), ex) for arch in ("sm_80", "sm_90a")}
    types = {p.name: getattr(p.type, "elem", None)
             for p in ptxdsl.parse_file(path).kernel(kname).params}
    for param, want in ex["expected"].items():
        r = compare(param, outs["sm_80"][param], want, types[param], ex.get("rtol", 0.0),
                    ex.get("atol", 0.0))
        assert r.ok, f"sm_80 {param}: {r.detail}"
        a, b = (np.ascontiguousarray(outs[arch][param]) for arch in ("sm_80", "sm_90a"))
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))  # bit for bit


@pytest.mark.gpu
@pytest.mark.parametrize("swizzle", ["none", "128B"])
def test_tile_over_the_edges_both_builds_on_the_gpu(swizzle):
    ex = tile_example(swizzle, rows=100, cols=132)
    outs = [_gpu_outputs(ptxdsl.compile(TILE, arch=arch), ex)["dst"]
            for arch in ("sm_80", "sm_90a")]
    np.testing.assert_array_equal(outs[0], ex["expected"]["dst"])
    np.testing.assert_array_equal(outs[1], outs[0])


STORE_RING = """
kernel store_ring(src: ptr<f32>, dst: ptr<f32>, ntiles: u32) threads(64) {
    shared stage: f32[2][256] align 128;
    mbarrier full[2] count 1;
    mbarrier empty[2] count 1;
    let tid = %tid.x;
    if tid == 0 {
        for s in 0 .. 2 {
            mbarrier_init(full[s]);
            mbarrier_init(empty[s]);
        }
        fence_mbarrier_init();
    }
    bar_sync(0);
    if tid == 0 {
        for t in 0 .. ntiles {
            let s = t & 1;
            mbarrier_wait(empty[s], ((t >> 1) & 1) ^ 1);
            mbarrier_arrive_expect_tx(full[s], 1024);
            bulk_load(stage[s], src[t * 256], full[s]);
        }
    }
    if tid == 32 {
        for t in 0 .. ntiles {
            let s = t & 1;
            mbarrier_wait(full[s], (t >> 1) & 1);
            bulk_store(dst[t * 256], stage[s]);
            bulk_commit();
            bulk_wait_read(0);
            mbarrier_arrive(empty[s]);
        }
        bulk_wait(0);
    }
}
"""


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lanes_that_store_a_stage_are_ordered_before_its_release(seed):
    """Issue 44: on sm_80 the lanes of warp 1 read the stage for the widened bulk_store, and
    thread 32 alone hands it back: without a warp synchronisation between them, the next
    copy into the stage raced with the other lanes' reads."""
    from ptxdsl.interp import run

    k = ptxdsl.parse(STORE_RING, "ring.ptxdsl").kernels[0]
    src, dst = np.arange(256 * 6, dtype=np.float32), np.zeros(256 * 6, np.float32)
    run(k, 1, {"src": src, "dst": dst, "ntiles": 6}, seed=seed, arch="sm_80")
    assert (dst == src).all()
    lowered = lower(ptxdsl.parse(STORE_RING), "sm_80").kernels[0]
    [consumer] = [s for s in lowered.body if isinstance(s, ir.If)][-1:]
    assert any(isinstance(s, ir.Let) and s.value == ir.Call(fn="elect", args=(),
                                                            type=ptxdsl.types.pred)
               for s in ir.walk(consumer.then))
