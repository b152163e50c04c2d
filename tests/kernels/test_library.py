"""The kernel library's registry (no GPU): every family's default build is the kernel its
module and its shipped text twin define, and its parameters list the defaults."""

from __future__ import annotations

import importlib

import pytest

import ptxdsl
from ptxdsl.kernels import families

FAMILIES = families()


def test_the_production_families_are_in_the_library():
    assert {"gemm", "gemm_splitk", "gemm_fp8", "grouped_gemm", "attention", "ag_gemm",
            "gemm_rs", "norms", "longrow"} <= set(FAMILIES)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_default_build_is_the_module_kernel_and_its_text_twin(name):
    """The default build is the kernel of that name in the module or in the shipped text, if
    the family has one (in each that defines it, the same kernel), and its parameters list
    the defaults."""
    fam = FAMILIES[name]
    module = importlib.import_module(f"ptxdsl.kernels.{name}")
    built = fam.build()
    in_module = {v.name: v for v in vars(module).values() if isinstance(v, ptxdsl.KernelDef)}
    text = fam.source_text()  # None: a family built with the Python API only
    in_text = {} if text is None else \
        {k.name: k for k in ptxdsl.parse(text, fam.source).kernels}
    assert built.name in in_module.keys() | in_text.keys(), \
        f"{name}'s default build {built.name} is in neither its module nor {fam.source}"
    if built.name in in_module:
        assert built.ir == in_module[built.name].ir
    if built.name in in_text:
        assert in_text[built.name] == built.ir
    assert fam.parameters().items() >= fam.defaults.items()
    assert ".entry " + built.name in built.ptx()
