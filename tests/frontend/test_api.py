"""The Python API: kernels built in Python, errors pointing at the user's own line."""

import inspect

import pytest

import ptxdsl
from ptxdsl import f32, ptr, u32


def this_line() -> int:
    return inspect.currentframe().f_back.f_lineno


def test_python_error_points_at_user_line():
    line = None
    with pytest.raises(ptxdsl.CompileError) as e:
        @ptxdsl.kernel(threads=32)
        def bad(k, a: ptr(f32), n: u32):
            nonlocal line
            x = k.let("x", n + 1)
            line = this_line() + 1
            k.let("y", x + 1.5)  # u32 + float literal
    d = e.value.diagnostics[0]
    assert d.span.source.name == __file__ and d.span.line == line
    text = e.value.render()
    assert 'k.let("y", x + 1.5)' in text and "float literal" in text
    assert "ptxdsl/" not in text.replace(__file__, "")  # no compiler file in a user error


def test_all_python_errors_reported_together():
    with pytest.raises(ptxdsl.CompileError) as e:
        @ptxdsl.kernel(threads=32)
        def bad(k, a: ptr(f32)):
            k.let("x", k.sreg("nope"))
            k.mbarrier("b", count=0)
            a[0] = "text"
    assert len(e.value.diagnostics) == 3


def test_truth_value_of_a_kernel_value_is_an_error():
    with pytest.raises(ptxdsl.CompileError, match="no Python truth value"):
        @ptxdsl.kernel(threads=32)
        def bad(k, n: u32):
            if n > 3:
                pass


def test_missing_annotation_and_threads():
    with pytest.raises(ptxdsl.CompileError, match="needs a ptxdsl type annotation"):
        @ptxdsl.kernel(threads=32)
        def bad(k, n):
            pass
    with pytest.raises(ptxdsl.CompileError, match="needs threads"):
        @ptxdsl.kernel
        def bad2(k):
            pass


def test_else_must_follow_if():
    with pytest.raises(ptxdsl.CompileError, match="else_\\(\\) must directly follow"):
        @ptxdsl.kernel(threads=32)
        def bad(k, n: u32):
            with k.if_(n == 1):
                pass
            k.let("x", 1)
            with k.else_():
                pass


def test_programmatic_kernels_differ_by_parameter():
    def make(nstages: int):
        @ptxdsl.kernel(threads=128, name=f"copy{nstages}")
        def copy(k, src: ptr(f32)):
            k.shared("buf", f32, [nstages, 256])
            k.mbarrier("full", count=1, n=nstages)
        return copy

    a, b = make(2), make(4)
    assert a.name == "copy2" and b.name == "copy4"
    assert a.program().kernels[0].smem_bytes < b.program().kernels[0].smem_bytes
    assert ".entry copy4(" in b.ptx()


def test_compile_takes_paths_whose_names_contain_kernel(tmp_path):
    d = tmp_path / "kernels"
    d.mkdir()
    f = d / "my_kernel.ptxdsl"
    f.write_text("kernel k() threads(32) { }")
    assert ptxdsl.compile(str(f)).kernels[0].name == "k"
