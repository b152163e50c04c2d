"""Compile-time constants (`const`), compile-time kernel parameters (`kernel k<N: u32>`),
their instantiation (-D, defines=) and compile-time assertions."""

import re

import pytest
from conftest import KERNELS, SAMPLES, cli, sample_module

import ptxdsl
from ptxdsl import types as T

NORMS = KERNELS / "norms.ptxdsl"


def errors(text: str, **kw) -> str:
    with pytest.raises(ptxdsl.CompileError) as e:
        ptxdsl.parse(text, "c.ptxdsl", **kw)
    return e.value.render()


def test_constants_build_the_ir_of_the_numbers_they_stand_for():
    with_consts = ptxdsl.parse("""
        const W = 4;
        kernel k<N: u32 = 64>(x: ptr<f32>) threads(32 * W) {
            const HALF: u32 = N / 2;
            const INV: f32 = 1.0 / N as f32;
            shared s: f32[N][W] align 16;
            for i in 0 .. HALF / 8 unroll {
                x[%tid.x * HALF + i] = s[i, 0] * INV;
            }
        }""")
    numbers = ptxdsl.parse("""
        kernel k(x: ptr<f32>) threads(128) {
            shared s: f32[64][4] align 16;
            for i in 0 .. 4 unroll {
                x[%tid.x * 32 + i] = s[i, 0] * 0.015625;
            }
        }""")
    assert with_consts == numbers


def test_a_swizzle_is_a_constant_expression():
    """A chunk's swizzle follows its width: `swizzle CW * 2` is the number it stands for, and
    a swizzle computed when the kernel runs is a located error."""
    text = """
        kernel k<CW: u32 = 64>(x: ptr<u32>) threads(32) {
            shared s: bf16[64][CW] align 1024 swizzle CW * 2;
            x[0] = 1;
        }"""
    assert ptxdsl.parse(text, defines={"CW": 32}) == ptxdsl.parse("""
        kernel k(x: ptr<u32>) threads(32) {
            shared s: bf16[64][32] align 1024 swizzle 64;
            x[0] = 1;
        }""")
    assert "a swizzle must be known at compile time" in errors(
        "kernel k(x: ptr<u32>, n: u32) threads(32) { shared s: bf16[64][64] align 1024 "
        "swizzle n; x[0] = 1; }")


def test_defines_instantiate_compile_time_parameters():
    text = "kernel k<N: u32 = 8, F: f32 = 0.5, P: pred = true>(x: ptr<f32>) threads(32) " \
           "{ if P { x[N] = F; } }"
    base = ptxdsl.parse(text)
    assert base == ptxdsl.parse("kernel k(x: ptr<f32>) threads(32) { if true { x[8] = 0.5; } }")
    given = ptxdsl.parse(text, defines={"N": "0x10", "F": 2, "P": "false"})
    assert given == ptxdsl.parse(
        "kernel k(x: ptr<f32>) threads(32) { if false { x[16] = 2.0; } }")


def test_printer_writes_the_instantiated_kernel_and_it_round_trips():
    m = ptxdsl.parse_file(NORMS, defines={"N": 4096})
    text = ptxdsl.print_module(m)
    assert "<N" not in text and "const" not in text and "bf16[4096]" in text
    assert ptxdsl.parse(text) == m


@pytest.mark.parametrize("n, t", [(2048, "bf16"), (4096, "bf16"), (16384, "bf16"),
                                  (4096, "f32"), (8192, "f16")])
def test_norms_text_and_twin_agree_for_other_sizes_and_types(n, t):
    twin = sample_module("norms")
    m = ptxdsl.parse_file(NORMS, defines={"N": n, "T": t})
    assert len(m.kernels) == 6
    for k in m.kernels:
        assert k == twin.make(k.name, n, dtype=T.SCALARS[t]).ir


def test_norms_carry_no_size_literal_and_no_hand_written_mbarrier():
    text = NORMS.read_text()
    code = "\n".join(line.split("//")[0] for line in text.splitlines())
    assert "mbarrier" not in code
    assert re.findall(r"\b8192\b", code) == ["8192"] * 6  # only the defaults of N
    assert re.findall(r"\bbf16\w*", code) == ["bf16"] * 6  # and of T
    for literal in ("16384", "0.0001220703125", " 4 ", "2048"):
        assert literal not in code


def test_cli_compiles_norms_for_several_sizes(tmp_path):
    def compile_(*extra):
        out = tmp_path / "n.ptx"
        r = cli("compile", str(NORMS), "-o", str(out), *extra)
        assert r.returncode == 0, r.stderr
        return out.read_text()

    default = compile_()
    assert compile_("-D", "N=8192") == default
    for n, t, size in ((2048, "bf16", 2), (4096, "bf16", 2), (16384, "bf16", 2),
                       (4096, "f32", 4)):
        ptx = compile_("-D", f"N={n}", "-D", f"T={t}")
        # each row is one bulk copy of its bytes, armed with as many
        assert f"], {size * n}, [" in ptx and "expect_tx.release.cta.shared::cta.b64 _, [" in ptx
        assert f", {size * n};" in ptx


def test_cli_rejects_bad_defines():
    r = cli("compile", str(NORMS), "-D", "N")
    assert r.returncode == 1 and "-D N: expected NAME=VALUE, e.g. -D N=8192" in r.stderr
    r = cli("check", str(NORMS), "-D", "N=3000")
    assert r.returncode == 1 and "compile-time assertion failed: a row is whole 16-byte " \
        "vectors for every consumer thread (N % (THREADS * VEC) == 0 is false)" in r.stderr


def test_attention_names_its_warpgroup_rule():
    """Three consumer warpgroups fit the registers only at head dim 64: a located assertion,
    not a register-budget error."""
    text = (SAMPLES / "attention.ptxdsl").read_text().splitlines()
    line = next(i for i, t in enumerate(text, 1) if t.strip().startswith("assert NWG"))
    r = cli("check", str(SAMPLES / "attention.ptxdsl"), "-D", "NWG=3")
    assert r.returncode == 1 and f"attention.ptxdsl:{line}:5: error: compile-time assertion " \
        "failed: 2 consumer warpgroups, or 3 at head dim 64" in r.stderr, r.stderr
    assert "register arrays" not in r.stderr


def test_constant_folding_checks_types_and_ranges():
    assert "expected f32, got the u32 constant 8 (convert it with 'as f32')" in errors(
        "const N: u32 = 8; kernel k() threads(32) { let f: f32 = N; }")
    assert "literal 4294967296 does not fit in u32" in errors(
        "const N: u32 = 65536; kernel k() threads(32) { const M = N * N; }")
    assert "operands of '+' have different types: u32 and s32" in errors(
        "const A: u32 = 1; const B: s32 = 2; kernel k() threads(32) { const C = A + B; }")
    assert "cannot negate u32" in errors("const A: u32 = 1; const B = -A; "
                                         "kernel k() threads(32) { }")


def test_untyped_constants_take_the_type_they_meet():
    a = ptxdsl.parse("const H = 0.5; const N = 3; kernel k(x: ptr<f32>) threads(32) "
                     "{ let i: u64 = N; x[i] = H * N; }")
    b = ptxdsl.parse("kernel k(x: ptr<f32>) threads(32) { let i: u64 = 3; x[i] = 1.5; }")
    assert a == b


def test_float_constants_convert_to_integers_by_truncation():
    a = ptxdsl.parse("const F: f32 = 7.9; kernel k(x: ptr<u32>) threads(32) { x[0] = F as u32; }")
    assert a == ptxdsl.parse("kernel k(x: ptr<u32>) threads(32) { x[0] = 7; }")


@pytest.mark.ptxas
@pytest.mark.parametrize("n", [2048, 16384])
def test_norms_of_other_sizes_assemble(n, tmp_path):
    from test_ptxas import assemble

    log = assemble(ptxdsl.compile(NORMS, defines={"N": n}).ptx, tmp_path)
    assert "Used" in log and " 0 bytes spill stores" in log


TYPED = """
kernel k<T: type = bf16>(x: ptr<T>, y: ptr<T>) threads(32) {
    const VEC = 16 / sizeof(T);
    let v: vec<T, VEC> = vload(x[%tid.x * VEC], VEC);
    let o: vec<T, VEC>;
    for j in 0 .. VEC unroll {
        o[j] = (v[j] as f32 * 2.0) as T;
    }
    y[%tid.x * VEC] = o;
}
"""


def test_type_parameters_instantiate_like_the_written_types():
    written = """
    kernel k(x: ptr<f32>, y: ptr<f32>) threads(32) {
        let v: f32x4 = vload(x[%tid.x * 4], 4);
        let o: f32x4;
        for j in 0 .. 4 unroll {
            o[j] = v[j] * 2.0;
        }
        y[%tid.x * 4] = o;
    }"""
    assert ptxdsl.parse(TYPED, defines={"T": "f32"}) == ptxdsl.parse(written)
    assert ptxdsl.parse(TYPED, defines={"T": ptxdsl.f32}) == ptxdsl.parse(written)
    bf = ptxdsl.parse(TYPED).kernel()
    assert bf.params[0].type == ptxdsl.ptr(ptxdsl.bf16)
    assert ptxdsl.parse(ptxdsl.print_module(ptxdsl.parse(TYPED))) == ptxdsl.parse(TYPED)


def test_type_parameter_mistakes():
    assert "compile-time parameter 'T: type' takes a scalar type (bf16, f32, u32, ...), got " \
           "'float'; did you mean 'f32'?" in errors(TYPED, defines={"T": "float"})
    assert "'T' is a type, not a value (sizeof(T) is its size in bytes)" in errors(
        "kernel k<T: type = f32>(x: ptr<T>) threads(32) { let a = T; }")
    assert "no 3-wide vector of f32: a vector is 4, 8 or 16 bytes" in errors(
        "kernel k<T: type = f32>() threads(32) { let a: vec<T, 3>; }")
    assert "kernel 'k' needs a type for its compile-time parameter 'T': pass -D T=bf16" in \
        errors("kernel k<T: type>() threads(32) { }")


def test_interp_runs_an_instantiated_sample_with_data_sized_alike():
    r = cli("interp", str(NORMS), "-D", "N=2048", "-D", "T=f32", "--kernel", "rmsnorm")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("PASS rmsnorm: y max |err|")


@pytest.mark.parametrize("d, causal, nwg, lazy", [(128, 0, 2, 0), (64, 1, 3, 1), (64, 0, 2, None),
                                                  (128, 1, 2, None)])
def test_attention_text_and_twin_agree_on_other_parameters(d, causal, nwg, lazy):
    """The default build is compared in test_twins; these are the -D forms (the lazy rescale
    forced either way, three warpgroups, causal)."""
    import dataclasses

    defines = {"D": d, "CAUSAL": causal, "NWG": nwg} | ({} if lazy is None else {"LAZY": lazy})
    (k,) = ptxdsl.parse_file(SAMPLES / "attention.ptxdsl", defines=defines).kernels
    kd = sample_module("attention").make_attention(
        d, bool(causal), nwg=nwg, lazy=None if lazy is None else bool(lazy))
    assert dataclasses.replace(k, name=kd.ir.name) == kd.ir
