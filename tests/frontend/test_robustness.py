"""Regression tests for what fuzzing found (issue 15), one per class of input that escaped
every check, each with its located message; and the compiler's resource bounds."""

import inspect
import math

import numpy as np
import pytest
from conftest import ROOT, assemble, cli
from fuzzing import outcome

import ptxdsl
from ptxdsl import f32, ptr, u32


def this_line() -> int:
    return inspect.currentframe().f_back.f_lineno


def error_at(text: str, message: str, line: int, col: int | None = None, arch=None) -> str:
    """`text` fails with `message` reported first at `line` (and `col`)."""
    o = outcome(text, arch)
    assert o.kind == "error", o.text
    head = o.text.splitlines()[0]
    where = f"fuzz.ptxdsl:{line}:" + (f"{col}:" if col is not None else "")
    assert message in o.text and where in head, o.text
    return o.text


def body(stmts: str, params: str = "a: u32, p: ptr<u32>, q: ptr<f32>") -> str:
    return f"kernel k({params}) threads(32) {{\n{stmts}\n}}\n"


# ----------------------------------------------------------------------------- literals


def test_leading_zero_is_a_located_error_with_exit_status_1(tmp_path):
    """Issue 15: `032` ended in 'internal error: ValueError ... base 0' and exit status 2."""
    f = tmp_path / "zero.ptxdsl"
    f.write_text(body("    p[0] = 032;"))
    r = cli("compile", str(f))
    assert r.returncode == 1, r.stderr
    assert "zero.ptxdsl:2:12: error: integer literal 032 has a leading zero; write 32" in r.stderr
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("stmts,message,line,col", [
    ("    p[0] = 0009;", "integer literal 0009 has a leading zero; write 9", 2, 12),
    ("    p[0] = 99999999999999999999999;", "integer literal 99999999999999999999999 is too "
     "large", 2, 12),
    ("    p[0] = 0x10000000000000000;", "is too large", 2, 12),
    ("    p[0] = 4294967296;", "literal 4294967296 does not fit in u32", 2, 12),
    ("    q[0] = 1e999;", "float literal 1e999 is too large for f64", 2, 12),
    ("    q[0] = 1e99999999999;", "float literal 1e99999999999 is too large for f64", 2, 12),
    ("    q[0] = 3.5e38;", "literal 3.5e+38 does not fit in f32 (f32 holds at most 3.40e38)",
     2, 12),
    ("    let h: f16 = 65520.0;", "literal 65520.0 does not fit in f16", 2, 18),
    ("    q[0] = 1e300 * 1e300;", "overflows f64", 2, 12),
    ("    p[0] = 1 << 4294967295;", "shift count 4294967295 of a constant expression is "
     "outside [0, 64]", 2, 12),
    ("    p[0] = 0xFFFFFFFFFFFFFFFF * 16;", "is out of range of every integer type", 2, 12),
    ("    p[0] = -0xFFFFFFFFFFFFFFFF;", "is out of range of every integer type", 2, 12),
])
def test_literals_and_constants_out_of_range(stmts, message, line, col):
    error_at(body(stmts), message, line, col)


def test_literal_in_a_declaration_and_attribute_gives_one_message():
    text = error_at("kernel k(p: ptr<u32>) threads(032) { p[0] = 1; }",
                    "integer literal 032 has a leading zero", 1, 31)
    assert "needs a thread count" not in text
    error_at("kernel k(t: tmap<f32, 09>) threads(32) { }", "has a leading zero", 1, 23)
    error_at(body("    shared s: f32[16][32] swizzle 0128;"), "has a leading zero", 2, 35)


def test_define_values_follow_the_literal_rules():
    src = "kernel k<N: u32 = 8>(p: ptr<u32>) threads(32) { p[0] = N; }"
    for value, message in [("032", "has a leading zero"), ("0b101", "binary and octal"),
                           ("1_000", "is not an integer"), ("4294967296", "does not fit in u32")]:
        with pytest.raises(ptxdsl.CompileError, match=message):
            ptxdsl.frontend.parse(src, defines={"N": value})


def test_remainder_folds_exactly_on_64_bit_constants():
    o = outcome(body("    let x: u64 = 18446744073709551615 % 7;", "p: ptr<u64>"))
    assert o.kind == "ptx" and "18446744073709551615 % 7" and \
        str(18446744073709551615 % 7) in o.text


def test_verifier_holds_addresses_beyond_int64(tmp_path):
    """A bulk copy from w[2**63 - 1]: the verifier's address tracking overflowed numpy's int64
    (OverflowError). Such an address is legal PTX; the verifier treats it as unknown."""
    src = (ROOT / "ptxdsl" / "kernels" / "norms.ptxdsl").read_text()
    assert "bulk_load(wsh, w[0]);" in src
    o = outcome(src.replace("bulk_load(wsh, w[0]);", "bulk_load(wsh, w[9223372036854775807]);"))
    assert o.kind == "ptx"
    assemble(o.text, tmp_path)


def test_eight_bit_values_move_in_16_bit_registers(tmp_path):
    """`let x: u8 = 0;` emitted `mov.u8`, which ptxas rejects (found by the API fuzzer)."""
    o = outcome(body("    let x: u8 = 0;\n    let y: s8 = -3 as s8;\n"
                     "    let z: u8 = select(%tid.x > 3, x, y as u8);\n"
                     "    if y < -1 as s8 { p[0] = z as u32; }", "p: ptr<u32>"))
    assert o.kind == "ptx", o.text
    assert "mov.u8" not in o.text and "selp.u8" not in o.text
    assert "cvt.u8.s8" in o.text and "setp.lt.s16" in o.text
    assemble(o.text, tmp_path)


@pytest.mark.parametrize("expr,op", [("x & x", "&"), ("x << 1", "<<"), ("~x", "!")])
def test_eight_bit_values_compute_only_after_conversion(expr, op):
    error_at(body(f"    let x: u8 = 1;\n    p[0] = ({expr}) as u32;"),
             f"'{op}' on u8 is not supported; convert to u32", 3, 13)


# ----------------------------------------------------------------------------- text shapes


@pytest.mark.parametrize("stmts,message,line,col", [
    # a list where a value belongs was an AttributeError in the builder
    ("    [a * 4] = a;", "a list is not a value here", 2, 5),
    ("    p[0] = [a] + 1;", "a list is not a value here", 2, 12),
    ("    p[[0, 1]] = a;", "a list is not a value here", 2, 7),
    # asm operands beyond the list were an IndexError in the emitter
    ('    let x: u32 = 0;\n    asm "mov.u32 {0}, {5};" : x : a;', "names operand {5}", 3, 5),
    ('    let x: u32[4];\n    asm "mov.u32 {0}, 1;" : x;', "must be a local scalar", 3, 29),
    ('    let v: u32x4 = u32x4(1, 2, 3, 4);\n    asm "// {0}" : : v;',
     "an asm operand is a scalar or a pointer (one register), got u32x4", 3, 22),
    # a constant parity other than 0 / 1 reached ptxas, which rejected it
    ("    mbarrier b count 1;\n    mbarrier_wait(b, 0xFFFFFFFF);",
     "an mbarrier phase parity is 0 or 1, got 4294967295", 3, 22),
    ("    mbarrier b count 1;\n    mbarrier_test_wait(b, 2);", "parity is 0 or 1, got 2", 3, 27),
    # an unroll loop with step 0 was a ValueError from range()
    ("    for i in 0 .. 8 step 0 unroll { }", "loop step must not be zero", 2, 26),
])
def test_text_shapes_that_escaped(stmts, message, line, col):
    error_at(body(stmts), message, line, col)


def test_a_kernel_named_underscore_is_an_error():
    """`kernel _(...)` reached ptxas, which does not take a lone '_' as a name."""
    error_at("kernel _(p: ptr<u32>) threads(32) { p[0] = 1; }", "'_' cannot name a kernel",
             1, 8)
    with pytest.raises(ptxdsl.CompileError, match="a kernel's name must be a PTX identifier"):
        ptxdsl.kernel(lambda k: None, threads=32, name="_")


def test_unrolled_register_index_out_of_range_is_located():
    """The index of a register array computed from unroll variables was checked by nothing:
    the emitter's list indexing failed (IndexError)."""
    text = error_at(body("    let acc: f32[8] = 0.0;\n    for j in 0 .. 3 unroll {\n"
                         "        q[j] = acc[4 * j];\n    }"),
                    "element index 4 * j of 'acc' (f32[8]) is 8 in the unrolled iteration j = 2, "
                    "out of range [0, 8)", 4, 16)
    assert "acc[4 * j]" in text


def test_sm80_errors_of_statements_the_compiler_made_are_located():
    """A cluster kernel for sm_80: the cluster_sync the lowering adds had no place."""
    src = (ROOT / "samples" / "dsmem_exchange.ptxdsl").read_text()
    o = outcome(src, "sm_80")
    assert o.kind == "error" and "has no sm_80 form" in o.text
    assert "\nerror:" not in "\n" + o.text  # every error has file:line:col


# ----------------------------------------------------------------------------- bounds


def _nested_ifs(n: int) -> str:
    return body("if a > 0 {\n" * n + "p[0] = 1;\n" + "}\n" * n)


def test_ten_thousand_nested_blocks_are_a_located_error_not_a_recursion_error():
    error_at(_nested_ifs(10_000), "nested more than 256 levels deep", 257, 1)
    assert outcome(_nested_ifs(240)).kind == "ptx"


def test_ten_thousand_chained_operators_are_a_located_error():
    error_at(body("    p[0] = a" + " + a" * 10_000 + ";"), "nested more than 256 levels", 2)
    error_at(body("    p[0] = " + "~" * 10_000 + "a;"), "nested more than 256 levels", 2)
    assert outcome(body("    p[0] = a" + " + a" * 240 + ";")).kind == "ptx"


def test_a_diagnostic_on_a_very_long_line_shows_the_part_around_the_caret():
    text = error_at(body("    " + "p[0] = a; " * 3_000 + "p[1] = zz;"), "unknown name 'zz'", 2)
    excerpt, caret = text.splitlines()[1:3]
    assert excerpt.startswith("...") and len(excerpt) < 200
    assert excerpt[caret.index("^"):].startswith("zz;")


def test_nested_unroll_copies_are_bounded():
    loops = "".join(f"for i{j} in 0 .. 256 unroll {{\n" for j in range(3))
    error_at(body("let x: u32 = 0;\n" + loops + "x += a;\n" + "}\n" * 3 + "p[0] = x;"),
             "nested 'unroll' loops would copy this body 65536 times; at most 4096", 4, 5)
    ok = "".join(f"for i{j} in 0 .. 64 unroll {{\n" for j in range(2))
    assert outcome(body("let x: u32 = 0;\n" + ok + "x += a;\n" + "}\n" * 2 +
                        "p[0] = x;")).kind == "ptx"


def test_python_api_nesting_is_bounded_at_the_users_line():
    with pytest.raises(ptxdsl.CompileError) as e:
        @ptxdsl.kernel(threads=32)
        def deep(k, a: u32, p: ptr(u32)):
            x = a
            for _ in range(10_000):
                x = x + a  # the line the error names
            p[0] = x
    text = e.value.render()
    assert "nests blocks or expressions more than 256 levels deep" in text
    assert "x = x + a  # the line the error names" in text


# ----------------------------------------------------------------------------- Python API


def test_value_of_another_kernel_is_a_located_error():
    """Issue 15: it passed the builder and the verifier and crashed the emitter (KeyError)."""
    kept: list = []

    @ptxdsl.kernel(threads=32)
    def first(k, a: u32, p: ptr(u32)):
        nonlocal kept
        kept = [a, k.shared("tile", u32, [32]), k.mbarrier("bar", count=1)]
        p[0] = a

    line = 0
    with pytest.raises(ptxdsl.CompileError) as e:
        @ptxdsl.kernel(threads=32)
        def second(k, b: u32, p: ptr(u32)):
            nonlocal line
            line = this_line() + 1
            p[0] = b + kept[0]
    d = e.value.diagnostics[0]
    assert d.span.source.name == __file__ and d.span.line == line
    assert "'a' belongs to kernel 'first', not to 'second'" in d.message
    assert d.notes and d.notes[0].message == "it was made here"


@pytest.mark.parametrize("use", ["buffer", "barrier", "pipeline", "value"])
def test_values_of_a_finished_kernel_are_located_errors(use):
    kept: dict = {}

    @ptxdsl.kernel(threads=64)
    def first(k, a: u32, p: ptr(u32)):
        kept.update(value=a + 1, buffer=k.shared("tile", u32, [32]),
                    barrier=k.mbarrier("bar", count=1),
                    pipeline=k.pipeline("ring", 2, row=(u32, [32])))
        p[0] = a

    line = this_line() + 2
    with pytest.raises(ptxdsl.CompileError) as e:
        kept[use][0] if use != "value" else kept[use] + 1
    assert e.value.diagnostics[0].span.line == line
    assert "is used after the kernel was built" in str(e.value)


def test_values_of_the_enclosing_kernel_while_another_builds():
    with pytest.raises(ptxdsl.CompileError, match="used while kernel 'inner' is being built"):
        @ptxdsl.kernel(threads=32)
        def outer(k, a: u32, p: ptr(u32)):
            @ptxdsl.kernel(threads=32)
            def inner(k2, q: ptr(u32)):
                p[0] = 1


@pytest.mark.parametrize("call,message", [
    (lambda k: k.shared(5, f32, [32]), "a shared buffer's name must be a name"),
    (lambda k: k.shared("a b", f32, [32]), "a shared buffer's name must be a name"),
    (lambda k: k.shared("t", "f32", [32]), "must be a ptxdsl scalar type"),
    (lambda k: k.shared("t", f32, [1.5]), "a dimension of 't' must be an integer"),
    (lambda k: k.mbarrier("b", count="1"), "an arrival count must be an integer"),
    (lambda k: k.pipeline("r", 2, row=(f32,)), "stage buffer 'row' is (elem, shape"),
    (lambda k: k.let("x", 2**70), "the Python integer 1180591620717411303424 is out of range"),
    (lambda k: k.let("x", [1, 2]), "a list is not a kernel value here"),
    # a memory-order word where a value belongs was an AttributeError in the builder
    (lambda k: k.let("x", "gpu"), "cannot use a str in a kernel expression"),
    (lambda k: k.min("acq_rel", 1), "cannot use a str in a kernel expression"),
    (lambda k: k.let("x", 1, "u32"), "the type of 'x' must be a ptxdsl type"),
    (lambda k: k.sizeof(k.shared("t", f32, [4])).full, "a literal has no member 'full'"),
    (lambda k: k.asm(7), "asm() takes the PTX text as a string"),
    (lambda k: k.sreg(3), "sreg() takes a register name"),
    (lambda k: k.tid.x.to("f32"), "to() takes a ptxdsl type"),
])
def test_api_arguments_are_checked_at_the_users_line(call, message):
    with pytest.raises(ptxdsl.CompileError) as e:
        @ptxdsl.kernel(threads=32)
        def bad(k, p: ptr(u32)):
            call(k)
    assert message in str(e.value)
    assert all(d.span is not None and d.span.source.name == __file__
               for d in e.value.diagnostics), str(e.value)


@pytest.mark.parametrize("settings,message", [
    ({"threads": 1.5}, "threads takes an integer or 1 to 3 integers, got 1.5"),
    ({"threads": 32, "cluster": "x"}, "cluster takes an integer"),
    ({"threads": 32, "maxnreg": "64"}, "maxnreg must be an integer"),
    ({"threads": 32, "name": "my kernel"}, "a kernel's name must be a PTX identifier"),
])
def test_kernel_settings_are_checked(settings, message):
    with pytest.raises(ptxdsl.CompileError, match=message):
        ptxdsl.kernel(lambda k: None, **settings)


def test_with_block_errors_point_at_the_users_line_not_contextlib():
    line = 0
    with pytest.raises(ptxdsl.CompileError) as e:
        @ptxdsl.kernel(threads=32)
        def bad(k, p: ptr(u32)):
            nonlocal line
            line = this_line() + 1
            with k.if_(None):
                p[0] = 1
    assert {d.span.line for d in e.value.diagnostics} == {line}
    assert "contextlib" not in str(e.value)


def test_numpy_numbers_and_infinities_are_numbers(tmp_path):
    def max_of(k, a, b):
        return k.max(a, b)

    @ptxdsl.kernel(threads=32)
    def ok(k, p: ptr(f32)):
        t = k.shared("t", f32, [np.int64(32)])
        m = k.let("m", -math.inf, f32)
        t[k.tid.x] = np.float32(1.5)
        p[k.tid.x] = max_of(k, m, t[k.tid.x])

    ptx = ok.ptx()
    assert "0fFF800000" in ptx  # -inf as an f32 immediate
    assemble(ptx, tmp_path)
