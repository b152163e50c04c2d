"""printer: parse(print(ir)) == ir, for every sample and for tricky expressions."""

import pytest
from conftest import sample_ir, sample_kernel_defs, sample_names

import ptxdsl


@pytest.mark.parametrize("name", sample_names())
def test_sample_roundtrip(name):
    m = sample_ir(name)
    text = ptxdsl.print_module(m)
    assert ptxdsl.parse(text) == m
    assert ptxdsl.print_module(ptxdsl.parse(text)) == text  # printing is a fixed point


@pytest.mark.parametrize("name", sample_names())
def test_python_twin_roundtrip(name):
    for kd in sample_kernel_defs(name):
        assert ptxdsl.parse(ptxdsl.print_kernel(kd.ir)).kernels[0] == kd.ir


@pytest.mark.parametrize("body", [
    "let a: u64 = 5; let b = (a + 1) * (a - 2) / 3 % 7;",
    "let a: s32 = -4; let b = -(a) - -3; let c = ~a;",
    "let p = %tid.x < 3 && !(%tid.x == 1) || %laneid > 30;",
    "let f: f32 = 1.0e-5; let g = fma(f, 2.0, -f); let h = select(f > 0.0, f, 0.0);",
    "let x = %tid.x; let y = (x as f32) * 0.5; let z = y as s32 as u64;",
    "let v: u64 = 3 as u64; let w = select(v == 1, 1 as u64, 2 as u64);",
    "let b: bf16 = 1.5; let c = b + b; let d = max(c, b);",
    "for i in 10 .. 0 step -2 as s32 { }",
    "for i in 0 as s32 .. 4 { }",
    "let q = shfl_xor(%laneid as f32, 16); let r = ex2(q) + rsqrt(q) + tanh(q);",
    "let f: f32 = 0.5; let g = exp(f) + log(f) + sigmoid(f) + silu(f) + gelu(f) + exp(2.0);",
    "let b: bf16 = 1.5; let c = gelu(b) + sigmoid(b) + log2(b) + exp2(b);",
    "const h: f16 = 1.5; let d = exp(h) + silu(h);",
    "let x = 1; if x == 0 { x = 2; } else if x == 1 { x = 3; } else { x = 4; }",
    "let x = 0; while x < 10 { x += 3; }",
    'let t: u32 = 0; asm "mov.u32 {0}, %clock; // \\"quoted\\"" : t;',
    # named compile-time indices: the IR holds each use as the expression it names
    "let tv: u32[8] = 0; for d in 0 .. 3 unroll { for q in 0 .. 4 unroll { "
    "let a = q / (4 >> d) * (8 >> d) + q % (4 >> d); const B = a + (4 >> d); "
    "tv[a] = min(tv[a], tv[B]); } }",
])
def test_expression_roundtrip(body):
    m = ptxdsl.parse(f"kernel k() threads(32) {{ {body} }}")
    assert ptxdsl.parse(ptxdsl.print_module(m)) == m
