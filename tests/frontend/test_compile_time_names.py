"""Named compile-time values: inside `unroll` loops a `let` (until assigned) or a `const` of
constants, compile-time parameters and loop variables indexes a register array, in the text
language and the Python API; what is not compile-time is refused, saying why."""

import numpy as np
import pytest

import ptxdsl
from ptxdsl import array, ir, ptr, u32
from ptxdsl.compiler import compile_module
from ptxdsl.interp import run

# A bitonic sort of the 8 values each thread holds in registers; every compare-exchange
# index is named once with `let`/`const` instead of written out at each use.
BITONIC = """
kernel sort8<LOG: u32 = 3>(x: ptr<u32>, y: ptr<u32>) threads(32) {
    const N = 1 << LOG;
    let tv: u32[N];
    for i in 0 .. N unroll { tv[i] = x[%tid.x * N + i]; }
    for s in 0 .. LOG unroll {
        for t in 0 .. LOG unroll {
            if t <= s {
                for q in 0 .. N / 2 unroll {
                    // the copies with t > s are compiled too (the if runs in the kernel):
                    // max keeps their j from dividing by zero
                    let j = max((1 << s) >> t, 1);
                    let a = q / j * (2 * j) + q % j;
                    const B = a + j;
                    let down = (a >> (s + 1)) & 1;
                    let lo = min(tv[a], tv[B]);
                    let hi = max(tv[a], tv[B]);
                    tv[a] = select(down == 0, lo, hi);
                    tv[B] = select(down == 0, hi, lo);
                }
            }
        }
    }
    for i in 0 .. N unroll { y[%tid.x * N + i] = tv[i]; }
}
"""


def sort8_python(log: int = 3) -> ptxdsl.KernelDef:
    n = 1 << log

    @ptxdsl.kernel(threads=32)
    def sort8(k, x: ptr(u32), y: ptr(u32)):
        tv = k.let("tv", type=array(u32, n))
        with k.for_("i", 0, n, unroll=True) as i:
            tv[i] = x[k.tid.x * n + i]
        with k.for_("s", 0, log, unroll=True) as s:
            with k.for_("t", 0, log, unroll=True) as t, k.if_(t <= s):
                with k.for_("q", 0, n // 2, unroll=True) as q:
                    j = k.let("j", k.max((1 << s) >> t, 1))
                    a = k.let("a", q / j * (2 * j) + q % j)
                    b = k.let("b", a + j)
                    down = k.let("down", (a >> (s + 1)) & 1)
                    lo = k.let("lo", k.min(tv[a], tv[b]))
                    hi = k.let("hi", k.max(tv[a], tv[b]))
                    tv[a] = k.select(down == 0, lo, hi)
                    tv[b] = k.select(down == 0, hi, lo)
        with k.for_("i", 0, n, unroll=True) as i:
            y[k.tid.x * n + i] = tv[i]

    return sort8


def sorted_rows(kernel) -> None:
    x = np.random.default_rng(3).integers(0, 1000, 32 * 8, dtype=np.uint32)
    y = np.zeros_like(x)
    run(kernel, 1, {"x": x, "y": y})
    np.testing.assert_array_equal(y.reshape(32, 8), np.sort(x.reshape(32, 8), axis=1))


def test_text_bitonic_sort_with_named_indices_runs():
    sorted_rows(ptxdsl.parse(BITONIC).kernels[0])


def test_python_bitonic_sort_with_named_indices_runs():
    sorted_rows(sort8_python().ir)


def test_named_index_builds_the_ir_of_the_written_out_index():
    named = ptxdsl.parse("""
        kernel k(y: ptr<u32>) threads(32) {
            let tv: u32[8] = 0;
            for d in 0 .. 3 unroll { for q in 0 .. 4 unroll {
                let a = q / (4 >> d) * (8 >> d) + q % (4 >> d);
                tv[a] = tv[a] + 1;
            } }
            y[0] = tv[7];
        }""")
    inline = ptxdsl.parse("""
        kernel k(y: ptr<u32>) threads(32) {
            let tv: u32[8] = 0;
            for d in 0 .. 3 unroll { for q in 0 .. 4 unroll {
                tv[q / (4 >> d) * (8 >> d) + q % (4 >> d)] =
                    tv[q / (4 >> d) * (8 >> d) + q % (4 >> d)] + 1;
            } }
            y[0] = tv[7];
        }""")
    assert named == inline


def test_named_indices_fold_in_the_ptx_of_both_forms():
    """Each compare-exchange reads its two registers directly: 9 (s, t) copies of 4, those
    with t > s compiled too (the if is decided when the kernel runs)."""
    for m in (ptxdsl.parse(BITONIC), ir.Module(kernels=(sort8_python().ir,))):
        ptx = compile_module(m).ptx
        assert ptx.count("min.u32") == ptx.count("max.u32") == 36


def errors(text: str) -> str:
    with pytest.raises(ptxdsl.CompileError) as e:
        ptxdsl.parse(text, "c.ptxdsl")
    return e.value.render()


def first_line(text: str) -> str:
    return errors(text).splitlines()[0]


def test_const_of_a_register_says_what_is_compile_time():
    assert errors("""kernel k(y: ptr<u32>) threads(32) {
        let x: u32;
        for q in 0 .. 4 unroll { const A = q + x; y[A] = 1; }
    }""") == """\
c.ptxdsl:3:48: error: const A must be computable at compile time: it may use constants, \
compile-time parameters and 'unroll' loop variables; 'x' is a register computed when the \
kernel runs
        for q in 0 .. 4 unroll { const A = q + x; y[A] = 1; }
                                               ^"""
    assert first_line("""kernel k(y: ptr<u32>) threads(32) {
        let x = %tid.x;
        for q in 0 .. 4 unroll { const A = q + x; y[A] = 1; }
    }""") == ("c.ptxdsl:3:48: error: const A must be computable at compile time: it may use "
              "constants, compile-time parameters and 'unroll' loop variables; 'x' is a "
              "'let' that is not compile-time: '%tid.x' is a special register, read when the "
              "kernel runs")


def test_const_of_a_parameter_and_of_a_plain_loop_variable():
    assert first_line("""kernel k(y: ptr<u32>, n: u32) threads(32) {
        for i in 0 .. n { const A = i * 2; y[A] = 1; }
    }""") == ("c.ptxdsl:2:37: error: const A must be computable at compile time: it may use "
              "constants, compile-time parameters and 'unroll' loop variables; 'i' is the "
              "variable of a loop without 'unroll'")
    assert first_line("""kernel k(y: ptr<u32>, n: u32) threads(32) {
        const A = n * 2; y[A] = 1;
    }""") == ("c.ptxdsl:2:19: error: const A must be computable at compile time: it may use "
              "constants, compile-time parameters and 'unroll' loop variables; 'n' is a "
              "kernel parameter, known only when the kernel runs")


def test_a_const_of_loop_variables_has_their_type():
    assert first_line("""kernel k(y: ptr<u32>) threads(32) {
        for q in 0 .. 4 unroll { const A: s32 = q * 2; y[0] = 1; }
    }""") == ("c.ptxdsl:2:34: error: constant 'A' is declared s32, but its value is u32 "
              "(convert it with 'as s32')")


def test_a_let_that_reads_a_register_is_no_index_and_the_message_says_why():
    assert first_line("""kernel k(x: ptr<u32>, y: ptr<u32>) threads(32) {
        let tv: u32[4] = 0;
        for q in 0 .. 4 unroll { let a = q + x[0]; y[0] = tv[a]; }
    }""") == ("c.ptxdsl:3:62: error: a register array index must be a constant or an "
              "expression of 'unroll' loop variables; 'a' is a 'let' that is not "
              "compile-time: 'x[0]' reads memory when the kernel runs")


def test_an_assigned_let_is_no_index_and_a_used_one_cannot_be_assigned():
    assert errors("""kernel k(y: ptr<u32>) threads(32) {
        let tv: u32[4] = 0;
        for q in 0 .. 4 unroll { let a = q; a = 3 - q; y[0] = tv[a]; }
    }""") == """\
c.ptxdsl:3:66: error: a register array index must be a constant or an expression of 'unroll' \
loop variables; 'a' is a 'let' that is not compile-time: it is assigned
        for q in 0 .. 4 unroll { let a = q; a = 3 - q; y[0] = tv[a]; }
                                                                 ^
c.ptxdsl:3:45: note: 'a' is assigned here
        for q in 0 .. 4 unroll { let a = q; a = 3 - q; y[0] = tv[a]; }
                                            ^"""
    # assigned after its use in a loop: the next iteration would read another register
    assert errors("""kernel k(y: ptr<u32>) threads(32) {
        let tv: u32[4] = 0;
        for q in 0 .. 4 unroll { let a = q; for i in 0 .. 2 { y[i] = tv[a]; a = 0; } }
    }""") == """\
c.ptxdsl:3:77: error: cannot assign to 'a': it is used as a compile-time value (an index of \
registers), which must not change; assign a new variable instead
        for q in 0 .. 4 unroll { let a = q; for i in 0 .. 2 { y[i] = tv[a]; a = 0; } }
                                                                            ^
c.ptxdsl:3:73: note: 'a' is used here
        for q in 0 .. 4 unroll { let a = q; for i in 0 .. 2 { y[i] = tv[a]; a = 0; } }
                                                                        ^"""


def test_python_let_of_a_register_is_refused_at_the_users_line():
    with pytest.raises(ptxdsl.CompileError) as e:
        @ptxdsl.kernel(threads=32)
        def bad(k, y: ptr(u32)):
            tv = k.let("tv", 0, type=array(u32, 4))
            with k.for_("q", 0, 4, unroll=True) as q:
                a = k.let("a", q + k.tid.x)
                y[0] = tv[a]
    d = e.value.diagnostics[0]
    assert d.message == ("a register array index must be a constant or an expression of "
                         "'unroll' loop variables; 'a' is a 'let' that is not compile-time: "
                         "'%tid.x' is a special register, read when the kernel runs")
    assert d.span.source.name == __file__


def test_a_let_read_as_a_value_too_stays_a_register():
    """Only a let that served as compile-time values alone is dropped when its block ends."""
    text = ptxdsl.print_module(ptxdsl.parse("""
        kernel k(y: ptr<u32>) threads(32) {
            let tv: u32[8] = 0;
            for q in 0 .. 4 unroll {
                let a = q * 2;
                let b = q + 1;
                let unused = q;
                tv[a] = a;
                tv[b] = 1;
            }
            y[0] = tv[7];
        }"""))
    assert "let a: u32 = q * 2;" in text and "tv[q * 2] = a;" in text
    assert "let b" not in text and "tv[q + 1] = 1;" in text
    assert "let unused: u32 = q;" in text  # no index used it: it stays as written
