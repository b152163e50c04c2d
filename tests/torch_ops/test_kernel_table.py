"""The torch ops' kernel table (ptxdsl.torch.kernels) without torch, as CI's wheel check and a
machine without torch import it: the norms' forms and load widths, and one masked and one
two-sweep recipe built to PTX."""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import pytest

import ptxdsl


@pytest.fixture
def table(monkeypatch):
    """ptxdsl.torch.kernels under a bare ptxdsl.torch package (its __init__ imports torch to
    register the ops); sys.modules is restored afterwards."""
    pkg = types.ModuleType("ptxdsl.torch")
    pkg.__path__ = [str(Path(ptxdsl.__file__).parent / "torch")]
    monkeypatch.setitem(sys.modules, "ptxdsl.torch", pkg)
    # remembers whatever ptxdsl.torch.kernels was (or its absence) for the undo, then drops it
    monkeypatch.setitem(sys.modules, "ptxdsl.torch.kernels", None)
    monkeypatch.delitem(sys.modules, "ptxdsl.torch.kernels")
    had_torch = "torch" in sys.modules
    module = importlib.import_module("ptxdsl.torch.kernels")
    assert had_torch or "torch" not in sys.modules, "ptxdsl.torch.kernels imported torch"
    return module


@pytest.mark.parametrize("n, dtype, form", [
    (8192, "bf16", "make_norm_row"), (1000, "bf16", "make_norm_masked"),
    (1001, "f32", "make_norm_masked"), (128256, "bf16", "make_norm_loop"),
    (151936, "f32", "make_norm_loop")])
def test_the_form_follows_the_row_length(table, n, dtype, form):
    elem = ptxdsl.types.SCALARS[dtype]
    vec = table.norm_width(n, elem)
    recipe = table.norm_recipe("rmsnorm", n, elem, 1e-5, vec, table.norm_configs(n, elem)[0])
    assert recipe.factory == form


def test_misaligned_tensors_take_narrower_loads(table):
    assert table.norm_width(1000, ptxdsl.bf16, (256, 4096)) == 8
    assert table.norm_width(1000, ptxdsl.bf16, (256, 4098)) == 1  # 2 bytes past a 16-byte edge
    assert table.norm_width(1000, ptxdsl.f32, (8, 16)) == 2
    assert table.norm_width(1001, ptxdsl.f32, (256,)) == 1


@pytest.mark.parametrize("kind, n, dtype, form", [
    ("layernorm", 1000, "bf16", "make_norm_masked"), ("softmax", 128256, "f32", "make_norm_loop")])
def test_a_masked_and_a_two_sweep_recipe_build(table, kind, n, dtype, form):
    elem = ptxdsl.types.SCALARS[dtype]
    vec = table.norm_width(n, elem)
    config = table.norm_configs(n, elem, vec)[-1]
    recipe = table.norm_recipe(kind, n, elem, 1e-5, vec, config)
    assert recipe.factory == form
    ptx = recipe.build().ptx("sm_90a")
    assert f".reqntid {32 * config['warps']}, 1, 1" in ptx


def test_the_gemm_ops_split_k_builds(table):
    """The gemm op's split-K candidates (the slot form) and the slots' reduction build to PTX
    from the table alone, as CI's wheel check builds them."""
    for c in table.SPLITK_CONFIGS:
        recipe = table.splitk_recipe(c["stages"], c["cluster"])
        assert dict(recipe.kwargs)["slots"] is True
        assert ".entry gemm_splitk_slots(" in table.splitk_kernel(c["stages"], c["cluster"]).ptx(
            "sm_90a")
    assert ".entry splitk_reduce(" in table.splitk_reduce_kernel().ptx("sm_90a")
