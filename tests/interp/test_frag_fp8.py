"""`frag(p, k)` of an fp8 register array: 16 e4m3 elements (a k32 step) packed four to a
register as wgmma's A operand. What it lowers to, its errors, and in the interpreter an
m64n64 S = A B^T converted to e4m3 row half by row half and handed to the next wgmma, whose
B operand (V^T) has its keys in the fragment's order, against numpy."""

import numpy as np
import pytest

import ptxdsl
from ptxdsl import array, e4m3, f32, ptr, tmap
from ptxdsl.interp import TensorMapModel, run

FRAG = """\
kernel k() threads(128) {{
    let p: {ty};
    let acc: f32[32];
    shared vt: {b}[64][{cols}] swizzle 128;
    for kk in 0 .. 2 unroll {{
        {use};
    }}
}}
"""


def test_fp8_frag_of_elements_not_converted_from_f32_gathers_bytes():
    """An element copied from another e4m3 value (no f32 behind it) packs with prmt."""
    text = FRAG.format(ty="e4m3[32]", b="e4m3", cols=128,
                       use="p[kk] = p[kk + 4]; wgmma_fence(); wgmma(acc, frag(p, kk), vt[0, 0]); "
                       "wgmma_commit(); wgmma_wait(0)")
    assert "prmt.b32" in ptxdsl.compile_module(ptxdsl.parse(text, "k.ptxdsl")).ptx


@pytest.mark.parametrize("ty, b, use, message", [
    ("e4m3[24]", "e4m3", "let x = frag(p, 0)", "or of e4m3 or e5m2 a multiple of 16"),
    ("e4m3[32]", "e4m3", "wgmma_fence(); wgmma(acc, frag(p, kk + 1), vt[0, 0])",
     "out of range [0, 2) (the array holds 2 fragments of 16 elements)"),
    ("e4m3[32]", "bf16", "wgmma_fence(); wgmma(acc, frag(p, kk), vt[0, 0])",
     "16 of fp8 with B fp8, got e4m3[16] with B of bf16"),
])
def test_fp8_frag_errors_are_located(ty, b, use, message):
    text = FRAG.format(ty=ty, b=b, use=use, cols=64 if b == "bf16" else 128)
    with pytest.raises(ptxdsl.CompileError) as e:
        ptxdsl.compile_module(ptxdsl.parse(text, "k.ptxdsl"))
    d = e.value.diagnostics[0]
    assert message in d.message and d.span.line == 6, str(e.value)


def pv_kernel():
    @ptxdsl.kernel(threads=128)
    def pv(k, a: tmap(e4m3, 2), b: tmap(e4m3, 2), vt: tmap(e4m3, 2), c: ptr(f32)):
        sa = k.shared("sa", e4m3, [64, 64], swizzle=64)
        sb = k.shared("sb", e4m3, [64, 64], swizzle=64)
        sv = k.shared("sv", e4m3, [64, 64], swizzle=64)
        with k.if_(k.tid.x == 0):
            with k.async_("ld") as ld:
                k.tma_load(sa, a, [0, 0])
                k.tma_load(sb, b, [0, 0])
                k.tma_load(sv, vt, [0, 0])
        k.await_(ld)
        s = k.let("s", type=array(f32, 32))
        p = k.let("p", type=array(e4m3, 32))
        o = k.let("o", type=array(f32, 32))
        k.wgmma_fence()
        with k.for_("kk", 0, 2, unroll=True) as kk:
            k.wgmma(s, sa[0, kk * 32], sb[0, kk * 32], kk > 0)
        k.wgmma_commit()
        k.wgmma_wait(0)
        with k.for_("kk", 0, 2, unroll=True) as kk:  # row half i: fragment elements 4i ..
            with k.for_("h", 0, 2, unroll=True) as h:
                with k.for_("i", 0, 2, unroll=True) as i:
                    with k.for_("q", 0, 4, unroll=True) as q:
                        p[16 * kk + 8 * h + 4 * i + q] = \
                            s[16 * kk + 8 * h + 4 * (q / 2) + 2 * i + q % 2].to(e4m3)
        k.wgmma_fence()
        with k.for_("kk", 0, 2, unroll=True) as kk:
            k.wgmma(o, k.frag(p, kk), sv[0, kk * 32], kk > 0)
        k.wgmma_commit()
        k.wgmma_wait(0)
        row = k.let("row", k.tid.x / 32 * 16 + k.laneid / 4)
        with k.for_("j", 0, 8, unroll=True) as j:
            with k.for_("e", 0, 4, unroll=True) as e:
                c[(row + e / 2 * 8) * 64 + j * 8 + k.laneid % 4 * 2 + e % 2] = o[4 * j + e]

    return pv


def test_fp8_frag_lowers_to_packed_registers():
    """Each packed register of P (8 of them) is made last by two conversions of f32 pairs
    (the elements' own f32 kept: the first operand is the higher byte) and one mov."""
    import re

    ptx = pv_kernel().ptx("sm_90a")
    zeros = set(re.findall(r"mov\.f32 (%f\d+), 0f00000000;", ptx))
    pairs = [m for m in re.findall(r"cvt\.rn\.satfinite\.e4m3x2\.f32 %rs\d+, (%f\d+), "
                                   r"(%f\d+);", ptx) if not zeros & set(m)]
    assert len(pairs) == 16, pairs
    assert "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%f" in ptx
    # the register operand of P V: four .b32 registers, not a descriptor
    regs = [x.split("}, {")[1].split("}")[0] for x in ptx.splitlines()
            if "m64n64k32" in x and "}, {" in x]
    assert len(regs) == 2 and all(r.count("%r") == 4 for r in regs), regs


def test_fp8_frag_hands_a_converted_accumulator_to_wgmma():
    """O = P V with P = e4m3(A B^T) from registers and V^T's keys permuted within each 16
    (slot 4l + 2a + b holds key 8a + 2l + b), as attention_fp8 reads it."""
    from ptxdsl.fp8 import quantize
    from ptxdsl.kernels.attention_fp8 import vt_layout

    rng = np.random.default_rng(5)
    a, b, v = (quantize(rng.standard_normal((64, 64)) * 2, e4m3) for _ in range(3))
    c = np.zeros(64 * 64, np.float32)
    vt = vt_layout(v[None, None])[0, 0]
    maps = {name: TensorMapModel(x, (64, 64), swizzle="64B") for name, x in
            (("a", a), ("b", b), ("vt", vt))}
    run(pv_kernel(), 1, {**maps, "c": c})
    s = a.astype(np.float32) @ b.astype(np.float32).T
    p = quantize(s, e4m3).astype(np.float64)
    want = p @ v.astype(np.float64)
    # an S element on an e4m3 rounding boundary may round the other way after the tensor
    # cores' own summation order: one e4m3 step (2^-3) of P
    tol = 2 ** -3 * (np.abs(p) @ np.abs(v.astype(np.float64))) + 1e-3
    got = c.reshape(64, 64)
    assert (np.abs(got - want) <= tol).all()
    assert np.mean(np.abs(got - want) <= 1e-3 * np.abs(want) + 1e-3) > 0.95
