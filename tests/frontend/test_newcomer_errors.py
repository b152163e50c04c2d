"""The mistakes a newcomer makes (habits from C, CUDA and Python; types mixed; compile-time
values; barriers), each compared as its whole rendering: what was expected, what was found,
and what to write where there is one obvious fix. Cases: tests/errors/newcomer.ptxdsl."""

import inspect
from pathlib import Path

import pytest
from test_errors import SEP, cases, render

import ptxdsl

HERE = Path(__file__).parents[1] / "errors"


def test_newcomer_error_golden(update_goldens):
    src = HERE / "newcomer.ptxdsl"
    rendered = f"\n{SEP}\n".join(render(c, src.name) for c in cases(src)) + "\n"
    golden = HERE / "newcomer.expected"
    if update_goldens:
        golden.write_text(rendered)
    assert rendered == golden.read_text()
    assert "(no error)" not in rendered
    # one message per mistake: no case cascades
    assert "errors generated" not in rendered


def test_python_api_hints_are_spelled_in_python():
    with pytest.raises(ptxdsl.CompileError) as e:
        @ptxdsl.kernel(threads=32)
        def k(k, x: ptxdsl.ptr(ptxdsl.f32), n: ptxdsl.u32):
            h = k.let("h", 2.0)
            x[0] = h * n
    line = inspect.currentframe().f_lineno - 1
    head, _, rest = e.value.render().partition(f":{line}:20: ")
    assert head.endswith("test_newcomer_errors.py")  # the user's own line, however it is named
    assert rest == (
        "error: operands of '*' have different types: f32 and u32; convert one: "
        "n.to(ptxdsl.f32)\n"
        "            x[0] = h * n\n"
        "                   ^~~~~")


def test_python_api_unknown_function_says_the_closest_and_the_math_functions():
    with pytest.raises(AttributeError) as e:
        @ptxdsl.kernel(threads=32)
        def k(k, x: ptxdsl.ptr(ptxdsl.f32)):
            x[0] = k.sigmod(x[1])
    assert str(e.value) == (
        "ptxdsl kernels have no 'sigmod'; did you mean 'sigmoid'? (the math functions: cos ex2 "
        "exp exp2 gelu lg2 log log2 rcp rsqrt sigmoid silu sin sqrt tanh)")
