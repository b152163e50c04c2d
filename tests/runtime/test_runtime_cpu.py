"""Runtime checks that need no GPU: tensor-map validation, argument checking, nvJitLink
compilation and its caches, driver-error formatting, host-side conversions."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from ptxdsl import types as T
from ptxdsl.errors import CompileError, DeviceError, LaunchError
from ptxdsl.kernelinfo import KernelInfo, ParamInfo
from ptxdsl.runtime import (
    DeviceArray,
    DevicePointer,
    Kernel,
    TensorMap,
    as_device_pointer,
    bf16_bits_to_f32,
    check,
    clear_encode_cache,
    encode_cache_info,
    f32_to_bf16_bits,
    plan_launch,
)
from ptxdsl.runtime import compile as rc
from ptxdsl.runtime import driver as rd
from ptxdsl.runtime import tensormap as rt
from ptxdsl.runtime.args import ArgPacker
from ptxdsl.runtime.interop import describe

GOOD_PTX = textwrap.dedent(
    """\
    .version 8.0
    .target sm_90a
    .address_size 64

    // out[i] = i for i < n
    .visible .entry iota(.param .u64 out, .param .u32 n) .reqntid 128
    {
        .reg .pred  %p<2>;
        .reg .b32   %r<6>;
        .reg .b64   %rd<4>;
        ld.param.u32        %r1, [n];
        mov.u32             %r2, %ctaid.x;
        mov.u32             %r3, %tid.x;
        mad.lo.u32          %r4, %r2, 128, %r3;
        setp.ge.u32         %p1, %r4, %r1;
        @%p1 bra            DONE;
        ld.param.u64        %rd1, [out];
        cvta.to.global.u64  %rd1, %rd1;
        mul.wide.u32        %rd2, %r4, 4;
        add.s64             %rd3, %rd1, %rd2;
        st.global.u32       [%rd3], %r4;
    DONE:
        ret;
    }
    """
)
# A float add on integer registers: ptxas reports "Arguments mismatch" with the line.
BAD_PTX = GOOD_PTX.replace("st.global.u32       [%rd3], %r4;", "add.f32 %r5, %rd3, %r4;")


# ---------------------------------------------------------------- import and driver errors


def test_import_does_not_load_the_driver():
    code = (
        "import sys, ptxdsl, ptxdsl.runtime\n"
        "bad = [m for m in sys.modules if m.startswith('cuda.bindings')]\n"
        "assert not bad, bad\n"
    )
    root = Path(rd.__file__).resolve().parents[2]  # the directory holding the package
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


def test_check_returns_outputs():
    assert check((0,), "cuCtxSynchronize") is None
    assert check((0, 7), "cuDeviceGet") == 7
    assert check((0, 1, 2), "cuSomething") == (1, 2)


def test_check_names_call_error_and_code():
    drv = rd.driver()
    with pytest.raises(DeviceError) as e:
        check((drv.CUresult.CUDA_ERROR_INVALID_VALUE,), "cuLaunchKernelEx")
    assert "cuLaunchKernelEx failed: CUDA_ERROR_INVALID_VALUE (1): " in str(e.value)


def test_check_marks_sticky_errors():
    drv = rd.driver()
    with pytest.raises(DeviceError, match="sticky"):
        check((drv.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS,), "cuCtxSynchronize")


class _FakeDriver:
    """Stands in for cuda.bindings.driver where the driver cannot be reached."""

    def __init__(self, init_result):
        self._init_result = init_result
        self.calls = []

    def cuInit(self, flags):  # noqa: N802 -- the driver's spelling
        self.calls.append("cuInit")
        if isinstance(self._init_result, Exception):
            raise self._init_result
        return (self._init_result,)


@pytest.mark.parametrize(
    "init_result, expected",
    [
        (RuntimeError("libcuda.so.1 not found"), "no CUDA device: RuntimeError: libcuda.so.1"),
        (100, "no CUDA device: cuInit failed: CUDA_ERROR_NO_DEVICE (100)"),
    ],
)
def test_no_gpu_gives_a_clear_device_error(monkeypatch, init_result, expected):
    if isinstance(init_result, int):
        init_result = rd.driver().CUresult(init_result)
    fake = _FakeDriver(init_result)
    monkeypatch.setattr(rd, "_drv", fake)
    monkeypatch.setattr(rd, "_ctx", None)
    monkeypatch.setattr(rd, "_ctx_error", None)
    monkeypatch.setattr(rd, "_contexts", {})
    monkeypatch.setattr(rd, "_tls", type(rd._tls)())
    assert rd.gpu_available() is False
    with pytest.raises(DeviceError) as e:
        rd.context()
    assert expected in str(e.value)
    assert fake.calls == ["cuInit"]  # the failure is remembered, not retried


def test_stream_handle_forms():
    class TorchLike:
        cuda_stream = 1234

    class CupyLike:
        ptr = 99

    assert rd.stream_handle(None) == 0
    assert rd.stream_handle(5) == 5
    assert rd.stream_handle(TorchLike()) == 1234
    assert rd.stream_handle(CupyLike()) == 99
    with pytest.raises(TypeError, match="stream must be"):
        rd.stream_handle("fast")


# ---------------------------------------------------------------- tensor maps: validation


ADDR = 0x7F00_0000_0000


def tmap(**kw):
    args = dict(dtype="f32", shape=(64, 64))
    args.update(kw)
    source = args.pop("source", DevicePointer(ADDR))
    box = args.pop("box", (32, 32))
    return TensorMap(source, box, **args)


@pytest.fixture
def fake_encoder(monkeypatch):
    """Encodes without a driver: records specs and returns distinct fake bytes."""
    seen = []

    def encode(spec):
        seen.append(spec)
        return bytes([len(seen) % 256]) * 128

    monkeypatch.setattr(rt, "_driver_encode", encode)
    clear_encode_cache()
    yield seen
    clear_encode_cache()


def rejects(match, **kw):
    with pytest.raises(LaunchError) as e:
        tmap(**kw)
    assert match in str(e.value), str(e.value)
    return str(e.value)


def test_valid_map_passes_validation(fake_encoder):
    tm = tmap(swizzle="128B")
    assert tm.dtype == T.f32 and tm.rank == 2 and len(tm.raw) == 128
    assert tm.address % 64 == 0 and bytes(tm.buffer) == tm.raw


def test_tmap_misaligned_base(fake_encoder):
    rejects(
        "global address must be 16-byte aligned, got 0x7f0000000008",
        source=DevicePointer(ADDR + 8),
    )


def test_tmap_stride_not_multiple_of_16(fake_encoder):
    rejects(
        "stride of dim 0 (2004 bytes) must be a multiple of 16",
        shape=(10, 501),
        strides=(2004, 4),
    )


def test_tmap_stride_too_large(fake_encoder):
    rejects("must be less than 2**40", shape=(2, 64), strides=(2**40, 4))


def test_tmap_innermost_must_be_contiguous(fake_encoder):
    rejects("stride of dim 1 must be 4 bytes (one f32), got 8", strides=(512, 8))


@pytest.mark.parametrize("box, index, value", [((0, 32), 0, 0), ((32, 257), 1, 257)])
def test_tmap_box_range(fake_encoder, box, index, value):
    rejects(f"box[{index}] must be in [1, 256], got {value}", box=box)


def test_tmap_reports_every_problem(fake_encoder):
    msg = rejects("box[0] must be in [1, 256], got 0", box=(0, 300))
    assert "box[1] must be in [1, 256], got 300" in msg
    assert "2 errors generated" in msg


def test_tmap_box_rank_mismatch(fake_encoder):
    rejects("box has 3 entries, expected 2", box=(4, 4, 4))


def test_tmap_inner_box_multiple_of_16_bytes(fake_encoder):
    rejects("inner box bytes must be a multiple of 16, got 8", box=(32, 2))


@pytest.mark.parametrize(
    "swizzle, inner, nbytes, span",
    [("32B", 12, 48, 32), ("64B", 32, 128, 64), ("128B", 64, 256, 128)],
)
def test_tmap_swizzle_span(fake_encoder, swizzle, inner, nbytes, span):
    rejects(
        f"inner box dimension is {nbytes} bytes; swizzle {swizzle} allows at most {span}",
        box=(8, inner),
        swizzle=swizzle,
    )


def test_tmap_swizzle_span_fits(fake_encoder):
    tmap(box=(8, 32), swizzle="128B", dtype="f32")
    tmap(box=(8, 64), swizzle="128B", dtype="bf16")


@pytest.mark.parametrize("shape, rank", [((), 0), ((2,) * 6, 6)])
def test_tmap_rank(fake_encoder, shape, rank):
    rejects(f"tensor rank must be in [1, 5] for mode 'tiled', got {rank}", shape=shape, box=())


def test_tmap_shape_zero(fake_encoder):
    rejects("shape[0] must be in [1, 4294967296], got 0", shape=(0, 64))


def test_tmap_element_strides(fake_encoder):
    rejects("element_strides[1] must be in [1, 8], got 9", element_strides=(1, 9))
    rejects("element_strides has 1 entries, expected 2", element_strides=(1,))


def test_tmap_interleave_needs_rank_3(fake_encoder):
    rejects("interleave 16B needs a tensor of rank >= 3, got 2", interleave="16B")


def test_tmap_interleave_32b_rules(fake_encoder):
    shape, box = (4, 8, 16), (2, 2, 16)
    rejects(
        "interleave 32B requires swizzle 32B, got 128B",
        shape=shape, box=box, interleave="32B", swizzle="128B",
    )  # fmt: skip
    rejects(
        "global address must be 32-byte aligned (interleave 32B), got 0x7f0000000010",
        source=DevicePointer(ADDR + 16), shape=shape, box=box, interleave="32B", swizzle="32B",
    )  # fmt: skip
    rejects(
        "stride of dim 1 (48 bytes) must be a multiple of 32 (interleave 32B)",
        shape=(4, 8, 12), strides=(384, 48, 4), box=box, interleave="32B", swizzle="32B",
    )  # fmt: skip
    tmap(shape=shape, box=box, interleave="32B", swizzle="32B")


def test_tmap_interleave_lifts_inner_box_rules(fake_encoder):
    # The 16-byte inner-box rule and the swizzle span apply only without interleave.
    tmap(shape=(4, 8, 16), box=(2, 2, 2), interleave="16B", swizzle="32B")


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(swizzle="16B"), "swizzle must be one of none, 32B, 64B, 128B; got '16B'"),
        (dict(interleave="8B"), "interleave must be one of none, 16B, 32B; got '8B'"),
        (dict(l2_promotion="512B"), "l2_promotion must be one of none, 64B, 128B, 256B"),
        (dict(oob_fill="one"), "oob_fill must be one of zero, nan; got 'one'"),
        (dict(mode="gather"), "mode must be 'tiled' or 'im2col', got 'gather'"),
        (dict(dtype="u32", oob_fill="nan"), "oob_fill 'nan' needs a floating-point dtype, got u32"),
        (dict(dtype="pred", box=(32, 32)), "tensor maps cannot hold pred elements"),
        (dict(box=None), "box is required in mode 'tiled'"),
        (dict(channels_per_pixel=8), "need mode='im2col'"),
    ],
)
def test_tmap_option_errors(fake_encoder, kw, match):
    rejects(match, **kw)


def test_tmap_host_array_rejected(fake_encoder):
    with pytest.raises(LaunchError, match="numpy array in host memory; copy it to the device"):
        TensorMap(np.zeros((64, 64), np.float32), (32, 32))


def test_tmap_raw_address_needs_dtype_and_shape(fake_encoder):
    with pytest.raises(LaunchError, match="needs dtype= and shape="):
        TensorMap(ADDR, (32, 32), shape=(64, 64))


def im2col(**kw):
    args = dict(
        dtype="f16",
        shape=(2, 16, 16, 64),
        mode="im2col",
        pixel_box_lower=(-1, -1),
        pixel_box_upper=(-1, -1),
        channels_per_pixel=64,
        pixels_per_column=128,
        box=None,
        swizzle="128B",
    )
    args.update(kw)
    return tmap(**args)


def test_im2col_valid(fake_encoder):
    tm = im2col()
    assert tm.spec.mode == "im2col" and tm.rank == 4


@pytest.mark.parametrize(
    "kw, match",
    [
        (
            dict(shape=(16, 64), strides=None),
            "tensor rank must be in [3, 5] for mode 'im2col', got 2",
        ),
        (dict(shape=(2,) * 6), "tensor rank must be in [3, 5] for mode 'im2col', got 6"),
        (dict(pixel_box_lower=(200, 0)), "pixel_box_lower[0] must be in [-128, 127] for a rank-4"),
        (dict(pixel_box_upper=(0,)), "pixel_box_upper has 1 entries, expected 2"),
        (
            dict(pixel_box_lower=(0, 17), pixel_box_upper=(0, 0)),
            "bounding box is empty along dim 2",
        ),
        (dict(channels_per_pixel=0), "channels_per_pixel must be in [1, 256], got 0"),
        (dict(channels_per_pixel=4), "inner box bytes must be a multiple of 16, got 8"),
        (dict(channels_per_pixel=128), "inner box dimension is 256 bytes; swizzle 128B allows"),
        (dict(pixels_per_column=2000), "pixels_per_column must be in [1, 1024], got 2000"),
        (dict(box=(1, 1, 1, 1)), "box is not used in mode 'im2col'"),
    ],
)
def test_im2col_errors(fake_encoder, kw, match):
    with pytest.raises(LaunchError) as e:
        im2col(**kw)
    assert match in str(e.value), str(e.value)


def test_tmap_encode_cache(fake_encoder):
    before = encode_cache_info()
    a = tmap()
    b = tmap()
    assert len(fake_encoder) == 1  # the second map came from the cache
    assert encode_cache_info().hits == before.hits + 1
    assert a.raw == b.raw
    tmap(swizzle="128B")  # any changed input encodes again
    assert len(fake_encoder) == 2


def test_tmap_driver_gets_innermost_first(monkeypatch):
    """The numpy-order inputs reach cuTensorMapEncodeTiled reversed, as cuuint types."""
    drv = rd.driver()
    calls = []
    storage = (ctypes.c_uint8 * 128)(*range(128))

    class FakeMap:
        def getPtr(self):  # noqa: N802 -- the binding's spelling
            return ctypes.addressof(storage)

    def encode(*args):
        calls.append(args)
        return (drv.CUresult.CUDA_SUCCESS, FakeMap())

    monkeypatch.setattr(drv, "cuTensorMapEncodeTiled", encode)
    monkeypatch.setattr(rt, "any_current", lambda: None)
    clear_encode_cache()
    try:
        tm = TensorMap(
            DevicePointer(ADDR), (4, 8, 16), dtype="bf16", shape=(3, 40, 96),
            strides=(40 * 256, 256, 2), element_strides=(1, 2, 1), swizzle="32B",
            l2_promotion="256B", oob_fill="nan",
        )  # fmt: skip
    finally:
        clear_encode_cache()
    assert tm.raw == bytes(range(128))
    ((dtype, rank, addr, dims, strides, box, estr, inter, swz, l2, oob),) = calls
    assert dtype == drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
    assert (rank, addr) == (3, ADDR)
    assert [int(d) for d in dims] == [96, 40, 3]
    assert [int(s) for s in strides] == [256, 40 * 256]
    assert [int(b) for b in box] == [16, 8, 4]
    assert [int(e) for e in estr] == [1, 2, 1]
    assert all(isinstance(d, drv.cuuint64_t) for d in dims + strides)
    assert all(isinstance(b, drv.cuuint32_t) for b in box + estr)
    assert inter == drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE
    assert swz == drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B
    assert l2 == drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B
    assert oob == drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA


# ---------------------------------------------------------------- launch-argument checks


INFO = KernelInfo(
    name="mix",
    params=(
        ParamInfo("x", "ptr", T.f32),
        ParamInfo("n", "scalar", T.u32),
        ParamInfo("alpha", "scalar", T.f32),
        ParamInfo("h", "scalar", T.f16),
        ParamInfo("tm", "tmap", T.bf16, 2),
    ),
    threads=(128, 1, 1),
    cluster=None,
    smem_bytes=1024,
    arch="sm_90a",
)


def fake_array(elem=T.f32, shape=(256,), ptr=0x7F00_0000_1000):
    """A DeviceArray over a made-up address: enough for checks that never reach the driver."""
    return DeviceArray(ptr, shape, elem, owned=False)


@pytest.fixture
def bf16_map(fake_encoder):
    return TensorMap(DevicePointer(ADDR), (64, 64), dtype="bf16", shape=(128, 128))


def launch_error(*args, info=INFO, **kw):
    kw.setdefault("grid", 4)
    with pytest.raises(LaunchError) as e:
        Kernel(info).launch(*args, **kw)
    return str(e.value)


def test_valid_arguments_reach_the_not_loaded_error(bf16_map):
    # Every check passes; the first thing that would need the driver is the missing function.
    with pytest.raises(DeviceError, match="kernel 'mix' is not loaded"):
        Kernel(INFO).launch(fake_array(), 10, 1.5, 0.5, bf16_map, grid=4)
    with pytest.raises(DeviceError, match="not loaded"):
        Kernel(INFO)[(2, 2),](fake_array(), n=3, alpha=1, h=np.float16(2), tm=bf16_map)
    with pytest.raises(DeviceError, match="not loaded"):
        Kernel(INFO)(fake_array(), 10, 1.5, 0.5, bf16_map, grid=(4, 1, 1))


def test_too_many_arguments(bf16_map):
    msg = launch_error(fake_array(), 1, 1.0, 1.0, bf16_map, 7)
    assert "kernel 'mix' takes 5 arguments (x, n, alpha, h, tm), got 6" in msg


def test_missing_arguments(bf16_map):
    msg = launch_error(fake_array(), 1)
    assert "kernel 'mix' is missing arguments 'alpha', 'h', 'tm'" in msg


def test_unknown_and_duplicate_keywords(bf16_map):
    msg = launch_error(fake_array(), 1, 1.0, 1.0, bf16_map, m=3, x=fake_array())
    assert "kernel 'mix' has no parameter 'm' (parameters: x, n, alpha, h, tm)" in msg
    assert "argument 'x' given both by position and by keyword" in msg


@pytest.mark.parametrize(
    "n, match",
    [
        (-1, "argument 'n' (u32) must be in [0, 4294967295], got -1"),
        (2**32, "argument 'n' (u32) must be in [0, 4294967295], got 4294967296"),
        (1.5, "argument 'n' (u32) must be an integer, got 1.5"),
        (np.float32(2), "argument 'n' (u32) must be an integer"),
        ("3", "argument 'n' (u32) must be an integer, got str '3'"),
    ],
)
def test_scalar_checks(bf16_map, n, match):
    assert match in launch_error(fake_array(), n, 1.0, 1.0, bf16_map)


def test_float_scalar_range(bf16_map):
    assert "argument 'h' (f16) must be within [-65504, 65504]" in launch_error(
        fake_array(), 1, 1.0, 1e6, bf16_map
    )
    assert "argument 'alpha' (f32) must be within" in launch_error(
        fake_array(), 1, 1e39, 1.0, bf16_map
    )
    assert "argument 'alpha' (f32) must be a number, got str" in launch_error(
        fake_array(), 1, "x", 1.0, bf16_map
    )


def test_every_bad_argument_is_reported(bf16_map):
    msg = launch_error(fake_array(T.s32), -1, 1.0, 1.0, bf16_map)
    assert "argument 'x' points to s32 elements; the kernel expects ptr<f32>" in msg
    assert "argument 'n' (u32) must be in" in msg


@pytest.mark.parametrize(
    "x, match",
    [
        (fake_array(T.s32), "argument 'x' points to s32 elements; the kernel expects ptr<f32>"),
        (DevicePointer(ADDR, "f16"), "argument 'x' points to f16 elements; the kernel expects"),
        (np.zeros(4, np.float32), "is a numpy array in host memory; copy it to the device"),
        (ADDR, "got the int 139637976727552; pass a device address as DevicePointer"),
        (2.5, "must be a device array (ptxdsl DeviceArray, torch or cupy CUDA array)"),
    ],
)
def test_pointer_checks(bf16_map, x, match):
    assert match in launch_error(x, 1, 1.0, 1.0, bf16_map)


def test_tensor_map_checks(fake_encoder, bf16_map):
    f32_map = TensorMap(DevicePointer(ADDR), (64, 32), dtype="f32", shape=(128, 128))
    msg = launch_error(fake_array(), 1, 1.0, 1.0, f32_map)
    assert (
        "argument 'tm' is a tensor map of f32 with rank 2; the kernel expects tmap<bf16, 2>" in msg
    )
    msg = launch_error(fake_array(), 1, 1.0, 1.0, bytes(128))
    assert "argument 'tm' (tmap<bf16, 2>) must be a ptxdsl TensorMap, got bytes" in msg
    rank3 = TensorMap(DevicePointer(ADDR), (2, 8, 8), dtype="bf16", shape=(4, 8, 8))
    assert "rank 3; the kernel expects tmap<bf16, 2>" in launch_error(
        fake_array(), 1, 1.0, 1.0, rank3
    )


class _CaiArray:
    """A foreign device array seen only through __cuda_array_interface__."""

    def __init__(self, typestr, shape, ptr=ADDR):
        self.__cuda_array_interface__ = {
            "shape": shape, "typestr": typestr, "data": (ptr, False), "version": 3,
        }  # fmt: skip


def test_cuda_array_interface_arrays(bf16_map):
    assert "points to s32 elements" in launch_error(_CaiArray("<i4", (8,)), 1, 1.0, 1.0, bf16_map)
    with pytest.raises(DeviceError, match="not loaded"):
        Kernel(INFO).launch(_CaiArray("<f4", (8,)), 1, 1.0, 1.0, bf16_map, grid=1)


def test_bit_types_take_any_element_of_their_size():
    info = KernelInfo("b", (ParamInfo("p", "ptr", T.b32),), (32, 1, 1), None, 0, "sm_90a")
    for elem in (T.f32, T.s32, T.u32):
        with pytest.raises(DeviceError, match="not loaded"):
            Kernel(info).launch(fake_array(elem), grid=1)
    assert "points to u16 elements" in launch_error(fake_array(T.u16), info=info)


def test_bf16_and_u16_are_distinct():
    info = KernelInfo("b", (ParamInfo("p", "ptr", T.bf16),), (32, 1, 1), None, 0, "sm_90a")
    assert "points to u16 elements; the kernel expects ptr<bf16>" in launch_error(
        fake_array(T.u16), info=info
    )


def test_packed_parameter_bytes(bf16_map):
    info = KernelInfo(
        "pack",
        (
            ParamInfo("a", "scalar", T.s8),
            ParamInfo("h", "scalar", T.f16),
            ParamInfo("b", "scalar", T.bf16),
            ParamInfo("w", "scalar", T.b32),
            ParamInfo("q", "scalar", T.u64),
            ParamInfo("d", "scalar", T.f64),
            ParamInfo("x", "ptr", T.f32),
            ParamInfo("tm", "tmap", T.bf16, 2),
            ParamInfo("f", "scalar", T.f32),
        ),
        (32, 1, 1), None, 0, "sm_90a",
    )  # fmt: skip
    packer = ArgPacker(info)
    arr = fake_array()
    addr = packer.pack((-1, 1.5, 1.0, -1, 2**64 - 1, -2.25, arr, bf16_map, 3.0), {})
    ptrs = np.ctypeslib.as_array((ctypes.c_uint64 * 9).from_address(addr))
    sizes = (1, 2, 2, 4, 8, 8, 8, 128, 4)
    got = [ctypes.string_at(int(p), n) for p, n in zip(ptrs, sizes, strict=True)]
    assert got[0] == b"\xff"
    assert got[1] == (0x3E00).to_bytes(2, "little")  # f16 1.5
    assert got[2] == (0x3F80).to_bytes(2, "little")  # bf16 1.0
    assert got[3] == b"\xff" * 4
    assert got[4] == b"\xff" * 8
    assert got[5] == np.float64(-2.25).tobytes()
    assert got[6] == arr.ptr.to_bytes(8, "little")
    assert got[7] == bf16_map.raw
    assert got[8] == np.float32(3.0).tobytes()
    assert int(ptrs[7]) % 64 == 0  # the by-value tensor map sits 64-byte aligned
    # Keyword arguments land in the same slots.
    packer.pack((), dict(a=2, h=0.0, b=0.0, w=0, q=0, d=0.0, x=arr, tm=bf16_map, f=0.0))
    assert ctypes.string_at(int(ptrs[0]), 1) == b"\x02"


# ---------------------------------------------------------------- launch settings


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(grid=0), "grid.x must be in [1, 2147483647], got 0"),
        (dict(grid=(1, 70000)), "grid.y must be in [1, 65535], got 70000"),
        (dict(grid=(1, 1, 1, 1)), "grid must be an int or a tuple of 1 to 3 ints"),
        (dict(grid=2.0), "grid must be an int or a tuple of 1 to 3 ints, got 2.0"),
        (
            dict(grid=4, block=64),
            "block (64, 1, 1) does not match the kernel's .reqntid (128, 1, 1)",
        ),
        (
            dict(grid=3, cluster=2),
            "grid (3, 1, 1) is not divisible by cluster (2, 1, 1) in dimension x",
        ),
        (dict(grid=64, cluster=(4, 8)), "cluster size 32 (4 x 8 x 1) exceeds the maximum of 16"),
        (dict(grid=4, smem=300000), "smem must be at most 232448 bytes"),
        (dict(grid=4, smem=-1), "smem must be a non-negative int"),
    ],
)
def test_launch_setting_checks(kw, match):
    with pytest.raises(LaunchError) as e:
        plan_launch(INFO, **kw)
    assert match in str(e.value), str(e.value)


def test_smem_limit_message_says_expected_and_given(bf16_map):
    msg = launch_error(fake_array(), 1, 1.0, 1.0, bf16_map, smem=232449)
    assert (
        "smem must be at most 232448 bytes (the opt-in shared memory per block), got 232449" in msg
    )


def test_plan_defaults_come_from_kernel_info():
    info = KernelInfo("c", (), (128, 1, 1), (2, 1, 1), 70000, "sm_90a")
    plan = plan_launch(info, (8, 2))
    assert plan.grid == (8, 2, 1) and plan.block == (128, 1, 1)
    assert plan.cluster == (2, 1, 1) and plan.smem == 70000
    assert plan_launch(info, 8, cluster=(4, 1, 1), smem=0).cluster == (4, 1, 1)
    # numpy integers are ints too (grids are often computed with numpy).
    plan = plan_launch(info, (np.int64(8), 2), smem=np.int32(0))
    assert plan.grid == (8, 2, 1) and plan.smem == 0


def test_subscript_forms():
    k = Kernel(INFO)
    assert k[4].grid == 4
    assert (k[4, 128].grid, k[4, 128].block) == (4, 128)
    assert k[(4, 2), None, 7].stream == 7
    with pytest.raises(LaunchError, match=r"means grid=4, block=2.*write k\[\(4, 2\),\]"):
        k[4, 2]
    with pytest.raises(LaunchError, match="use k\\[grid\\]"):
        k[1, 2, 3, 4]


# ---------------------------------------------------------------- nvJitLink and its caches


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PTXDSL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PTXDSL_CACHE", raising=False)
    rc.clear_memory_cache()
    yield tmp_path
    rc.clear_memory_cache()


def test_compile_good_ptx(cache_dir):
    cubin, log = rc.ptx_to_cubin(GOOD_PTX, "sm_90a", ["iota"])
    assert cubin.startswith(b"\x7fELF")
    assert "Compiling entry function 'iota' for 'sm_90a'" in log


def test_compile_error_names_kernel_and_ptxas_log(cache_dir):
    with pytest.raises(CompileError) as e:
        rc.ptx_to_cubin(BAD_PTX, "sm_90a", ["iota"])
    msg = str(e.value)
    assert "ptxas rejected the PTX of kernel 'iota' for sm_90a" in msg
    assert "ptxas application ptx input, line 21; error" in msg
    assert "Arguments mismatch for instruction 'add'" in msg
    assert not list(cache_dir.iterdir())  # failures are not cached


def test_compile_error_finds_entry_names(cache_dir):
    with pytest.raises(CompileError, match="kernel 'iota'"):
        rc.ptx_to_cubin(BAD_PTX, "sm_90a")


def test_bad_arch(cache_dir):
    with pytest.raises(CompileError, match="arch must look like 'sm_90a', got 'hopper'"):
        rc.ptx_to_cubin(GOOD_PTX, "hopper")


def test_memory_and_disk_cache(cache_dir):
    s0 = (rc.stats.memory_hits, rc.stats.disk_hits, rc.stats.compiles)
    first = rc.ptx_to_cubin(GOOD_PTX, "sm_90a")
    assert rc.stats.compiles == s0[2] + 1
    assert len(list(cache_dir.glob("*.cubin"))) == 1
    assert rc.ptx_to_cubin(GOOD_PTX, "sm_90a") == first
    assert rc.stats.memory_hits == s0[0] + 1
    rc.clear_memory_cache()  # as in a new process
    assert rc.ptx_to_cubin(GOOD_PTX, "sm_90a") == first
    assert rc.stats.disk_hits == s0[1] + 1
    assert rc.stats.compiles == s0[2] + 1


WS_PTX = """.version 8.0
.target sm_90a
.address_size 64
.visible .entry ws() .reqntid 256, 1, 1
{
    .reg .pred %p;
    .reg .b32 %r;
    mov.u32 %r, %tid.x;
    setp.lt.u32 %p, %r, 128;
    @%p bra $L_small;
    setmaxnreg.inc.sync.aligned.u32 240;
    ret;
$L_small:
    setmaxnreg.dec.sync.aligned.u32 24;
    ret;
}
"""


def test_setmaxnreg_modules_load_through_the_driver_jit(cache_dir):
    """nvJitLink compiles PTX as relocatable code, where ptxas ignores setmaxnreg (C7504):
    the reason `load` hands such modules to the driver JIT. If a later nvJitLink honours it,
    this fails and the detour can go."""
    assert rc.whole_program(WS_PTX) and not rc.whole_program(GOOD_PTX)
    _, log = rc.ptx_to_cubin(WS_PTX, "sm_90a")
    assert "C7504" in log and "setmaxnreg" in log, log


def test_cache_key_covers_arch_and_text():
    key = rc.cache_key(GOOD_PTX, "sm_90a")
    assert key == rc.cache_key(GOOD_PTX, "sm_90a")
    assert key != rc.cache_key(GOOD_PTX, "sm_90")
    assert key != rc.cache_key(GOOD_PTX + "\n", "sm_90a")


@pytest.mark.parametrize("damage", [b"", b"garbage", "flip"])
def test_corrupt_cache_entry_is_rebuilt(cache_dir, damage):
    first = rc.ptx_to_cubin(GOOD_PTX, "sm_90a")
    (path,) = cache_dir.glob("*.cubin")
    if damage == "flip":
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0xFF
        path.write_bytes(bytes(raw))
    else:
        path.write_bytes(damage)
    rc.clear_memory_cache()
    compiles = rc.stats.compiles
    # The info log carries a compile time, so only the cubin is reproducible.
    assert rc.ptx_to_cubin(GOOD_PTX, "sm_90a")[0] == first[0]
    assert rc.stats.compiles == compiles + 1
    rc.clear_memory_cache()
    disk_hits = rc.stats.disk_hits
    rc.ptx_to_cubin(GOOD_PTX, "sm_90a")  # the rebuilt entry was written back
    assert rc.stats.disk_hits == disk_hits + 1


def test_disk_cache_can_be_disabled(cache_dir, monkeypatch):
    monkeypatch.setenv("PTXDSL_CACHE", "0")
    rc.ptx_to_cubin(GOOD_PTX, "sm_90a")
    assert not list(cache_dir.iterdir())
    rc.clear_memory_cache()
    compiles = rc.stats.compiles
    rc.ptx_to_cubin(GOOD_PTX, "sm_90a")
    assert rc.stats.compiles == compiles + 1


def test_unwritable_cache_dir_is_not_an_error(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("PTXDSL_CACHE_DIR", str(blocker / "sub"))
    rc.clear_memory_cache()
    try:
        assert rc.ptx_to_cubin(GOOD_PTX, "sm_90a")[0].startswith(b"\x7fELF")
    finally:
        rc.clear_memory_cache()


# ---------------------------------------------------------------- host-side conversions


def test_bf16_bits():
    values = np.array([1.0, -2.0, 1.00390625, 1.01171875, 3.0e38, np.inf, 0.0], np.float32)
    bits = f32_to_bf16_bits(values)
    assert bits.dtype == np.uint16
    assert list(bits) == [0x3F80, 0xC000, 0x3F80, 0x3F82, 0x7F62, 0x7F80, 0x0000]
    assert np.isnan(bf16_bits_to_f32(f32_to_bf16_bits(np.float32("nan"))))
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1000).astype(np.float32)
    np.testing.assert_allclose(bf16_bits_to_f32(f32_to_bf16_bits(x)), x, rtol=2**-8)


def test_scalar_bf16_matches_array_conversion(bf16_map):
    info = KernelInfo("b", (ParamInfo("v", "scalar", T.bf16),), (32, 1, 1), None, 0, "sm_90a")
    packer = ArgPacker(info)
    rng = np.random.default_rng(1)
    for v in rng.standard_normal(50).astype(np.float32):
        addr = packer.pack((float(v),), {})
        ptr = int(np.ctypeslib.as_array((ctypes.c_uint64 * 1).from_address(addr))[0])
        got = int.from_bytes(ctypes.string_at(ptr, 2), "little")
        assert got == int(f32_to_bf16_bits(v))


def test_device_array_interface_without_gpu():
    a = fake_array(T.bf16, (4, 8))
    cai = a.__cuda_array_interface__
    assert cai["shape"] == (4, 8) and cai["typestr"] == "<u2" and cai["data"] == (a.ptr, False)
    assert a.strides == (16, 2) and a.nbytes == 64 and a.dtype == ml_dtypes.bfloat16
    assert as_device_pointer(a) == DevicePointer(a.ptr, T.bf16)
    assert as_device_pointer(5) == DevicePointer(5)


def test_describe_cuda_array_interface_strides():
    d = describe(_CaiArray("<f2", (3, 5)))
    assert (d.ptr, d.shape, d.strides, d.elem) == (ADDR, (3, 5), (10, 2), T.f16)


def test_describe_dlpack():
    host = np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2]

    class CudaLooking:
        """numpy's DLPack export, claiming to live on a GPU, to exercise the parser."""

        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, **kw):
            return host.__dlpack__()

    d = describe(CudaLooking())
    assert d.ptr == host.ctypes.data
    assert (d.shape, d.strides, d.elem) == ((3, 2), (16, 8), T.s32)


def test_describe_rejects_cpu_dlpack():
    class CpuTensor:
        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, **kw):
            raise AssertionError("not to be called")

    with pytest.raises(LaunchError, match="not in GPU memory; copy it to the device"):
        describe(CpuTensor(), "argument 'x'")


def test_device_pointer_validation():
    with pytest.raises(TypeError):
        DevicePointer(1.5)
    with pytest.raises(ValueError):
        DevicePointer(-1)
    assert DevicePointer(16, "f32").dtype == T.f32


# ---------------------------------------------------------------- driver calls, against a fake


class FakeGpu:
    """A stand-in for cuda.bindings.driver: real structs and enums, fake calls. Memory is a
    dict of bytearrays; a launch runs `kernels[name]` on the packed parameters."""

    def __init__(self, kernels):
        self._real = rd.driver()
        self.kernels = kernels
        self.memory: dict[int, bytearray] = {}
        self.calls: list[tuple] = []
        self.attrs: dict[tuple[str, int], int] = {}
        self._next = 0x7000_0000_0000

    def __getattr__(self, name):
        return getattr(self._real, name)

    def _ok(self, *out):
        return (self._real.CUresult.CUDA_SUCCESS, *out)

    def cuInit(self, flags):  # noqa: N802 -- the driver's spellings throughout
        return self._ok()

    def cuCtxGetCurrent(self):  # noqa: N802 -- no other library made a context current
        return self._ok(0)

    def cuDeviceGetCount(self):  # noqa: N802
        return self._ok(1)

    def cuDeviceGet(self, ordinal):  # noqa: N802
        return self._ok(ordinal)

    def cuDevicePrimaryCtxRetain(self, dev):  # noqa: N802
        return self._ok(0xC7)

    def cuCtxSetCurrent(self, ctx):  # noqa: N802
        return self._ok()

    def cuDeviceGetName(self, n, dev):  # noqa: N802
        return self._ok(b"Fake H200\0")

    def cuDeviceGetAttribute(self, attr, dev):  # noqa: N802
        values = {"COMPUTE_CAPABILITY_MAJOR": 9, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 232448}
        return self._ok(values.get(attr.name.removeprefix("CU_DEVICE_ATTRIBUTE_"), 1))

    def cuMemAlloc(self, n):  # noqa: N802
        ptr, self._next = self._next, self._next + ((n + 255) // 256) * 256
        self.memory[ptr] = bytearray(n)
        return self._ok(ptr)

    def cuMemcpyHtoD(self, dst, src, n):  # noqa: N802
        self.memory[dst][:n] = memoryview(src).cast("B")[:n]
        return self._ok()

    def cuMemcpyDtoH(self, dst, src, n):  # noqa: N802
        memoryview(dst).cast("B")[:n] = self.memory[src][:n]
        return self._ok()

    def cuMemsetD8(self, ptr, value, n):  # noqa: N802
        self.memory[ptr][:n] = bytes([value]) * n
        return self._ok()

    def cuMemFree(self, ptr):  # noqa: N802
        del self.memory[ptr]
        return self._ok()

    def cuModuleLoadData(self, image):  # noqa: N802
        assert bytes(image).startswith(b"\x7fELF")
        self.calls.append(("cuModuleLoadData",))
        return self._ok("module")

    def cuModuleGetFunction(self, mod, name):  # noqa: N802
        if name.decode() not in self.kernels:
            return (self._real.CUresult.CUDA_ERROR_NOT_FOUND,)
        return self._ok(name.decode())

    def cuFuncGetAttribute(self, attr, fn):  # noqa: N802
        key = attr.name.removeprefix("CU_FUNC_ATTRIBUTE_")
        return self._ok({"MAX_DYNAMIC_SHARED_SIZE_BYTES": 49152, "SHARED_SIZE_BYTES": 16}[key])

    def cuFuncSetAttribute(self, fn, attr, value):  # noqa: N802
        self.calls.append(("cuFuncSetAttribute", fn, attr.name, value))
        return self._ok()

    def cuLaunchKernelEx(self, cfg, fn, params, extra):  # noqa: N802
        attrs = [
            (a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z) for a in cfg.attrs
        ]
        grid = (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ)
        self.calls.append(("launch", fn, grid, cfg.blockDimX, cfg.sharedMemBytes, attrs))
        self.kernels[fn](self, params)
        return self._ok()

    def read(self, addr, n):
        for base, buf in self.memory.items():
            if base <= addr < base + len(buf):
                return bytes(buf[addr - base : addr - base + n])
        raise AssertionError(f"no allocation at 0x{addr:x}")

    def write(self, addr, data):
        for base, buf in self.memory.items():
            if base <= addr < base + len(buf):
                buf[addr - base : addr - base + len(data)] = data
                return
        raise AssertionError(f"no allocation at 0x{addr:x}")


def _fake_axpy(gpu, params):
    """The semantics of the iota-style axpy kernel, read from the packed parameters."""
    slots = np.ctypeslib.as_array((ctypes.c_uint64 * 5).from_address(params))
    x, y, out = (int.from_bytes(ctypes.string_at(int(p), 8), "little") for p in slots[:3])
    alpha = np.frombuffer(ctypes.string_at(int(slots[3]), 4), np.float32)[0]
    n = int.from_bytes(ctypes.string_at(int(slots[4]), 4), "little")
    xs = np.frombuffer(gpu.read(x, 4 * n), np.float32)
    ys = np.frombuffer(gpu.read(y, 4 * n), np.float32)
    gpu.write(out, (alpha * xs + ys).astype(np.float32).tobytes())


AXPY_INFO = KernelInfo(
    "iota",  # GOOD_PTX's entry; the fake runs axpy semantics on its parameters
    (
        ParamInfo("x", "ptr", T.f32),
        ParamInfo("y", "ptr", T.f32),
        ParamInfo("out", "ptr", T.f32),
        ParamInfo("alpha", "scalar", T.f32),
        ParamInfo("n", "scalar", T.u32),
    ),
    (128, 1, 1),
    None,
    0,
    "sm_90a",
)


@pytest.fixture
def fake_gpu(monkeypatch, cache_dir):
    from ptxdsl.runtime import module as rm

    gpu = FakeGpu({"iota": _fake_axpy})
    for name, value in [("_drv", gpu), ("_ctx", None), ("_ctx_error", None), ("_infos", {}),
                        ("_contexts", {})]:
        monkeypatch.setattr(rd, name, value)
    monkeypatch.setattr(rd, "_tls", type(rd._tls)())
    monkeypatch.setattr(rm, "_modules", {})
    monkeypatch.setattr(rm, "_loaded", {})
    return gpu


def test_load_and_launch_through_the_driver_api(fake_gpu):
    from ptxdsl.kernelinfo import PtxModule
    from ptxdsl.runtime import load, to_device, zeros

    module = PtxModule(GOOD_PTX, (AXPY_INFO,), "sm_90a")
    k = load(module)["iota"]
    assert load(module)["iota"] is k  # cached per context
    x = np.arange(300, dtype=np.float32)
    y = np.ones(300, np.float32)
    dx, dy, out = to_device(x), to_device(y), zeros(300, "f32")
    k[3](dx, dy, out, 2.0, 300)
    np.testing.assert_array_equal(out.numpy(), 2 * x + 1)
    assert fake_gpu.calls[-1] == ("launch", "iota", (3, 1, 1), 128, 0, [])
    with pytest.raises(LaunchError, match="no kernel named 'nope' in this module; kernels: 'iota'"):
        load(module)["nope"]
    missing = PtxModule(
        GOOD_PTX, (AXPY_INFO, KernelInfo("ghost", (), (32, 1, 1), None, 0, "sm_90a")), "sm_90a"
    )
    with pytest.raises(LaunchError, match="kernel 'ghost' is described by the module's KernelInfo"):
        load(missing)


def test_function_attributes_are_raised_once(fake_gpu):
    from ptxdsl.kernelinfo import PtxModule
    from ptxdsl.runtime import load, zeros

    k = load(PtxModule(GOOD_PTX, (AXPY_INFO,), "sm_90a"))["iota"]
    a = zeros(4, "f32")

    def set_calls():
        return [c[2:] for c in fake_gpu.calls if c[0] == "cuFuncSetAttribute"]

    k.launch(a, a, a, 1.0, 0, grid=1, smem=40000)  # under the 48 KB default: nothing to raise
    assert set_calls() == []
    for _ in range(2):
        k.launch(a, a, a, 1.0, 0, grid=1, smem=100000)
    k.launch(a, a, a, 1.0, 0, grid=1, smem=80000)  # already allowed
    assert set_calls() == [("CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 100000)]
    k.launch(a, a, a, 1.0, 0, grid=32, cluster=16)
    k.launch(a, a, a, 1.0, 0, grid=32, cluster=16)
    assert set_calls()[1:] == [("CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED", 1)]
    assert fake_gpu.calls[-1] == ("launch", "iota", (32, 1, 1), 128, 0, [(16, 1, 1)])
    # The kernel's 16 bytes of static shared memory count against the opt-in maximum.
    with pytest.raises(LaunchError, match="smem can be at most 232432"):
        k.launch(a, a, a, 1.0, 0, grid=1, smem=232448)


# ---------------------------------------------------------------- fast launch paths


class _FakeDtype:
    """Stands in for a torch dtype: hashable, prints as torch prints it."""

    def __init__(self, name):
        self.name = name

    def __str__(self):
        return f"torch.{self.name}"


FLOAT32, FLOAT16 = _FakeDtype("float32"), _FakeDtype("float16")


class _FakeTensor:
    """The part of torch.Tensor that ptxdsl reads (recognised by its module's name)."""

    is_cuda = True
    full_checks = 0  # element_size() is read only by the full check (ptxdsl's describe)

    def __init__(self, ptr, dtype=FLOAT32, shape=(8,), is_cuda=True):
        self._ptr, self.dtype, self.shape, self.is_cuda = ptr, dtype, shape, is_cuda

    def data_ptr(self):
        return self._ptr

    def element_size(self):
        _FakeTensor.full_checks += 1
        return 4 if self.dtype is FLOAT32 else 2

    def stride(self):
        return tuple(int(np.prod(self.shape[i + 1 :])) for i in range(len(self.shape)))

    device = "cpu"


_FakeTensor.__module__ = "torch.fake"


def _pointer_slot(packer, args):
    addr = packer.pack(args, {})
    ptrs = np.ctypeslib.as_array((ctypes.c_uint64 * 1).from_address(addr))
    return int.from_bytes(ctypes.string_at(int(ptrs[0]), 8), "little")


def test_torch_tensors_pass_on_their_address_once_their_dtype_is_checked():
    info = KernelInfo("t", (ParamInfo("p", "ptr", T.f32),), (32, 1, 1), None, 0, "sm_90a")
    packer = ArgPacker(info)
    checks = _FakeTensor.full_checks
    assert _pointer_slot(packer, (_FakeTensor(0x1000),)) == 0x1000  # full check, dtype trusted
    assert _FakeTensor.full_checks == checks + 1
    assert _pointer_slot(packer, (_FakeTensor(0x2000, shape=(3, 3)),)) == 0x2000  # fast path
    assert _FakeTensor.full_checks == checks + 1
    # a trusted dtype does not let a CPU tensor or another dtype through
    with pytest.raises(LaunchError, match="torch tensor on cpu"):
        packer.pack((_FakeTensor(0x3000, is_cuda=False),), {})
    with pytest.raises(LaunchError, match="points to f16 elements"):
        packer.pack((_FakeTensor(0x3000, FLOAT16),), {})
    # each parameter trusts on its own: an f16 parameter still checks f32 tensors
    info16 = KernelInfo("h", (ParamInfo("p", "ptr", T.f16),), (32, 1, 1), None, 0, "sm_90a")
    with pytest.raises(LaunchError, match="points to f32 elements"):
        ArgPacker(info16).pack((_FakeTensor(0x1000),), {})


def test_a_packer_per_thread_keeps_launches_apart():
    info = KernelInfo("t", (ParamInfo("p", "ptr", T.f32),), (32, 1, 1), None, 0, "sm_90a")
    a = ArgPacker(info)
    b = a.copy()
    assert a.params_address != b.params_address
    _pointer_slot(a, (fake_array(ptr=0x1000),))
    assert _pointer_slot(b, (fake_array(ptr=0x2000),)) == 0x2000
    ptrs = np.ctypeslib.as_array((ctypes.c_uint64 * 1).from_address(a.params_address))
    assert int.from_bytes(ctypes.string_at(int(ptrs[0]), 8), "little") == 0x1000


def test_generated_packer_reports_every_bad_argument(bf16_map):
    # the inline fast path falls back to the converters, which report all problems at once
    msg = launch_error(fake_array(T.s32), -1, "x", 1.0, bf16_map)
    assert "points to s32" in msg and "'n' (u32) must be in" in msg and "'alpha'" in msg


def test_tensor_maps_are_cached_by_their_inputs(fake_encoder):
    before = encode_cache_info()
    a = TensorMap(_FakeTensor(0x7F00_0000_0000, shape=(64, 64)), (32, 32))
    assert TensorMap(_FakeTensor(0x7F00_0000_0000, shape=(64, 64)), [32, 32]) is a
    assert encode_cache_info().hits == before.hits + 1 and len(fake_encoder) == 1
    # another address, box or option builds (and checks) a new map
    b = TensorMap(_FakeTensor(0x7F00_0000_1000, shape=(64, 64)), (32, 32))
    c = TensorMap(_FakeTensor(0x7F00_0000_0000, shape=(64, 64)), (32, 32), swizzle="128B")
    assert len({id(a), id(b), id(c)}) == 3 and len(fake_encoder) == 3
    with pytest.raises(LaunchError, match="box"):
        TensorMap(_FakeTensor(0x7F00_0000_0000, shape=(64, 64)), (32, 300))


@pytest.mark.parametrize("stream", [None, 0, 1, 2])
def test_graph_capture_needs_a_created_stream(stream):
    from ptxdsl.runtime import capture

    with pytest.raises(LaunchError, match="not the default stream"):
        capture(stream)


def test_launchers_are_kept_per_key_but_not_per_stream_object():
    k = Kernel(INFO)
    assert k[4] is k[4] and k[(2, 2), None] is k[(2, 2), None]
    assert k[4] is not k[5]
    assert k[[2, 2],] is not k[[2, 2],]  # unhashable settings: a new launcher each time

    class FakeStream:
        handle = 0x1234

    s = FakeStream()
    assert k[4, None, s] is not k[4, None, s]


def test_tensor_map_with_an_unhashable_option_is_built_uncached(fake_encoder):
    src = _FakeTensor(0x7F00_0000_0000, shape=(64, 64))
    a = TensorMap(src, (32, 32), element_strides=[1, 1])
    b = TensorMap(src, (32, 32), element_strides=[1, 1])
    assert a is not b and a.raw == b.raw


def test_swizzled_map_into_a_tile_aligned_for_no_swizzle_is_refused_at_launch(fake_encoder):
    """The compiler says nothing about a tile that declares no swizzle (its map's swizzle is
    known only here); the launch refuses a swizzle the tile is not aligned for, on the checked
    path and on the fast one."""
    import ptxdsl

    text = """
kernel tile(map: tmap<f32, 2>) threads(32) {
    shared smem: f32[8][32] align 128;
    mbarrier bar count 1;
    if %laneid == 0 {
        mbarrier_init(bar);
        fence_mbarrier_init();
    }
    bar_sync(0);
    if %laneid == 0 {
        mbarrier_arrive_expect_tx(bar, sizeof(smem));
        tma_load(smem, map, [0, 0], bar);
    }
    mbarrier_wait(bar, 0);
}
"""
    info = ptxdsl.compile(text).ptx_module.kernel()
    assert (info.params[0].tile_align, info.params[0].tile) == (128, "smem")
    packer = ArgPacker(info)
    for _ in range(2):  # the second call takes the fast path
        packer.pack((tmap(box=(8, 32)),), {})
        with pytest.raises(LaunchError) as e:
            packer.pack((tmap(box=(8, 32), swizzle="128B"),), {})
        assert str(e.value) == (
            "error: argument 'map' is a tensor map with swizzle 128B, which needs 1024-byte "
            "aligned shared tiles, but the kernel's tile in 'smem' is 128-byte aligned: declare it "
            "`align 1024`, or pass a map without swizzle")
    with pytest.raises(LaunchError, match="swizzle 64B, which needs 512-byte aligned"):
        packer.pack((tmap(box=(8, 16), swizzle="64B"),), {})
    aligned = ptxdsl.compile(text.replace("align 128", "align 1024")).ptx_module.kernel()
    ArgPacker(aligned).pack((tmap(box=(8, 32), swizzle="128B"),), {})


def test_default_device_follows_a_context_another_library_made_current(monkeypatch):
    """Under torchrun, torch.cuda.set_device(local_rank) makes that GPU's context current
    before ptxdsl's first call: ptxdsl must default to it, not make GPU 0's context current
    (which would move torch's current device too)."""

    class Current:
        def cuCtxGetCurrent(self):  # noqa: N802
            return (0, 0xC0FFEE)

        def cuCtxGetDevice(self):  # noqa: N802
            return (0, 3)

    monkeypatch.delenv("PTXDSL_DEVICE", raising=False)
    monkeypatch.setattr(rd, "_drv", Current())
    assert rd._device_ordinal() == 3
    monkeypatch.setenv("PTXDSL_DEVICE", "1")
    assert rd._device_ordinal() == 1


class _JitDriver:
    """The driver module with cuModuleLoadDataEx answering `err` and an error log."""

    def __init__(self, err):
        self._real, self.err = rd.driver(), err

    def __getattr__(self, name):
        return getattr(self._real, name)

    def cuModuleLoadDataEx(self, image, n, options, values):
        values[2][:19] = b"ptxas: line 7 boom\0"
        return (self.err, None)


@pytest.mark.parametrize("name, error", [("CUDA_ERROR_INVALID_PTX", CompileError),
                                         ("CUDA_ERROR_OUT_OF_MEMORY", DeviceError)])
def test_driver_jit_failures_name_the_kernel_and_the_cause(monkeypatch, name, error):
    """PTX the JIT rejects is a CompileError with its log; any other failure a DeviceError."""
    from ptxdsl.runtime import module

    fake = _JitDriver(getattr(rd.driver().CUresult, name))
    monkeypatch.setattr(module, "driver", lambda: fake)
    with pytest.raises(error) as e:
        module._jit_load(b".version 8.0\0", ["attention"])
    text = str(e.value)
    assert "'attention'" in text and name in text, text
    assert ("line 7 boom" in text) == (error is CompileError), text


class _LoadDriver(_JitDriver):
    """The driver module with module loads faked: the JIT of one image waits for `release`."""

    def __init__(self, slow: bytes):
        super().__init__(0)
        self.slow, self.release, self.jits = slow, threading.Event(), []

    def cuModuleLoadDataEx(self, image, n, options, values):
        self.jits.append(image)
        if image == self.slow:
            assert self.release.wait(10), "the slow JIT was never released"
        return (0, f"module {len(self.jits)}")

    def cuModuleLoadData(self, image):
        return (0, "module plain")

    def cuModuleGetFunction(self, handle, name):
        return (0, f"{handle}:{name.decode()}")


def test_a_slow_driver_jit_holds_up_no_other_module(monkeypatch, cache_dir):
    """A module in the driver JIT blocks only the threads that want that module: another
    module loads meanwhile, and the waiting thread gets the one CUmodule, compiled once."""
    import types

    from ptxdsl.kernelinfo import PtxModule
    from ptxdsl.runtime import launch, module

    ws = PtxModule(WS_PTX, (KernelInfo("ws", (), (256, 1, 1), None, 0, "sm_90a"),), "sm_90a")
    plain = PtxModule(GOOD_PTX, (KernelInfo("iota", (), (128, 1, 1), None, 0, "sm_90a"),),
                      "sm_90a")
    fake = _LoadDriver(WS_PTX.encode() + b"\0")
    monkeypatch.setattr(module, "driver", lambda: fake)
    monkeypatch.setattr(module, "context", lambda: types.SimpleNamespace(handle=4242))
    monkeypatch.setattr(launch, "device_info", lambda: types.SimpleNamespace(max_smem_optin=0))
    monkeypatch.setattr(module, "_modules", {})
    monkeypatch.setattr(module, "_loaded", {})
    monkeypatch.setattr(module, "_key_locks", {})
    got = {}

    def load(name, m):
        got.setdefault(name, []).append(module.load(m))

    slow = [threading.Thread(target=load, args=("ws", ws)) for _ in range(2)]
    for t in slow:
        t.start()
    fast = threading.Thread(target=load, args=("plain", plain))
    fast.start()
    fast.join(5)
    assert not fast.is_alive() and got["plain"][0]["iota"].function.handle == \
        "module plain:iota"
    fake.release.set()
    for t in slow:
        t.join(5)
    a, b = got["ws"]
    assert a is b and fake.jits == [fake.slow]
