"""Parser and builder: what the text language accepts and the IR it builds."""

import pytest

import ptxdsl
from ptxdsl import ir
from ptxdsl import types as T


def kernel(body: str, params: str = "", attrs: str = "threads(128)") -> ir.Kernel:
    return ptxdsl.parse(f"kernel k({params}) {attrs} {{\n{body}\n}}\n").kernels[0]


def test_kernel_header_and_params():
    k = kernel("", "a: ptr<bf16>, m: tmap<f32, 3>, n: u64, f: f16, p: pred",
               "threads(128, 2) cluster(2) maxnreg(168) minctas(1)")
    assert k.threads == (128, 2, 1) and k.cluster == (2, 1, 1)
    assert k.maxnreg == 168 and k.minctas == 1
    assert [p.type for p in k.params] == [T.Ptr(T.bf16), T.TensorMap(T.f32, 3), T.u64, T.f16,
                                          T.pred]


def test_literals_take_the_other_operands_type():
    k = kernel("let x: u64 = 7; let y = x * 3 + 1; let z = 1.5 as f32;")
    y = k.body[1]
    assert isinstance(y, ir.Let) and y.var_type == T.u64
    assert y.value.b == ir.Const(value=1, type=T.u64)
    assert k.body[2].value == ir.Const(value=1.5, type=T.f32)


def test_constant_folding_of_untyped_literals():
    k = kernel("let x = (2 + 3) * 4 - 1;")
    assert k.body[0].value == ir.Const(value=19, type=T.u32)


def test_precedence_and_associativity():
    k = kernel("let a = %tid.x; let b = a - 1 - 2; let c = a + 2 * 3 << 1;"
               "let p = a < 4 && a > 1 || a == 9;")
    b = k.body[1].value
    assert b.op == "sub" and b.a.op == "sub"  # (a - 1) - 2
    c = k.body[2].value
    assert c.op == "shl" and c.a.op == "add"  # (a + 6) << 1, 2*3 folded
    p = k.body[3].value
    assert p.op == "or" and p.a.op == "and"


def test_shared_views_and_element_loads():
    k = kernel("shared t: f32[2][64]; let s = %tid.x & 1; let x = t[s, 3]; let y = t[s][3];")
    x, y = k.body[2].value, k.body[3].value
    assert isinstance(x, ir.Load) and x.type == T.f32
    assert isinstance(y, ir.Load) and isinstance(y.ref.base, ir.Index)


def test_vector_load_store_and_extract():
    k = kernel("shared t: bf16[64]; let v: bf16x8 = vload(t[8], 8); t[0] = v; let e = v[7];")
    assert k.body[1].var_type == T.Vector(T.bf16, 8)
    assert isinstance(k.body[2], ir.Store) and k.body[2].value.type == T.Vector(T.bf16, 8)
    assert k.body[3].value == ir.Extract(vec=ir.Var(name="v", type=T.Vector(T.bf16, 8)),
                                         index=ir.Const(value=7, type=T.u32), type=T.bf16)


def test_derived_bulk_sizes():
    k = kernel("shared t: f32[4][256]; mbarrier b count 1; bulk_load(t[1], src[0], b);",
               "src: ptr<f32>")
    op = k.body[2]
    assert isinstance(op, ir.BulkLoad) and op.nbytes == ir.Const(value=1024, type=T.u32)


def test_compound_assignment_desugars():
    k = kernel("let x = 1; x += 2; x <<= 1;")
    assert k.body[1] == ir.Assign(name="x", value=ir.Binary(
        op="add", a=ir.Var(name="x", type=T.u32), b=ir.Const(value=2, type=T.u32), type=T.u32))


def test_else_if_chain():
    k = kernel("let x = %tid.x; if x == 0 { } else if x == 1 { } else { return; }")
    s = k.body[1]
    assert isinstance(s, ir.If) and isinstance(s.orelse[0], ir.If)
    assert isinstance(s.orelse[0].orelse[0], ir.Return)


def test_for_loop_types_follow_bounds():
    k = kernel("for i in 0 .. n step 2 { }", "n: s32")
    assert k.body[0].var_type == T.s32 and k.body[0].step == ir.Const(value=2, type=T.s32)


def test_asm_operands():
    k = kernel('let t: u32 = 0; asm "mov.u32 {0}, %clock;" : t;')
    a = k.body[1]
    assert isinstance(a, ir.Asm) and a.outs == ("t",) and a.template == "mov.u32 {0}, %clock;"


def test_several_kernels_in_one_file():
    m = ptxdsl.parse("kernel a() threads(32) { } kernel b() threads(64) { }")
    assert [k.name for k in m.kernels] == ["a", "b"]


@pytest.mark.parametrize("src", [
    "let x = foo;",
    "let x: f32 = %tid.x;",
    "shared t: f32[0];",
    "mbarrier b count 0;",
    "let x = 1; let x = 2;",
    "bar_sync(16);",
    "let v: f32x3 = 0;",
    "let x = 5000000000;",
    "if 1 { }",
])
def test_semantic_errors_raise(src):
    with pytest.raises(ptxdsl.CompileError):
        kernel(src)


def test_roles_must_cover_every_warp():
    with pytest.raises(ptxdsl.CompileError, match=r"warps 2 \.\. 4 of this 128-thread CTA"):
        ptxdsl.compile("kernel k() threads(128) { role a warps 0 .. 2 { } }")
    ptxdsl.compile("kernel k() threads(128) { role a warps 0 .. 2 { } role b warps 2 .. 4 { } }")


def test_tile_prefetch_checks_the_rank():
    with pytest.raises(ptxdsl.CompileError, match="rank 2, but 1 coordinate"):
        kernel("tma_prefetch(m, [0]);", "m: tmap<f32, 2>")
    assert isinstance(kernel("tma_prefetch(m, [0, 8]);", "m: tmap<f32, 2>").body[0],
                      ir.TensorPrefetch)
