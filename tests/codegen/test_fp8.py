"""fp8 (e4m3, e5m2) without a GPU: the types in the text language and the Python API,
literals checked against each type's range, conversions to and from every float and integer
type (emitted as PTX's packed cvt forms, assembled by ptxas, and computed by the interpreter
exactly as ml_dtypes converts, saturating), vectors, the operations fp8 does not have, and
the host boundary (ml_dtypes arrays, torch dtypes, tensor maps, scalar arguments)."""

from __future__ import annotations

import ctypes
import math
import textwrap

import ml_dtypes
import numpy as np
import pytest
from conftest import assemble

import ptxdsl
from ptxdsl import fp8
from ptxdsl import types as T
from ptxdsl.errors import LaunchError
from ptxdsl.interp import run
from ptxdsl.interp.tensormap import TensorMapModel
from ptxdsl.kernelinfo import KernelInfo, ParamInfo
from ptxdsl.runtime import DeviceArray, DevicePointer, TensorMap
from ptxdsl.runtime.args import ArgPacker
from ptxdsl.runtime.dtypes import scalar_of
from ptxdsl.runtime.interop import describe

E4M3, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2


def error(text: str, **kw) -> str:
    with pytest.raises(ptxdsl.CompileError) as e:
        ptxdsl.compile_module(ptxdsl.parse(textwrap.dedent(text), "k.ptxdsl"), **kw)
    return str(e.value)


# ----------------------------------------------------------------------------- the types


def test_types_by_name_in_text_and_python():
    assert ptxdsl.e4m3 is T.e4m3 and ptxdsl.e5m2 is T.e5m2
    assert T.e4m3.nbytes == 1 and T.e4m3.is_float and T.e4m3.is_fp8 and not T.f16.is_fp8
    assert ptxdsl.e4m3x16 == T.Vector(T.e4m3, 16) and ptxdsl.e5m2x4 == T.Vector(T.e5m2, 4)
    assert T.parse_type_name("e4m3x2") is None  # vectors are 4, 8 or 16 bytes
    assert T.numpy_dtype(T.e4m3) == np.dtype(E4M3) and T.numpy_dtype(T.e5m2) == np.dtype(E5M2)
    text = "kernel k(p: ptr<e4m3>, q: tmap<e5m2, 2>) threads(32) { let v: e4m3x8; }\n"
    m = ptxdsl.parse(text)
    assert ptxdsl.parse(ptxdsl.print_module(m)) == m

    @ptxdsl.kernel(threads=32)
    def k(k, p: ptxdsl.ptr(ptxdsl.e4m3), q: ptxdsl.tmap(ptxdsl.e5m2, 2)):
        k.let("v", type=ptxdsl.e4m3x8)

    assert k.ir == m.kernels[0]


@pytest.mark.parametrize("decl, message", [
    ("let x: e4m3 = 500.0;", "literal 500.0 does not fit in e4m3 (e4m3 holds at most 448 and "
                             "no infinity)"),
    ("let x: e5m2 = -70000.0;", "literal -70000.0 does not fit in e5m2 (e5m2 holds at most "
                                "57344)"),
    ("let x: e4m3 = 1e300 * 1e300;", "overflows f64"),
])
def test_a_literal_out_of_range_is_a_located_error(decl, message):
    msg = error(f"kernel k(p: ptr<e4m3>) threads(32) {{\n    {decl}\n}}\n")
    assert message in msg and "k.ptxdsl:2:" in msg and "^" in msg, msg


def test_literals_in_range_round_to_nearest_even():
    ptx = ptxdsl.compile("""kernel k(p: ptr<e4m3>, q: ptr<e5m2>) threads(32) {
        p[0] = 449.0;   // 448 (0x7E): 464 and above would be out of range
        p[1] = -0.3;    // -0.3125 (0xAA)
        q[0] = 57000.0; // 57344 (0x7B)
    }""").ptx
    assert "0x007E" in ptx and "0x00AA" in ptx and "0x007B" in ptx


@pytest.mark.parametrize("expr, message", [
    ("x + x", "arithmetic on e4m3 is not supported; convert to f32"),
    ("-x", "'-' on e4m3 is not supported; convert to f32"),
    ("x < x", "'<' is not defined for e4m3; convert to f32 first"),
    ("abs(x)", "abs() takes a signed integer or float, got e4m3"),
    ("fma(x, x, x)", "fma() takes f16, bf16, f32 or f64, got e4m3"),
    ("x & x", "must be integers or pred, got e4m3"),
])
def test_fp8_computes_only_after_conversion(expr, message):
    msg = error(f"kernel k(p: ptr<e4m3>) threads(32) {{\n    let x = p[0];\n"
                f"    let y = {expr};\n}}\n")
    assert message in msg and "k.ptxdsl:3:" in msg, msg


# ----------------------------------------------------------------------------- conversions

CONVERT = """
kernel conv(x: ptr<f32>, e4: ptr<e4m3>, e5: ptr<e5m2>, back4: ptr<f32>, back5: ptr<f32>,
            h: ptr<f16>, bh: ptr<bf16>, d: ptr<f64>, i: ptr<s32>, from_h: ptr<e4m3>,
            from_b: ptr<e5m2>, from_d: ptr<e4m3>, from_i: ptr<e5m2>, cross: ptr<e5m2>,
            cross4: ptr<e4m3>, iback: ptr<s32>) threads(64) {
    let t = %ctaid.x * 64 + %tid.x;
    let v = x[t];
    e4[t] = v as e4m3;
    e5[t] = v as e5m2;
    let a = e4[t];
    let b = e5[t];
    back4[t] = a as f32;
    back5[t] = b as f32;
    from_h[t] = h[t] as e4m3;
    from_b[t] = bh[t] as e5m2;
    from_d[t] = d[t] as e4m3;
    from_i[t] = i[t] as e5m2;
    cross[t] = a as e5m2;
    cross4[t] = b as e4m3;
    iback[t] = a as s32;
}
"""


def special_values(n: int, rng: np.random.Generator) -> np.ndarray:
    edge = [0.0, -0.0, 448.0, 449.0, 463.9, 464.0, 1e6, -1e6, np.inf, -np.inf, np.nan,
            57344.0, 61439.0, 61440.0, 2.0**-9, 2.0**-10, 2.0**-17, 3 * 2.0**-10, 0.3, -240.5]
    rand = rng.standard_normal(n - len(edge)) * np.exp2(rng.integers(-18, 18, n - len(edge)))
    return np.concatenate([edge, rand]).astype(np.float32)


def test_conversions_match_ml_dtypes_with_saturation(tmp_path):
    rng = np.random.default_rng(3)
    n = 256
    x = special_values(n, rng)
    h = (rng.standard_normal(n) * 300).astype(np.float16)
    bh = (rng.standard_normal(n) * 3e4).astype(ml_dtypes.bfloat16)
    d = rng.standard_normal(n) * 100
    i = rng.integers(-100000, 100000, n).astype(np.int32)
    out = {k: np.zeros(n, dt) for k, dt in [
        ("e4", E4M3), ("e5", E5M2), ("back4", np.float32), ("back5", np.float32),
        ("from_h", E4M3), ("from_b", E5M2), ("from_d", E4M3), ("from_i", E5M2),
        ("cross", E5M2), ("cross4", E4M3), ("iback", np.int32)]}
    k = ptxdsl.parse(CONVERT).kernel()
    run(k, n // 64, {"x": x, "h": h, "bh": bh, "d": d, "i": i, **out})

    def same(got, want):
        g, w = got.view(np.uint8), np.asarray(want).view(np.uint8)
        assert (g == w).all(), (got[g != w], np.asarray(want)[g != w])

    q4, q5 = fp8.quantize(x, T.e4m3), fp8.quantize(x, T.e5m2)
    # saturation, not ml_dtypes' overflow: 1e6 and inf become the largest finite value
    assert float(q4[6]) == 448.0 and float(q4[8]) == 448.0 and float(q5[8]) == 57344.0
    assert np.isnan(float(q4[10])) and float(q4[12]) == 448.0 and float(q5[13]) == 57344.0
    same(out["e4"], q4)
    same(out["e5"], q5)
    assert np.array_equal(out["back4"], q4.astype(np.float32), equal_nan=True)
    assert np.array_equal(out["back5"], q5.astype(np.float32), equal_nan=True)
    same(out["from_h"], fp8.quantize(h.astype(np.float32), T.e4m3))
    same(out["from_b"], fp8.quantize(bh.astype(np.float32), T.e5m2))
    same(out["from_d"], fp8.quantize(d.astype(np.float32), T.e4m3))  # through f32, as PTX
    same(out["from_i"], fp8.quantize(i.astype(np.float32), T.e5m2))
    same(out["cross"], fp8.quantize(q4.astype(np.float32), T.e5m2))
    same(out["cross4"], fp8.quantize(q5.astype(np.float32), T.e4m3))
    finite = ~np.isnan(q4.astype(np.float32))
    assert (out["iback"][finite] == np.trunc(q4.astype(np.float32)[finite])).all()
    assemble(ptxdsl.compile(CONVERT).ptx, tmp_path)


def test_conversion_ptx_uses_the_packed_satfinite_forms():
    ptx = ptxdsl.compile(CONVERT).ptx
    for form in ("cvt.rn.satfinite.e4m3x2.f32", "cvt.rn.satfinite.e5m2x2.f32",
                 "cvt.rn.f16x2.e4m3x2", "cvt.rn.f16x2.e5m2x2",
                 "cvt.rn.satfinite.e5m2x2.f16x2", "cvt.rn.satfinite.e4m3x2.f16x2",
                 "ld.global.b8", "st.global.b8"):
        assert form in ptx, form


def test_sm80_has_no_fp8_conversions():
    msg = error("kernel k(p: ptr<e4m3>, q: ptr<f32>) threads(32) {\n    q[0] = p[0] as f32;\n}\n",
                arch="sm_80")
    assert "converting e4m3 to f32 needs sm_89 or later" in msg and "k.ptxdsl:2:" in msg, msg


VECTORS = """
kernel vec(src: ptr<e4m3>, dst: ptr<e4m3>, s5: ptr<e5m2>, d5: ptr<e5m2>, f: ptr<f32>) threads(32) {
    shared s: e4m3[1024] align 16;
    let t = %tid.x;
    let v: e4m3x16 = vload(src[t * 16], 16);
    s[t * 16] = v;
    bar_sync(0);
    let w: e4m3x16 = vload(s[(t * 16 + 16) & 511], 16);
    dst[t * 16] = w;
    let u: e5m2x8 = vload(s5[t * 8], 8);
    let r: e5m2x4 = e5m2x4(u[7], u[5], u[3], u[1]);
    d5[t * 4] = r;
    f[t] = v[15] as f32 + (r[0] as f32);
}
"""


def test_vectors_move_fp8_as_words(tmp_path):
    rng = np.random.default_rng(5)
    src = fp8.quantize(rng.standard_normal(512) * 100, T.e4m3)
    s5 = fp8.quantize(rng.standard_normal(256) * 100, T.e5m2)
    dst, d5, f = np.zeros(512, E4M3), np.zeros(128, E5M2), np.zeros(32, np.float32)
    run(ptxdsl.parse(VECTORS).kernel(), 1, {"src": src, "dst": dst, "s5": s5, "d5": d5, "f": f})
    assert (dst.view(np.uint8) == np.roll(src.view(np.uint8), -16)).all()
    assert (d5.view(np.uint8) == s5.view(np.uint8).reshape(32, 8)[:, 7::-2].reshape(-1)).all()
    want = src.astype(np.float32)[15::16] + s5.astype(np.float32)[7::8]
    assert (f == want).all()
    ptx = ptxdsl.compile(VECTORS).ptx
    assert "ld.global.v4.b32" in ptx and "st.shared.v4.b32" in ptx and "ld.global.v2.b32" in ptx
    assemble(ptx, tmp_path)


# ----------------------------------------------------------------------------- wgmma


WGMMA = """
kernel k(c: ptr<f32>) threads(128) {{
    shared sa: e4m3[64][128] swizzle 128;
    {decl_b}
    let acc: f32[32];
    wgmma_fence();
    wgmma(acc, sa[0, 0], {b});
    wgmma_commit();
    wgmma_wait(0);
}}
"""


def test_an_mn_major_fp8_operand_is_rejected_with_its_location():
    msg = error(WGMMA.format(decl_b="shared sb: e4m3[1][128][128] swizzle 128 mn;",
                             b="sb[0, 0, 0]"))
    assert "the wgmma B operand is MN-major, which PTX allows for 16-bit inputs only, got " \
           "e4m3; store B K-major ([rows][k], rows of K elements: a row-major N x K matrix) " \
           "and declare 'sb' 'swizzle 128' without 'mn'" in msg
    assert "k.ptxdsl:7:" in msg and "^" in msg, msg


def test_fp8_and_16_bit_operands_do_not_mix():
    msg = error(WGMMA.format(decl_b="shared sb: bf16[64][64] swizzle 128;", b="sb[0, 0]"))
    assert "wgmma A and B must have one input type (or two fp8 types), got e4m3 and bf16" in msg


def test_fp8_wgmma_is_k32_without_transpose_operands():
    ptx = ptxdsl.compile(WGMMA.format(decl_b="shared sb: e5m2[64][128] swizzle 128;",
                                      b="sb[0, 32]")).ptx
    line = next(x for x in ptx.splitlines() if "wgmma.mma_async" in x)
    assert "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e5m2" in line
    assert line.rstrip(";").split(", ")[-3:] == ["%p1", "1", "1"] or \
        line.rstrip(";").endswith(", 1, 1"), line


# ----------------------------------------------------------------------------- host boundary


def test_dtypes_map_both_ways():
    assert scalar_of(E4M3) == T.e4m3 and scalar_of(np.dtype(E5M2)) == T.e5m2
    assert scalar_of("e4m3") == T.e4m3

    class TorchDtype:  # torch's dtypes print as torch.<name>
        def __init__(self, name):
            self.name = name

        def __str__(self):
            return f"torch.{self.name}"

    assert scalar_of(TorchDtype("float8_e4m3fn")) == T.e4m3
    assert scalar_of(TorchDtype("float8_e5m2")) == T.e5m2
    with pytest.raises(LaunchError, match="torch dtype torch.float8_e4m3fnuz has no ptxdsl"):
        scalar_of(TorchDtype("float8_e4m3fnuz"))


def _fake_torch_tensor(dtype_name: str, shape=(4, 32), ptr=0x7F00_0000_2000):
    class Dtype:
        def __str__(self):
            return f"torch.{dtype_name}"

    tensor_type = type("Tensor", (), {
        "__module__": "torch", "is_cuda": True, "dtype": Dtype(), "shape": shape,
        "data_ptr": lambda self: ptr, "stride": lambda self: (shape[1], 1),
        "element_size": lambda self: 1,
    })
    return tensor_type()


def test_torch_float8_tensors_are_described_zero_copy():
    d = describe(_fake_torch_tensor("float8_e4m3fn"))
    assert (d.ptr, d.shape, d.strides, d.elem) == (0x7F00_0000_2000, (4, 32), (32, 1), T.e4m3)


def _info(*params) -> KernelInfo:
    return KernelInfo("k", tuple(params), (32, 1, 1), None, 0, "sm_90a")


def test_pointer_parameters_check_the_fp8_type():
    info = _info(ParamInfo("p", "ptr", T.e4m3))
    packer = ArgPacker(info)
    for ok in (DeviceArray(0x7F00_0000_1000, (64,), T.e4m3, owned=False),
               _fake_torch_tensor("float8_e4m3fn")):
        packer.pack((ok,), {})
    for elem, name in ((T.e5m2, "e5m2"), (T.u8, "u8")):
        with pytest.raises(LaunchError, match=f"points to {name} elements; the kernel expects "
                                              r"ptr<e4m3>"):
            packer.pack((DeviceArray(0x7F00_0000_1000, (64,), elem, owned=False),), {})
    a = DeviceArray(0x7F00_0000_1000, (4, 8), T.e5m2, owned=False)
    assert a.dtype == np.dtype(E5M2) and a.__cuda_array_interface__["typestr"] == "|u1"


def test_scalar_fp8_arguments_are_converted_and_range_checked():
    packer = ArgPacker(_info(ParamInfo("a", "scalar", T.e4m3), ParamInfo("b", "scalar", T.e5m2)))
    addr = packer.pack((1.5, E5M2(-2.0)), {})
    ptrs = np.ctypeslib.as_array((ctypes.c_uint64 * 2).from_address(addr))
    assert ctypes.string_at(int(ptrs[0]), 1) == b"\x3c"  # e4m3 1.5
    assert ctypes.string_at(int(ptrs[1]), 1) == b"\xc0"  # e5m2 -2.0
    with pytest.raises(LaunchError, match=r"argument 'a' \(e4m3\) must be within \[-448, 448\] "
                                          r"\(or nan\), got 500.0"):
        packer.pack((500.0, 1.0), {})
    with pytest.raises(LaunchError, match=r"argument 'a' \(e4m3\) must be"):
        packer.pack((math.inf, 1.0), {})
    packer.pack((1.0, math.inf), {})  # e5m2 holds infinities


@pytest.fixture
def fake_encoder(monkeypatch):
    from ptxdsl import runtime as rt
    from ptxdsl.runtime.tensormap import clear_encode_cache

    seen = []
    monkeypatch.setattr(rt.tensormap, "_driver_encode",
                        lambda spec: seen.append(spec) or bytes(128))
    clear_encode_cache()
    yield seen
    clear_encode_cache()


def test_tensor_maps_of_fp8_hold_bytes(fake_encoder):
    from ptxdsl.runtime.tensormap_rules import TMA_DATA_TYPE

    m = TensorMap(DevicePointer(0x7F00_0000_0000), (64, 128), dtype="e4m3", shape=(256, 512),
                  swizzle="128B")
    assert m.dtype == T.e4m3 and fake_encoder[-1].elem == T.e4m3
    assert TMA_DATA_TYPE["e4m3"] == TMA_DATA_TYPE["e5m2"] == "UINT8"
    with pytest.raises(LaunchError, match="inner box dimension is 256 bytes; swizzle 128B"):
        TensorMap(DevicePointer(0x7F00_0000_0000), (64, 256), dtype="e5m2", shape=(256, 512),
                  swizzle="128B")


def test_interpreter_tensor_maps_of_fp8():
    text = """
    kernel k(m: tmap<e4m3, 2>, out: ptr<f32>) threads(128) {
        shared s: e4m3[16][128] align 1024 swizzle 128;
        mbarrier bar count 1;
        if %tid.x == 0 {
            mbarrier_init(bar);
            fence_mbarrier_init();
        }
        bar_sync(0);
        if %tid.x == 0 {
            mbarrier_arrive_expect_tx(bar, sizeof(s));
            tma_load(s, m, [0, 0], bar);
        }
        mbarrier_wait(bar, 0);
        for r in 0 .. 16 {
            out[r * 128 + %tid.x] = s[r, %tid.x] as f32;
        }
    }
    """
    a = fp8.quantize(np.random.default_rng(0).standard_normal((20, 128)) * 8, T.e4m3)
    out = np.zeros(16 * 128, np.float32)
    run(ptxdsl.parse(textwrap.dedent(text)).kernel(), 1,
        {"m": TensorMapModel(a, (16, 128), swizzle="128B"), "out": out})
    assert (out.reshape(16, 128) == a[:16].astype(np.float32)).all()


def test_fp8_scalar_parameters_and_register_arrays(tmp_path):
    text = """kernel k(x: e4m3, y: e5m2, p: ptr<f32>) threads(32) {
        let a: e4m3[4] = 1.0;
        a[1] = x;
        p[%tid.x] = a[1] as f32 + y as f32 + a[0] as f32;
    }"""
    ptx = ptxdsl.compile(text).ptx
    assert ".param .b8 p_x" in ptx and "ld.param.b8" in ptx
    assemble(ptx, tmp_path)
    p = np.zeros(32, np.float32)
    run(ptxdsl.parse(text).kernel(), 1, {"x": 1.5, "y": E5M2(-3.0), "p": p})
    assert (p == -0.5).all()
