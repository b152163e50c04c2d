"""Inline functions of the text language (`fn`): built again at each call, typed, with
register arrays by reference and `const` parameters; located errors at the call and in the
body, each body error with a note at the call that inlined it."""

import numpy as np
import pytest

import ptxdsl
from ptxdsl.compiler import compile_module
from ptxdsl.interp import run

# A bitonic sort of the 8 values each thread holds: the compare-exchange is a function of
# the array (by reference) and two compile-time indices; the index arithmetic another.
SORT = """
const N = 8;

fn first(q: u32, j: u32) -> u32 {
    return q / j * (2 * j) + q % j;
}

fn exchange(tv: u32[N], const a: u32, const b: u32, up: pred) {
    let lo = min(tv[a], tv[b]);
    let hi = max(tv[a], tv[b]);
    tv[a] = select(up, lo, hi);
    tv[b] = select(up, hi, lo);
}

kernel sort8(x: ptr<u32>, y: ptr<u32>) threads(32) {
    let tv: u32[N];
    for i in 0 .. N unroll { tv[i] = x[%tid.x * N + i]; }
    for s in 0 .. 3 unroll {
        for t in 0 .. 3 unroll {
            if t <= s {
                for q in 0 .. N / 2 unroll {
                    let j = max((1 << s) >> t, 1);
                    let a = first(q, j);
                    exchange(tv, a, a + j, ((a >> (s + 1)) & 1) == 0);
                }
            }
        }
    }
    for i in 0 .. N unroll { y[%tid.x * N + i] = tv[i]; }
}
"""


def test_a_sort_written_with_functions_runs():
    x = np.random.default_rng(5).integers(0, 1000, 32 * 8, dtype=np.uint32)
    y = np.zeros_like(x)
    run(ptxdsl.parse(SORT).kernels[0], 1, {"x": x, "y": y})
    np.testing.assert_array_equal(y.reshape(32, 8), np.sort(x.reshape(32, 8), axis=1))


def test_compile_time_arguments_index_registers_directly():
    """Each exchange reads its two registers: 9 (s, t) copies of 4, no indexed access (an
    index known only when the kernel runs would need local memory)."""
    ptx = compile_module(ptxdsl.parse(SORT)).ptx
    assert ptx.count("min.u32") == ptx.count("max.u32") == 36
    assert ".local" not in ptx


def test_inlined_kernels_print_and_parse_back():
    m = ptxdsl.parse(SORT)
    assert ptxdsl.parse(ptxdsl.print_module(m)) == m


def test_values_arrays_and_const_parameters():
    m = ptxdsl.parse("""
        fn sq(x: f32) -> f32 { let y = x * x; return y; }
        fn fill(tv: f32[4], v: f32) { for i in 0 .. 4 unroll { tv[i] = v; } v = 0.0; }
        fn sum(const n: u32, tv: f32[n]) -> f32 {
            let s: f32 = 0.0;
            for i in 0 .. n unroll { s += tv[i]; }
            return s;
        }
        kernel k(y: ptr<f32>) threads(1) {
            let tv: f32[4];
            let v: f32 = 1.5;
            fill(tv, sq(v));
            y[0] = sum(4, tv) + sq(2.0);
            y[1] = v;
        }""")
    y = np.zeros(2, np.float32)
    run(m.kernels[0], 1, {"y": y})
    assert y.tolist() == [4 * 2.25 + 4.0, 1.5]  # `v = 0.0` in fill changed its copy only


def test_calls_inside_functions_and_names_that_match_the_callers():
    m = ptxdsl.parse("""
        fn twice(x: u32) -> u32 { return x + x; }
        fn quad(x: u32) -> u32 { let y = twice(x); return twice(y); }
        kernel k(y: ptr<u32>) threads(1) {
            let x: u32 = 3;
            let y2 = quad(x) + quad(1);
            y[0] = y2 + x;
        }""")
    y = np.zeros(1, np.uint32)
    run(m.kernels[0], 1, {"y": y})
    assert y[0] == 12 + 4 + 3


def errors(text: str) -> str:
    with pytest.raises(ptxdsl.CompileError) as e:
        ptxdsl.parse(text, "f.ptxdsl")
    return e.value.render()


def test_a_body_error_names_the_source_name_and_the_call_once():
    assert errors("""fn scale(x: f32, k: u32) -> f32 {
    return x * k;
}
kernel k(y: ptr<f32>) threads(1) {
    y[0] = scale(1.0, 2) + scale(2.0, 3);
}""") == """\
f.ptxdsl:2:12: error: operands of '*' have different types: f32 and u32; convert one: \
k as f32
    return x * k;
           ^~~~~
f.ptxdsl:5:12: note: in this call of 'scale'
    y[0] = scale(1.0, 2) + scale(2.0, 3);
           ^~~~~~~~~~~~~"""


def test_a_name_of_the_caller_is_not_seen_in_the_body():
    assert errors("""fn f(x: u32) -> u32 {
    return x + offs;
}
kernel k(y: ptr<u32>) threads(1) {
    let offs: u32 = 4;
    y[0] = f(1);
}""") == """\
f.ptxdsl:2:16: error: unknown name 'offs' in function 'f' (a function sees its parameters, \
its own names and the file's constants; pass 'offs' as an argument)
    return x + offs;
               ^~~~
f.ptxdsl:6:12: note: in this call of 'f'
    y[0] = f(1);
           ^~~~"""


def test_nested_calls_give_a_note_per_call():
    text = errors("""fn inner(x: u32) -> u32 { return x + vlaue; }
fn outer(value: u32) -> u32 { return inner(value); }
kernel k(y: ptr<u32>) threads(1) { y[0] = outer(1); }""")
    assert text.splitlines()[0] == ("f.ptxdsl:1:38: error: unknown name 'vlaue' in function "
                                    "'inner'")
    assert [line for line in text.splitlines() if "note" in line] == [
        "f.ptxdsl:2:38: note: in this call of 'inner'",
        "f.ptxdsl:3:43: note: in this call of 'outer'"]


@pytest.mark.parametrize("call,message", [
    ("f(1)", "f.ptxdsl:4:12: error: function 'f' takes 2 argument(s) (x, tv), got 1"),
    ("f(fv, tv)", "f.ptxdsl:4:14: error: argument 'x' of 'f' is declared u32, got f32"),
    ("f(1, tw)", "f.ptxdsl:4:17: error: argument 'tv' of 'f' is declared u32[4], got 'tw' "
                 "of type u32[2]"),
    ("f(1, 3)", "f.ptxdsl:4:17: error: argument 'tv' of 'f' is a register array u32[4]; this "
                "is not one"),
    ("ff(1, tv)", "f.ptxdsl:4:12: error: unknown function 'ff'; did you mean 'f' (a function "
                  "of this file)?"),
])
def test_call_errors_are_at_the_call(call, message):
    text = errors(f"""fn f(x: u32, tv: u32[4]) -> u32 {{ return x + tv[0]; }}
kernel k(y: ptr<u32>) threads(1) {{ let tv: u32[4] = 0; let tw: u32[2] = 0;
    let fv: f32 = 1.0;
    y[0] = {call};
}}""")
    assert text.splitlines()[0] == message


def test_a_const_parameter_needs_a_compile_time_argument():
    assert errors("""fn get(tv: u32[4], const i: u32) -> u32 { return tv[i]; }
kernel k(y: ptr<u32>) threads(1) {
    let tv: u32[4] = 0;
    y[0] = get(tv, %tid.x);
}""") == """\
f.ptxdsl:4:20: error: argument 'i' of 'get' is 'const', a compile-time value: it may use \
constants, compile-time parameters and 'unroll' loop variables; '%tid.x' is a special \
register, read when the kernel runs
    y[0] = get(tv, %tid.x);
                   ^~~~~~
f.ptxdsl:1:20: note: parameter 'i' of 'get' is declared here
fn get(tv: u32[4], const i: u32) -> u32 { return tv[i]; }
                   ^~~~~~~~~~~~"""


def test_recursion_is_refused_with_its_path():
    text = errors("""fn a(x: u32) -> u32 { return b(x); }
fn b(x: u32) -> u32 { return a(x); }
kernel k(y: ptr<u32>) threads(1) { y[0] = a(1); }""")
    assert text.splitlines()[0] == ("f.ptxdsl:2:30: error: function 'a' calls itself "
                                    "(a -> b -> a); functions are inlined, so they cannot "
                                    "recurse")


@pytest.mark.parametrize("source,message", [
    ("fn f(x: u32) -> u32 { let y = x; }",
     "f.ptxdsl:1:23: error: function 'f' returns a value, so its body ends with "
     "'return value;'"),
    ("fn f(x: u32) -> u32 { if x > 1 { return 1; } return x; }",
     "f.ptxdsl:1:34: error: 'return' in function 'f': a function returns its value at its "
     "end, with one 'return value;'"),
    ("fn f(x: u32) { return; }",
     "f.ptxdsl:1:16: error: 'return' in function 'f': a function without '-> type' ends at "
     "its last statement (in a kernel, 'return;' ends the thread)"),
    ("fn f(x: u32) { shared s: u32[4]; }",
     "f.ptxdsl:1:16: error: a function cannot contain this: shared memory is declared in the "
     "kernel; declare it there and pass what the function needs"),
    ("fn f(x: u32, x: f32) { }",
     "f.ptxdsl:1:14: error: function 'f' has two parameters named 'x'"),
    ("fn exp(x: f32) { }", "f.ptxdsl:1:4: error: 'exp' is a built-in name; name the function "
                           "otherwise"),
    ("fn f() { } fn f() { }", "f.ptxdsl:1:15: error: function 'f' is defined twice"),
])
def test_definition_errors_are_reported_once_without_a_call(source, message):
    text = errors(source + "\nkernel k() threads(1) { }")
    assert text.splitlines()[0] == message
    assert "error" not in "\n".join(text.splitlines()[1:]).replace("errors generated", "")


@pytest.mark.parametrize("body,message", [
    ("while f(1) > 0 { }", "f.ptxdsl:2:42: error: a function call in a 'while' condition "
                           "would run once, before the loop; compute it in the loop's body"),
    ("g(1);", None),
    ("f(1);", None),  # a value dropped
    ("let v = g(1);", "f.ptxdsl:2:44: error: function 'g' returns no value (it has no "
                      "'-> type')"),
    ("return 1;", "f.ptxdsl:2:36: error: a kernel returns no value ('return value;' ends a "
                  "function)"),
])
def test_calls_where_they_cannot_be(body, message):
    text = f"""fn f(x: u32) -> u32 {{ return x; }} fn g(x: u32) {{ }}
kernel k(y: ptr<u32>) threads(1) {{ {body} }}"""
    if message is None:
        ptxdsl.parse(text)
    else:
        assert errors(text).splitlines()[0] == message


def test_a_body_cannot_declare_a_built_in_name():
    text = errors("""fn f(x: u32) -> u32 { let min = x; return x; }
kernel k(y: ptr<u32>) threads(1) { y[0] = f(1); }""")
    assert text.splitlines()[0] == ("f.ptxdsl:1:23: error: 'min' is a built-in name and cannot "
                                    "be declared")


def test_a_body_cannot_declare_a_parameter_or_a_file_constant_again():
    assert errors("""fn f(x: u32) -> u32 { let x = 1; return x; }
kernel k(y: ptr<u32>) threads(1) { y[0] = f(1); }""") == """\
f.ptxdsl:1:23: error: 'x' is already declared
fn f(x: u32) -> u32 { let x = 1; return x; }
                      ^~~~~~~~~~
f.ptxdsl:1:6: note: 'x' was declared here
fn f(x: u32) -> u32 { let x = 1; return x; }
     ^~~~~~
f.ptxdsl:2:43: note: in this call of 'f'
kernel k(y: ptr<u32>) threads(1) { y[0] = f(1); }
                                          ^~~~"""
    assert errors("""const N = 4;
fn f(x: u32) -> u32 { let N = x; return N; }
kernel k(y: ptr<u32>) threads(1) { y[0] = f(1); }""").splitlines()[0] == \
        "f.ptxdsl:2:23: error: 'N' is already declared"
