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
            "gemm_rs"} <= set(FAMILIES)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_default_build_is_the_module_kernel_and_its_text_twin(name):
    fam = FAMILIES[name]
    module = importlib.import_module(f"ptxdsl.kernels.{name}")
    built = fam.build()
    assert built.ir == getattr(module, name).ir
    text = fam.source_text()
    assert text is not None
    assert ptxdsl.parse(text, fam.source).kernels[0] == built.ir
    assert fam.parameters().items() >= fam.defaults.items()
