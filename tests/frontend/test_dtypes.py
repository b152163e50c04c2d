"""bf16 (and fp8) as real numpy dtypes through ml_dtypes, at every host boundary that runs
without a GPU: dtype mapping, the interpreter, the sample runner's comparison. uint16 bit
patterns are still accepted where bf16 data is given."""

import ml_dtypes
import numpy as np
import pytest

import ptxdsl
from ptxdsl import types as T
from ptxdsl.errors import LaunchError
from ptxdsl.interp import run
from ptxdsl.runtime.dtypes import host_array, scalar_of
from ptxdsl.tools.runner import compare

SCALE = """
kernel scale(x: ptr<bf16>, y: ptr<bf16>) threads(64) {
    y[%tid.x] = (x[%tid.x] as f32 * 2.0) as bf16;
}
"""


def test_ml_dtypes_map_to_element_types():
    assert scalar_of(ml_dtypes.bfloat16) == T.bf16
    assert scalar_of(np.dtype(ml_dtypes.bfloat16)) == T.bf16
    assert T.numpy_dtype(T.bf16) == np.dtype(ml_dtypes.bfloat16)
    assert scalar_of(ml_dtypes.float8_e4m3fn) == T.e4m3  # fp8: named, not taken as bytes
    assert scalar_of(ml_dtypes.float8_e5m2) == T.e5m2
    with pytest.raises(LaunchError, match="float8_e4m3fnuz has no ptxdsl element type"):
        scalar_of(ml_dtypes.float8_e4m3fnuz)


def test_host_array_takes_bfloat16_and_uint16_bits_for_bf16_only():
    bits = np.array([0x3F80, 0xC000], np.uint16)
    v = host_array(bits, T.bf16)
    assert v.dtype == ml_dtypes.bfloat16 and v.tolist() == [1.0, -2.0]
    assert host_array(bits, T.f16) is None and host_array(bits, T.u16) is bits
    assert host_array(np.zeros(2, np.float32), T.bf16) is None


@pytest.mark.parametrize("as_bits", [False, True])
def test_interpreter_takes_and_returns_bf16(as_bits):
    x = (np.arange(64, dtype=np.float32) - 20).astype(ml_dtypes.bfloat16)
    y = np.zeros(64, ml_dtypes.bfloat16)
    xs, ys = (x.view(np.uint16), y.view(np.uint16)) if as_bits else (x, y)
    run(ptxdsl.parse(SCALE).kernel(), 1, {"x": xs, "y": ys})
    assert y.dtype == ml_dtypes.bfloat16
    assert (y.astype(np.float32) == 2 * x.astype(np.float32)).all()


def test_interpreter_names_the_dtype_it_needs():
    with pytest.raises(LaunchError, match="argument 'x' is a float32 array; ptr<bf16> needs "
                                          "bfloat16"):
        run(ptxdsl.parse(SCALE).kernel(), 1, {"x": np.zeros(64, np.float32),
                                              "y": np.zeros(64, ml_dtypes.bfloat16)})


def test_runner_compares_bfloat16_and_bit_pattern_outputs():
    want = np.array([1.0, 2.5, -3.0])
    got = want.astype(ml_dtypes.bfloat16)
    assert compare("y", got, want, T.bf16, 1e-2, 0.0).ok
    assert compare("y", got.view(np.uint16), want, T.bf16, 1e-2, 0.0).ok
    bad = compare("y", (want * 1.5).astype(ml_dtypes.bfloat16), want, T.bf16, 1e-2, 0.0)
    assert not bad.ok and "exceeds" in bad.detail
    # a reference of bit patterns compares bit for bit, NaN payloads included
    bits = np.array([0x7FC1, 0x3F80, 0xFFFF], np.uint16)
    assert compare("y", bits.view(ml_dtypes.bfloat16), bits, T.bf16, 0.0, 0.0).ok
    off = compare("y", bits.view(ml_dtypes.bfloat16), bits ^ 1, T.bf16, 0.0, 0.0)
    assert not off.ok and off.detail == \
        "3 of 3 elements differ; the first at index [0]: got 0x7fc1, want 0x7fc0"


def test_bf16_scalar_arguments_may_be_ml_dtypes_scalars():
    import ctypes

    from ptxdsl.kernelinfo import KernelInfo, ParamInfo
    from ptxdsl.runtime.args import ArgPacker

    info = KernelInfo("b", (ParamInfo("v", "scalar", T.bf16),), (32, 1, 1), None, 0, "sm_90a")
    packer = ArgPacker(info)
    addr = packer.pack((ml_dtypes.bfloat16(-2.5),), {})
    ptr = int(np.ctypeslib.as_array((ctypes.c_uint64 * 1).from_address(addr))[0])
    assert int.from_bytes(ctypes.string_at(ptr, 2), "little") == 0xC020


def test_interpreter_takes_bf16_scalars():
    text = "kernel k(y: ptr<f32>, v: bf16) threads(32) { y[%tid.x] = v as f32; }"
    y = np.zeros(32, np.float32)
    run(ptxdsl.parse(text).kernel(), 1, {"y": y, "v": ml_dtypes.bfloat16(-2.5)})
    assert (y == -2.5).all()


def test_f32_fma_rounds_once_as_the_exact_rational_does():
    """The interpreter's fast fma.rn.f32 (f64 product, round-to-odd sum) against the exact
    rational rounded once, on cancellations, ties near f32 midpoints, subnormals and signed
    zeros."""
    import math
    from fractions import Fraction

    from ptxdsl.interp.scalar import fma_f32, round_exact

    rng = np.random.default_rng()
    f32 = np.float32
    n = 4000
    a = (rng.uniform(1, 2, n) * np.exp2(rng.integers(-140, 120, n))).astype(f32)
    b = (rng.uniform(1, 2, n) * np.exp2(rng.integers(-140, 120, n))).astype(f32)
    a *= rng.choice([f32(-1), f32(1)], n)
    c = (rng.uniform(1, 2, n) * np.exp2(rng.integers(-149, 127, n))).astype(f32)
    with np.errstate(over="ignore"):  # products past f32's range are skipped below
        cancel = (-(a.astype(np.float64) * b) * (1 + rng.uniform(-1e-6, 1e-6, n))).astype(f32)
    ties = (1 + rng.integers(0, 2 ** 23, (2, n)) / 2 ** 23).astype(f32)
    near = np.exp2(rng.integers(-30, 30, n)).astype(f32) * rng.choice([f32(-1), f32(1)], n)
    cases = [*zip(a, b, c, strict=True), *zip(a, b, cancel, strict=True),
             *zip(ties[0], ties[1], near, strict=True),
             (f32(0), f32(-1), f32(-0.0)), (f32(1e-45), f32(0.5), f32(0))]
    for x, y, z in cases:
        x, y, z = float(x), float(y), float(z)
        if not all(map(math.isfinite, (x, y, z, x * y + z))):
            continue
        want = round_exact(Fraction(x) * Fraction(y) + Fraction(z), T.f32)
        got = fma_f32(x, y, z)
        assert got == want and (want != 0 or math.copysign(1, got) == math.copysign(
            1, x * y + z)), (x, y, z, want, got)
