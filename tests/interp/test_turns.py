"""`turn { }` (warpgroups of a role take turns: the ping-pong of FlashAttention 3) and
`frag(p, k)` (an accumulator converted to an A fragment in registers): what they lower to,
their order in the interpreter, and their located errors."""

import textwrap

import numpy as np
import pytest

import ptxdsl
from ptxdsl import array, bf16, u32
from ptxdsl.interp import TensorMapModel, run

TURNS = """\
kernel turns<WG: u32 = 3, ON: u32 = 1>(out: ptr<u32>) threads(128 * (1 + WG)) {
    shared log: u32[64];
    shared n: u32[1];
    if %tid.x == 0 {
        n[0] = 0;
    }
    bar_sync(0);
    role idle warps 0 .. 4 {
    }
    role workers warps 4 .. 4 * (1 + WG) {
        let wg = %warp / 4 - 1;
        for i in 0 .. 5 {
            turn if ON != 0 {
                if %tid.x % 128 == 0 {
                    log[n[0]] = wg;
                    n[0] = n[0] + 1;
                }
            }
        }
    }
    bar_sync(0);
    if %tid.x < 5 * WG {
        out[%tid.x] = log[%tid.x];
    }
}
"""


def kernel_of(text: str, **defines):
    return ptxdsl.parse(textwrap.dedent(text), "turns.ptxdsl", defines or None).kernel()


@pytest.mark.parametrize("wg", [2, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_warpgroups_take_turns_in_order(wg, seed):
    out = np.zeros(64, np.uint32)
    run(kernel_of(TURNS, WG=wg), 1, {"out": out}, seed=seed)
    assert list(out[:5 * wg]) == [i % wg for i in range(5 * wg)]


def test_turn_lowers_to_derived_named_barriers():
    ptx = ptxdsl.compile_module(ptxdsl.parse(TURNS, "t.ptxdsl", {"WG": 2})).ptx
    # two warpgroups: barriers 14 and 15, 256 threads each (the waiter and the hand-over)
    assert "bar.arrive 14, 256;" in ptx  # the first turn handed to warpgroup 0
    assert "bar.sync 14, 256;" in ptx  # warpgroup 0 takes the last hand-over
    assert ptx.count("bar.sync %r") >= 1 and ", 256;" in ptx


def test_turn_if_false_is_a_plain_block():
    ptx = ptxdsl.compile_module(ptxdsl.parse(TURNS, "t.ptxdsl", {"ON": 0})).ptx
    assert "bar.arrive" not in ptx and ", 256;" not in ptx


def test_turn_ids_avoid_the_kernels_own_barriers():
    text = TURNS.replace("    bar_sync(0);\n    role idle", "    bar_sync(15, 512);\n    role idle")
    ptx = ptxdsl.compile_module(ptxdsl.parse(text, "t.ptxdsl", {"WG": 3})).ptx
    assert "bar.arrive 12, 256;" in ptx and "bar.sync 15, 512;" in ptx


def test_python_turn_builds_the_texts_ir():
    @ptxdsl.kernel(threads=384, name="turns")
    def turns(k, out: ptxdsl.ptr(u32)):
        log = k.shared("log", u32, [64])
        n = k.shared("n", u32, [1])
        with k.if_(k.tid.x == 0):
            n[0] = 0
        k.bar_sync(0)
        with k.role("idle", 0, 4):
            pass
        with k.role("workers", 4, 12):
            wg = k.let("wg", k.warp / 4 - 1)
            with k.for_("i", 0, 5):
                with k.turn():
                    with k.if_(k.tid.x % 128 == 0):
                        log[n[0]] = wg
                        n[0] = n[0] + 1
        k.bar_sync(0)
        with k.if_(k.tid.x < 10):
            out[k.tid.x] = log[k.tid.x]

    assert turns.ir == ptxdsl.parse(TURNS, "t.ptxdsl", {"WG": 2}).kernel()


@pytest.mark.parametrize("body, message, line", [
    ("role a warps 0 .. 4 { turn { } }", "needs a role of two or more whole warpgroups", 1),
    ("role a warps 0 .. 8 { turn { turn { } } }", "turn blocks do not nest", 1),
    ("turn { }\n role a warps 0 .. 8 { }", "turn { } belongs in a role", 1),
])
def test_turn_errors_are_located(body, message, line):
    text = f"kernel k() threads(256) {{\n{body}\n}}"
    with pytest.raises(ptxdsl.CompileError) as e:
        ptxdsl.parse(text, "k.ptxdsl")
    d = e.value.diagnostics[0]
    assert message in d.message and d.span.line == line + 1, str(e.value)


FRAG = """\
kernel k() threads(128) {{
    let p: {ty};
    let acc: f32[32];
    for kk in 0 .. 4 {unroll}{{
        {use};
    }}
}}
"""


@pytest.mark.parametrize("ty, unroll, use, message", [
    ("bf16[32]", "unroll ", "let x = frag(p, 4)", "k = 4 is out of range [0, 4)"),
    ("f32[32]", "unroll ", "let x = frag(p, kk)", "a register array of bf16 or f16"),
    ("bf16[12]", "unroll ", "let x = frag(p, 0)", "a multiple of 8"),
    ("bf16[32]", "", "let x = frag(p, kk)", "'unroll' loop variables"),
])
def test_frag_errors_are_located(ty, unroll, use, message):
    text = FRAG.format(ty=ty, unroll=unroll, use=use)
    with pytest.raises(ptxdsl.CompileError) as e:
        ptxdsl.parse(text, "k.ptxdsl")
    d = e.value.diagnostics[0]
    assert message in d.message and d.span.line == 5, str(e.value)


def test_frag_selects_the_k_step_of_a_converted_accumulator():
    """S (m64n64, f32) converted to bf16 element by element is P; frag(p, k) hands P's k-th
    16 columns to wgmma as its A operand: O = P V, checked against numpy in the
    interpreter (the attention sample does the same at full size)."""
    from ptxdsl import f32, ptr, tmap

    @ptxdsl.kernel(threads=128)
    def pv(k, a: tmap(bf16, 2), b: tmap(bf16, 2), v: tmap(bf16, 2), c: ptr(f32)):
        sa = k.shared("sa", bf16, [64, 64], swizzle=128)
        sb = k.shared("sb", bf16, [64, 64], swizzle=128)
        sv = k.shared("sv", bf16, [1, 64, 64], swizzle=128, major="mn")
        with k.if_(k.tid.x == 0):
            with k.async_("ld") as ld:
                k.tma_load(sa, a, [0, 0])
                k.tma_load(sb, b, [0, 0])
                k.tma_load(sv[0], v, [0, 0])
        k.await_(ld)
        s = k.let("s", type=array(f32, 32))
        p = k.let("p", type=array(bf16, 32))
        o = k.let("o", type=array(f32, 32))
        k.wgmma_fence()
        with k.for_("kk", 0, 4, unroll=True) as kk:
            k.wgmma(s, sa[0, kk * 16], sb[0, kk * 16], kk > 0)
        k.wgmma_commit()
        k.wgmma_wait(0)
        with k.for_("x", 0, 32, unroll=True) as x:
            p[x] = s[x].to(bf16)
        k.wgmma_fence()
        with k.for_("kk", 0, 4, unroll=True) as kk:
            k.wgmma(o, k.frag(p, kk), sv[0, kk * 16, 0], kk > 0)
        k.wgmma_commit()
        k.wgmma_wait(0)
        row = k.let("row", k.tid.x / 32 * 16 + k.laneid / 4)
        with k.for_("j", 0, 8, unroll=True) as j:
            with k.for_("e", 0, 4, unroll=True) as e:
                c[(row + e / 2 * 8) * 64 + j * 8 + k.laneid % 4 * 2 + e % 2] = o[4 * j + e]

    from ptxdsl.runtime.dtypes import bf16_to_f32, f32_to_bf16

    rng = np.random.default_rng(3)
    a, b, v = (f32_to_bf16(rng.standard_normal((64, 64), np.float32)) for _ in range(3))
    c = np.zeros(64 * 64, np.float32)
    maps = {name: TensorMapModel(x, (64, 64), swizzle="128B") for name, x in
            (("a", a), ("b", b), ("v", v))}
    run(pv, 1, {**maps, "c": c})
    s = bf16_to_f32(a) @ bf16_to_f32(b).T
    p = bf16_to_f32(f32_to_bf16(s))  # P rounded to bf16, as the kernel converts it
    vf = bf16_to_f32(v)
    want = p @ vf
    # an S element on a bf16 rounding boundary may round the other way after the tensor
    # cores' own summation order: one bf16 step of P
    tol = 2 ** -8 * (np.abs(p) @ np.abs(vf)) + 1e-3
    assert (np.abs(c.reshape(64, 64) - want) <= tol).all()
    assert np.abs(c.reshape(64, 64) - want).mean() < 1e-3


def test_frag_index_out_of_range_in_an_unrolled_iteration_is_located():
    """k computed from an unroll variable is known only once the loop is unrolled: the
    verifier tries every iteration."""
    text = FRAG.format(ty="bf16[32]", unroll="unroll ",
                       use="wgmma_fence(); wgmma(acc, frag(p, kk + 1), acc_b[0, 0])")
    text = text.replace("    let acc: f32[32];\n",
                        "    let acc: f32[32];\n    shared acc_b: bf16[64][64] swizzle 128;\n")
    with pytest.raises(ptxdsl.CompileError) as e:
        ptxdsl.compile_module(ptxdsl.parse(text, "k.ptxdsl"))
    d = e.value.diagnostics[0]
    assert "k is 4 in the unrolled iteration kk = 3, out of range [0, 4)" in d.message, \
        str(e.value)
    assert d.span is not None and d.span.line == 6
