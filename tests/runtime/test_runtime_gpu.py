"""Runtime on a Hopper GPU: load, launch, tensor maps, clusters, big shared memory, interop.

Kernels are hand-written PTX so that these tests depend on the runtime alone."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from ptxdsl import types as T
from ptxdsl.errors import CompileError, LaunchError
from ptxdsl.kernelinfo import KernelInfo, ParamInfo, PtxModule
from ptxdsl.runtime import (
    DeviceArray,
    DevicePointer,
    Event,
    Stream,
    TensorMap,
    benchmark,
    capture,
    clear_encode_cache,
    device_info,
    empty,
    encode_cache_info,
    f32_to_bf16_bits,
    gpu_available,
    launch_overhead_us,
    load,
    synchronize,
    to_device,
    zeros,
)


def _hopper() -> bool:
    return gpu_available() and device_info().compute_capability == (9, 0)


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _hopper(), reason="needs an sm_90 GPU and the CUDA driver"),
]

HEADER = ".version 8.0\n.target sm_90a\n.address_size 64\n"


def ptx_module(body: str, *kernels: KernelInfo) -> PtxModule:
    return PtxModule(HEADER + textwrap.dedent(body), tuple(kernels), "sm_90a")


def kinfo(name, params, threads=128, cluster=None, smem=0) -> KernelInfo:
    return KernelInfo(name, tuple(params), (threads, 1, 1), cluster, smem, "sm_90a")


# out[i] = alpha * x[i] + y[i] for i < n
AXPY = ptx_module(
    """
    .visible .entry axpy(
        .param .u64 x, .param .u64 y, .param .u64 out, .param .f32 alpha, .param .u32 n
    ) .reqntid 128
    {
        .reg .pred  %p<2>;
        .reg .b32   %r<5>;
        .reg .b64   %rd<8>;
        .reg .f32   %f<5>;
        ld.param.u32        %r1, [n];
        mov.u32             %r2, %ctaid.x;
        mov.u32             %r3, %tid.x;
        mad.lo.u32          %r4, %r2, 128, %r3;
        setp.ge.u32         %p1, %r4, %r1;
        @%p1 bra            DONE;
        ld.param.u64        %rd1, [x];
        cvta.to.global.u64  %rd1, %rd1;
        ld.param.u64        %rd2, [y];
        cvta.to.global.u64  %rd2, %rd2;
        ld.param.u64        %rd3, [out];
        cvta.to.global.u64  %rd3, %rd3;
        mul.wide.u32        %rd4, %r4, 4;
        add.s64             %rd5, %rd1, %rd4;
        add.s64             %rd6, %rd2, %rd4;
        add.s64             %rd7, %rd3, %rd4;
        ld.global.f32       %f1, [%rd5];
        ld.global.f32       %f2, [%rd6];
        ld.param.f32        %f3, [alpha];
        fma.rn.f32          %f4, %f3, %f1, %f2;
        st.global.f32       [%rd7], %f4;
    DONE:
        ret;
    }
    """,
    kinfo(
        "axpy",
        [
            ParamInfo("x", "ptr", T.f32),
            ParamInfo("y", "ptr", T.f32),
            ParamInfo("out", "ptr", T.f32),
            ParamInfo("alpha", "scalar", T.f32),
            ParamInfo("n", "scalar", T.u32),
        ],
    ),
)

# Writes the raw bits of every scalar parameter to out[0..7] (u32 words): a, h, b, s, q, d.
ECHO = ptx_module(
    """
    .visible .entry echo(
        .param .u64 out, .param .s8 a, .param .b16 h, .param .b16 b, .param .u64 q,
        .param .f64 d, .param .s32 s
    ) .reqntid 32
    {
        .reg .pred  %p<2>;
        .reg .b16   %rs<3>;
        .reg .b32   %r<8>;
        .reg .b64   %rd<4>;
        mov.u32             %r1, %tid.x;
        setp.ne.u32         %p1, %r1, 0;
        @%p1 bra            DONE;
        ld.param.u64        %rd1, [out];
        cvta.to.global.u64  %rd1, %rd1;
        ld.param.s8         %r2, [a];
        st.global.u32       [%rd1], %r2;
        ld.param.b16        %rs1, [h];
        cvt.u32.u16         %r3, %rs1;
        st.global.u32       [%rd1+4], %r3;
        ld.param.b16        %rs2, [b];
        cvt.u32.u16         %r4, %rs2;
        st.global.u32       [%rd1+8], %r4;
        ld.param.s32        %r5, [s];
        st.global.u32       [%rd1+12], %r5;
        ld.param.u64        %rd2, [q];
        st.global.u64       [%rd1+16], %rd2;
        ld.param.b64        %rd3, [d];
        st.global.u64       [%rd1+24], %rd3;
    DONE:
        ret;
    }
    """,
    kinfo(
        "echo",
        [
            ParamInfo("out", "ptr", T.u32),
            ParamInfo("a", "scalar", T.s8),
            ParamInfo("h", "scalar", T.f16),
            ParamInfo("b", "scalar", T.bf16),
            ParamInfo("q", "scalar", T.u64),
            ParamInfo("d", "scalar", T.f64),
            ParamInfo("s", "scalar", T.s32),
        ],
        threads=32,
    ),
)

# Thread t stores 7t+1 at word (size/4 - 1 - t) counted from the top of the dynamic shared
# memory, so the store lands only if the whole requested size exists; then every thread reads
# its neighbour's word back. out[0] = %dynamic_smem_size, out[1 + t] = the word read.
BIG_SMEM = ptx_module(
    """
    .extern .shared .align 16 .b8 dsmem[];

    .visible .entry big_smem(.param .u64 out) .reqntid 128
    {
        .reg .pred  %p<2>;
        .reg .b32   %r<12>;
        .reg .b64   %rd<4>;
        ld.param.u64        %rd1, [out];
        cvta.to.global.u64  %rd1, %rd1;
        mov.u32             %r1, %dynamic_smem_size;
        mov.u32             %r2, %tid.x;
        mov.u32             %r3, dsmem;
        add.u32             %r4, %r3, %r1;
        sub.u32             %r4, %r4, 4;            // address of the top word
        shl.b32             %r5, %r2, 2;
        sub.u32             %r6, %r4, %r5;
        mad.lo.u32          %r7, %r2, 7, 1;
        st.shared.u32       [%r6], %r7;
        bar.sync            0;
        add.u32             %r8, %r2, 1;
        and.b32             %r8, %r8, 127;
        shl.b32             %r8, %r8, 2;
        sub.u32             %r9, %r4, %r8;
        ld.shared.u32       %r10, [%r9];
        setp.eq.u32         %p1, %r2, 0;
        @%p1 st.global.u32  [%rd1], %r1;
        mul.wide.u32        %rd2, %r2, 4;
        add.s64             %rd3, %rd1, %rd2;
        st.global.u32       [%rd3+4], %r10;
        ret;
    }
    """,
    kinfo("big_smem", [ParamInfo("out", "ptr", T.u32)]),
)

# out[2 * ctaid.x] = %cluster_ctarank, out[2 * ctaid.x + 1] = %cluster_nctarank
CLUSTER = ptx_module(
    """
    .visible .entry cluster_ranks(.param .u64 out) .reqntid 32
    {
        .reg .pred  %p<2>;
        .reg .b32   %r<5>;
        .reg .b64   %rd<4>;
        mov.u32             %r1, %tid.x;
        setp.ne.u32         %p1, %r1, 0;
        @%p1 bra            DONE;
        ld.param.u64        %rd1, [out];
        cvta.to.global.u64  %rd1, %rd1;
        mov.u32             %r2, %ctaid.x;
        mul.wide.u32        %rd2, %r2, 8;
        add.s64             %rd3, %rd1, %rd2;
        mov.u32             %r3, %cluster_ctarank;
        mov.u32             %r4, %cluster_nctarank;
        st.global.v2.u32    [%rd3], {%r3, %r4};
    DONE:
        ret;
    }
    """,
    kinfo("cluster_ranks", [ParamInfo("out", "ptr", T.u32)], threads=32, cluster=(2, 1, 1)),
)

TILE_BYTES = 8192  # 64 rows x 128 bytes
TMA_SMEM = TILE_BYTES + 1024  # slack to align the tile to 1024 B in-kernel


def tma_module(elem: T.Scalar) -> PtxModule:
    """A 2-D TMA round trip over 64-row x 128-byte tiles: load a tile (map `src`) into
    dynamic shared memory aligned in-kernel to 1024 B (SWIZZLE_128B needs it; nvJitLink does
    not align the dynamic base), dump the tile's bytes as they lie in shared memory to
    raw[tile], then store the tile (map `dst`). Column step per CTA: `cols` elements."""
    body = """
    .extern .shared .align 16 .b8 dsmem[];

    .visible .entry tma_roundtrip(
        .param .align 64 .b8 src[128], .param .align 64 .b8 dst[128],
        .param .u64 raw, .param .u32 cols
    ) .reqntid 128
    {
        .reg .pred  %p<4>;
        .reg .b32   %r<16>;
        .reg .b64   %rd<8>;
        .shared .align 8 .b64 bar;

        mov.u64             %rd1, src;
        cvta.param.u64      %rd1, %rd1;
        mov.u64             %rd2, dst;
        cvta.param.u64      %rd2, %rd2;
        mov.u32             %r1, dsmem;
        add.u32             %r1, %r1, 1023;
        and.b32             %r1, %r1, -1024;
        mov.u32             %r2, bar;
        ld.param.u32        %r3, [cols];
        mov.u32             %r4, %ctaid.x;
        mul.lo.u32          %r3, %r3, %r4;          // c0: innermost coordinate
        mov.u32             %r5, %ctaid.y;
        shl.b32             %r5, %r5, 6;            // c1 = 64 * ctaid.y
        mov.u32             %r6, %tid.x;
        setp.eq.u32         %p1, %r6, 0;

        @%p1 mbarrier.init.shared::cta.b64 [%r2], 1;
        @%p1 fence.mbarrier_init.release.cluster;
        bar.sync            0;
        @!%p1 bra           WAIT;
        mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%r2], 8192;
        cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
                            [%r1], [%rd1, {%r3, %r5}], [%r2];
    WAIT:
        mbarrier.try_wait.parity.shared::cta.b64 %p2, [%r2], 0;
        @!%p2 bra           WAIT;

        mov.u32             %r7, %nctaid.x;
        mov.u32             %r9, %ctaid.y;
        mad.lo.u32          %r8, %r9, %r7, %r4;     // tile index
        ld.param.u64        %rd3, [raw];
        cvta.to.global.u64  %rd3, %rd3;
        mul.wide.u32        %rd4, %r8, 8192;
        add.s64             %rd3, %rd3, %rd4;
        shl.b32             %r10, %r6, 2;           // byte offset 4 * tid, step 512
        mov.u32             %r11, 0;
    DUMP:
        add.u32             %r12, %r1, %r10;
        ld.shared.u32       %r13, [%r12];
        cvt.u64.u32         %rd5, %r10;
        add.s64             %rd6, %rd3, %rd5;
        st.global.u32       [%rd6], %r13;
        add.u32             %r10, %r10, 512;
        add.u32             %r11, %r11, 1;
        setp.lt.u32         %p3, %r11, 16;
        @%p3 bra            DUMP;

        fence.proxy.async.shared::cta;
        bar.sync            0;
        @!%p1 bra           DONE;
        cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%rd2, {%r3, %r5}], [%r1];
        cp.async.bulk.commit_group;
        cp.async.bulk.wait_group.read 0;
    DONE:
        ret;
    }
    """
    params = [
        ParamInfo("src", "tmap", elem, 2),
        ParamInfo("dst", "tmap", elem, 2),
        ParamInfo("raw", "ptr", T.u8),
        ParamInfo("cols", "scalar", T.u32),
    ]
    return ptx_module(body, kinfo("tma_roundtrip", params, smem=TMA_SMEM))


# Does nothing with two tensor maps, a pointer and a u32: launch-overhead probe.
NOOP = ptx_module(
    """
    .visible .entry noop(
        .param .align 64 .b8 a[128], .param .align 64 .b8 b[128], .param .u64 p, .param .u32 n
    ) .reqntid 128
    {
        ret;
    }
    """,
    kinfo(
        "noop",
        [
            ParamInfo("a", "tmap", T.f32, 2),
            ParamInfo("b", "tmap", T.f32, 2),
            ParamInfo("p", "ptr", T.f32),
            ParamInfo("n", "scalar", T.u32),
        ],
    ),
)


@pytest.fixture
def rng():
    return np.random.default_rng()


# ---------------------------------------------------------------- load and launch


def test_axpy_matches_numpy(rng):
    k = load(AXPY)["axpy"]
    n = 10_000  # not a multiple of 128: the tail guard matters
    x, y = rng.standard_normal(n, np.float32), rng.standard_normal(n, np.float32)
    alpha = float(rng.standard_normal())
    dx, dy, out = to_device(x), to_device(y), zeros(n, "f32")
    k[(n + 127) // 128](dx, dy, out, alpha, n)
    np.testing.assert_allclose(out.numpy(), np.float32(alpha) * x + y, rtol=1e-6, atol=1e-6)
    # Keyword arguments and the launch() form reach the same parameters.
    out2 = zeros(n, "f32")
    k.launch(dx, dy, alpha=2.0, n=n, out=out2, grid=(n + 127) // 128)
    np.testing.assert_allclose(out2.numpy(), 2 * x + y, rtol=1e-6, atol=1e-6)


def test_load_is_cached():
    assert load(AXPY) is load(AXPY)


def test_scalar_parameters_arrive_bit_exact():
    k = load(ECHO)["echo"]
    out = zeros(8, "u32")
    k[1](out, -3, 1.5, -2.0, 2**64 - 2, 0.1, -(2**31))
    got = out.numpy()
    assert got[0] == np.uint32(2**32 - 3)  # s8 -3, sign-extended by ld.param.s8
    assert got[1] == 0x3E00  # f16 1.5
    assert got[2] == int(f32_to_bf16_bits(np.float32(-2.0)))
    assert got[3].view(np.int32) == -(2**31)
    assert got[4:6].view(np.uint64)[0] == 2**64 - 2
    assert got[6:8].view(np.float64)[0] == 0.1


def test_more_than_48k_dynamic_smem():
    k = load(BIG_SMEM)["big_smem"]
    expected = (((np.arange(128) + 1) % 128) * 7 + 1).astype(np.uint32)
    for smem in (4096, 100 * 1024, device_info().max_smem_optin):
        out = zeros(129, "u32")
        k.launch(out, grid=1, smem=smem)
        got = out.numpy()
        assert got[0] == smem
        np.testing.assert_array_equal(got[1:], expected)


def test_cluster_launch_reports_ranks():
    k = load(CLUSTER)["cluster_ranks"]
    for cluster, grid in ((None, 8), (4, 8), (16, 32)):  # None: KernelInfo's cluster of 2
        size = 2 if cluster is None else cluster
        out = zeros((grid, 2), "u32")
        k.launch(out, grid=grid, cluster=cluster)
        got = out.numpy()
        np.testing.assert_array_equal(got[:, 0], np.arange(grid) % size)
        np.testing.assert_array_equal(got[:, 1], np.full(grid, size))


def swizzle_128b(tile: np.ndarray) -> np.ndarray:
    """A 64 x 128-byte tile as SWIZZLE_128B lays it out in shared memory: 16-byte chunk c of
    row r goes to chunk c ^ (r % 8)."""
    chunks = tile.reshape(64, 8, 16)
    out = np.empty_like(chunks)
    for r in range(64):
        out[r, np.arange(8) ^ (r % 8)] = chunks[r]
    return out.reshape(64, 128)


@pytest.mark.parametrize("swizzle", ["none", "128B"])
@pytest.mark.parametrize("elem", [T.f32, T.bf16, T.u8], ids=str)
def test_tma_round_trip(rng, swizzle, elem):
    cols = 128 // elem.nbytes  # one 128-byte row per tile
    height, width = 128, 3 * cols
    host = rng.integers(0, 256, (height, width * elem.nbytes), dtype=np.uint8)
    src = to_device(host.view(T.numpy_dtype(elem)), dtype=elem)
    dst = zeros((height, width), elem)
    raw = zeros((2, 3, 64, 128), "u8")
    box = (64, cols)
    k = load(tma_module(elem))["tma_roundtrip"]
    k[(3, 2),](
        TensorMap(src, box, swizzle=swizzle), TensorMap(dst, box, swizzle=swizzle), raw, cols
    )
    got = dst.numpy().view(np.uint8).reshape(height, -1)
    np.testing.assert_array_equal(got, host)
    dumped = raw.numpy()
    for ty in range(2):
        for tx in range(3):
            tile = host[64 * ty : 64 * ty + 64, 128 * tx : 128 * tx + 128]
            want = swizzle_128b(tile) if swizzle == "128B" else tile
            np.testing.assert_array_equal(dumped[ty, tx], want)


def test_tma_out_of_bounds_rows_are_zero_filled(rng):
    height, width = 100, 64  # the second row of tiles is 36 rows real, 28 rows outside
    x = rng.standard_normal((height, width), np.float32)
    src, dst = to_device(x), zeros((height, width), "f32")
    raw = zeros((2, 2, 64, 128), "u8")
    k = load(tma_module(T.f32))["tma_roundtrip"]
    k[(2, 2),](TensorMap(src, (64, 32)), TensorMap(dst, (64, 32)), raw, 32)
    np.testing.assert_array_equal(dst.numpy(), x)  # the store clips at the tensor's edge
    dumped = raw.numpy().view(np.float32)
    np.testing.assert_array_equal(dumped[1, 0, :36], x[64:, :32])
    assert not dumped[1, :, 36:].any()


def test_tensor_map_encodings_are_cached():
    a = zeros((128, 128), "f32")
    clear_encode_cache()  # a freed array of the same shape may have had this address
    before = encode_cache_info()
    m1 = TensorMap(a, (64, 32), swizzle="128B")
    m2 = TensorMap(a, (64, 32), swizzle="128B")
    after = encode_cache_info()
    assert after.hits == before.hits + 1 and after.misses == before.misses + 1
    assert m1.raw == m2.raw and len(m1.raw) == 128
    assert TensorMap(a, (64, 32)).raw != m1.raw  # another swizzle encodes differently


def test_im2col_map_encodes():
    x = zeros((2, 16, 16, 64), "f16")  # NHWC
    tm = TensorMap(
        x,
        mode="im2col",
        pixel_box_lower=(-1, -1),
        pixel_box_upper=(-1, -1),
        channels_per_pixel=64,
        pixels_per_column=128,
        swizzle="128B",
    )
    assert len(tm.raw) == 128 and tm.raw != bytes(128)


# ---------------------------------------------------------------- errors


def test_unknown_kernel_name_lists_the_kernels():
    with pytest.raises(LaunchError, match="no kernel named 'axpz' in this module; kernels: 'axpy'"):
        load(AXPY)["axpz"]


def test_kernel_info_naming_a_missing_entry():
    bad = PtxModule(AXPY.ptx, (kinfo("not_there", []),), "sm_90a")
    with pytest.raises(LaunchError, match="kernel 'not_there' .* no .entry of that name"):
        load(bad)


def test_ptxas_rejection_names_the_kernel():
    broken = PtxModule(
        AXPY.ptx.replace("fma.rn.f32          %f4, %f3, %f1, %f2;", "fma.rn.f32 %f4, %rd1, %f1;"),
        AXPY.kernels,
        "sm_90a",
    )
    assert broken.ptx != AXPY.ptx
    with pytest.raises(CompileError) as e:
        load(broken)
    msg = str(e.value)
    assert "ptxas rejected the PTX of kernel 'axpy' for sm_90a" in msg
    assert "ptxas application ptx input, line" in msg


def test_launch_errors_are_raised_before_the_driver():
    k = load(AXPY)["axpy"]
    x = zeros(128, "f32")
    with pytest.raises(LaunchError, match="kernel 'axpy' takes 5 arguments"):
        k[1](x, x, x, 1.0, 128, 5)
    with pytest.raises(LaunchError, match="smem must be at most 232448 bytes"):
        k.launch(x, x, x, 1.0, 128, grid=1, smem=232448 + 1)
    with pytest.raises(LaunchError, match="numpy array in host memory"):
        k[1](np.zeros(128, np.float32), x, x, 1.0, 128)
    synchronize()  # nothing reached the device, so there is no sticky error either
    k[1](x, x, x, 1.0, 128)
    synchronize()


# ---------------------------------------------------------------- memory, streams, interop


def test_device_array_round_trip(rng):
    a = rng.standard_normal((3, 5)).astype(np.float32)
    with to_device(a) as d:
        assert isinstance(d, DeviceArray) and d.shape == (3, 5) and d.ptr % 256 == 0
        np.testing.assert_array_equal(d.copy_to_host(), a)
    assert d.ptr == 0
    with pytest.raises(LaunchError, match="freed"):
        d.numpy()
    b = to_device(np.array([1.0, -2.5], np.float32), dtype="bf16")
    assert b.elem == T.bf16 and b.numpy().view(np.uint16).tolist() == [0x3F80, 0xC020]
    assert b.numpy().dtype == T.numpy_dtype(T.bf16) and b.numpy().tolist() == [1.0, -2.5]
    assert empty((0,), "u8").numpy().shape == (0,)


def test_stream_and_events(rng):
    k = load(AXPY)["axpy"]
    n = 1 << 20
    x = to_device(rng.standard_normal(n, np.float32))
    out = zeros(n, "f32")
    with Stream() as s:
        start = Event().record(s)
        k[n // 128, None, s](x, x, out, 1.0, n)
        end = Event().record(s)
        s.synchronize()
        assert end - start > 0
    np.testing.assert_allclose(out.numpy(), 2 * x.numpy(), rtol=1e-6)
    ms = benchmark(lambda: k[n // 128](x, x, out, 1.0, n), warmup=3, reps=20)
    print(f"axpy over {n} floats: {ms * 1e3:.1f} us median")
    assert 0 < ms < 100


def test_torch_zero_copy(rng):
    torch = pytest.importorskip("torch")
    k = load(AXPY)["axpy"]
    n = 1000
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    out = torch.empty(n, device="cuda")
    k[(n + 127) // 128](x, y, out, 3.0, n)
    torch.testing.assert_close(out, 3 * x + y)
    with pytest.raises(LaunchError, match="points to f16 elements"):
        k[1](x.half(), y, out, 1.0, n)
    with pytest.raises(LaunchError, match="torch tensor on cpu"):
        k[1](x.cpu(), y, out, 1.0, n)
    # A ptxdsl array seen by torch without a copy, and a bf16 tensor through a tensor map.
    d = to_device(np.arange(6, dtype=np.float32))
    view = torch.as_tensor(d, device="cuda")
    view += 1
    np.testing.assert_array_equal(d.numpy(), np.arange(1, 7, dtype=np.float32))
    src = torch.randn(128, 192, device="cuda").to(torch.bfloat16)
    dst = torch.zeros_like(src)
    raw = zeros((2, 3, 64, 128), "u8")
    m = load(tma_module(T.bf16))["tma_roundtrip"]
    m[(3, 2),](TensorMap(src, (64, 64)), TensorMap(dst, (64, 64)), raw, 64)
    torch.cuda.synchronize()
    assert torch.equal(src, dst)
    assert DevicePointer(x.data_ptr(), T.f32).address == x.data_ptr()


def test_host_launch_overhead():
    k = load(NOOP)["noop"]
    a = zeros((128, 128), "f32")
    ma, mb = TensorMap(a, (64, 32)), TensorMap(a, (32, 32))
    launch = k[1]
    us = launch_overhead_us(lambda: launch(ma, mb, a, 7), n=2000)
    us_kw = launch_overhead_us(lambda: k.launch(ma, mb, a, 7, grid=1), n=2000)
    print(f"\nhost launch overhead: {us:.2f} us (k[grid]), {us_kw:.2f} us (k.launch)")
    assert us < 50 and us_kw < 50


def test_graph_capture_replays_the_captured_launches(rng):
    k = load(AXPY)["axpy"]
    n = 10_000
    x = to_device(rng.standard_normal(n, np.float32))
    acc = zeros(n, "f32")
    with Stream(non_blocking=True) as s:
        launch = k[(n + 127) // 128, None, s]
        with capture(s) as g:
            launch(x, acc, acc, 1.0, n)  # acc += x, twice
            launch(x, acc, acc, 1.0, n)
        s.synchronize()
        assert g.nodes == 2
        assert not acc.numpy().any()  # captured, not run
        for _ in range(3):
            g.replay()
        s.synchronize()
        np.testing.assert_allclose(acc.numpy(), 6 * x.numpy(), rtol=1e-5)
        launch(x, acc, acc, -6.0, n)  # the launcher still launches directly after capture
        s.synchronize()
        np.testing.assert_allclose(acc.numpy(), 0, atol=1e-4)
        g.close()
        with pytest.raises(LaunchError, match="the CUDA graph was closed"):
            g.replay()


def test_graph_capture_of_torch_tensors_on_a_torch_stream():
    torch = pytest.importorskip("torch")
    k = load(AXPY)["axpy"]
    n = 4096
    x = torch.randn(n, device="cuda")
    acc = torch.zeros(n, device="cuda")
    s = torch.cuda.Stream()
    with capture(s) as g:
        k[n // 128, None, s](x, acc, acc, 2.0, n)
    for _ in range(5):
        g.replay()
    s.synchronize()
    torch.testing.assert_close(acc, 10 * x)


def test_launches_from_several_threads_at_once(rng):
    import threading

    k = load(AXPY)["axpy"]
    n = 1 << 16
    x = to_device(rng.standard_normal(n, np.float32))
    outs = [zeros(n, "f32") for _ in range(4)]
    errors = []

    def work(i):
        try:
            for _ in range(200):
                k[n // 128](x, x, outs[i], float(i), n)
            synchronize()
        except Exception as e:  # reported below: a thread's exception would be lost
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, out in enumerate(outs):
        np.testing.assert_allclose(out.numpy(), (i + 1) * x.numpy(), rtol=1e-6)


def test_torch_and_cupy_fast_paths_pass_the_right_address():
    torch = pytest.importorskip("torch")
    k = load(AXPY)["axpy"]
    n = 1024
    base = torch.arange(4 * n, device="cuda", dtype=torch.float32)
    out = torch.zeros(n, device="cuda")
    launch = k[n // 128]
    for i in range(4):  # views at offsets: the address must be each view's, not the first's
        launch(base[i * n : (i + 1) * n], base[:n], out, 1.0, n)
        torch.cuda.synchronize()
        torch.testing.assert_close(out, base[i * n : (i + 1) * n] + base[:n])
    with pytest.raises(LaunchError, match="points to f16 elements"):
        launch(base[:n].half(), base[:n], out, 1.0, n)
    with pytest.raises(LaunchError, match="torch tensor on cpu"):
        launch(base[:n].cpu(), base[:n], out, 1.0, n)
    cupy = pytest.importorskip("cupy")
    cx = cupy.arange(2 * n, dtype=cupy.float32)
    cout = cupy.zeros(n, dtype=cupy.float32)
    for i in range(2):
        launch(cx[i * n :], cx, cout, 2.0, n)
        cupy.cuda.runtime.deviceSynchronize()
        assert bool((cout == 2 * cx[i * n : i * n + n] + cx[:n]).all())
    with pytest.raises(LaunchError, match="points to s32 elements"):
        launch(cx.astype(cupy.int32), cx, cout, 2.0, n)
