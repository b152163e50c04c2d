"""Every sample exists as .ptxdsl text and as Python; both build equal IR and identical PTX."""

import pytest
from conftest import sample_ir, sample_kernel_defs, sample_names, sample_path

import ptxdsl


def test_every_sample_has_a_python_twin():
    for name in sample_names():
        assert sample_path(name, ".py").is_file(), f"{name}.py (the twin) is missing"


@pytest.mark.parametrize("name", sample_names())
def test_twin_builds_equal_ir_and_identical_ptx(name):
    text_module = sample_ir(name)
    defs = sample_kernel_defs(name)
    assert text_module.kernels == tuple(kd.ir for kd in defs)
    from_text = ptxdsl.compile_module(text_module).ptx
    from_py = ptxdsl.compile_module(ptxdsl.ir.Module(kernels=tuple(kd.ir for kd in defs))).ptx
    assert from_text == from_py


def test_ir_equality_ignores_locations_but_not_content():
    a = ptxdsl.parse("kernel k() threads(32) { let x = 1; }")
    b = ptxdsl.parse("kernel k() threads(32) {\n\n    let x = 1;\n}")
    c = ptxdsl.parse("kernel k() threads(32) { let x = 2; }")
    assert a == b and a != c
