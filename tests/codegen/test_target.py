"""Targets as values (`ptxdsl.target`): each architecture's limits, features and pass list;
the lookup and its error; the sm_80 shared-memory limit; and no architecture-name comparison
anywhere else in the package."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

import ptxdsl
from ptxdsl.errors import CompileError
from ptxdsl.lower import STEPS, Emit, emit, lower
from ptxdsl.target import default_target, names, target

PKG = Path(ptxdsl.__file__).parent


def test_limits_and_features_of_each_target():
    a100, h, ha = target("sm_80"), target("sm_90"), target("sm_90a")
    assert (a100.smem_bytes, h.smem_bytes, ha.smem_bytes) == (166912, 232448, 232448)
    assert (a100.max_cluster, ha.portable_cluster, ha.max_cluster) == (1, 8, 16)
    assert a100.mbarrier_max_count == ha.mbarrier_max_count == (1 << 20) - 1
    assert a100.features == frozenset()
    assert ha.features == {"tma", "wgmma", "clusters", "multicast", "setmaxnreg", "elect",
                           "griddepcontrol", "fp8_cvt"}
    assert ha.features - h.features == {"wgmma", "multicast", "setmaxnreg"}
    assert a100.jit and not ha.jit
    assert names() == ["sm_80", "sm_90", "sm_90a"]


@pytest.mark.parametrize("name", names())
def test_each_pass_list_names_known_steps_and_ends_with_the_emitter(name):
    passes = target(name).passes
    assert all(p in STEPS for p in passes), passes
    assert isinstance(STEPS[passes[-1]], Emit)
    assert not any(isinstance(STEPS[p], Emit) for p in passes[:-1])


def test_sm80_rewrites_after_the_hopper_passes():
    assert target("sm_80").passes == ("turns", "pipelines", "verify", "sm80", "verify_sm80",
                                      "emit")
    assert target("sm_90a").passes == ("turns", "pipelines", "verify", "emit")


def test_an_unknown_target_lists_the_known_ones():
    for call in (lambda: target("sm_75"), lambda: ptxdsl.compile(ADD, arch="sm_75")):
        with pytest.raises(CompileError) as e:
            call()
        assert e.value.render() == ("error: unknown target 'sm_75'; the targets are sm_80, "
                                    "sm_90, sm_90a")


def test_a_compile_naming_no_target_takes_sm90a_only_for_what_sm90_lacks():
    assert default_target(frozenset()).name == "sm_90"
    assert default_target(frozenset({"tma", "clusters"})).name == "sm_90"
    for feature in ("wgmma", "setmaxnreg", "multicast"):
        assert default_target(frozenset({feature})).name == "sm_90a"


ADD = """\
kernel add(a: ptr<f32>) threads(32) {
    a[%tid.x] = a[%tid.x] + 1.0;
}
"""


def test_a_new_target_is_one_value():
    """A target the package does not know (here a made-up sm_100a with Hopper's passes) runs
    the same steps with no change to them, and heads its PTX with its own name."""
    new = dataclasses.replace(target("sm_90a"), name="sm_100a", ptx_version=(8, 6))
    ptx = emit(lower(ptxdsl.parse(ADD), new), new).ptx
    assert ".version 8.6\n.target sm_100a\n" in ptx and ".entry add(" in ptx


BIG = """\
kernel big(out: ptr<u32>) threads(128) {
    shared buf: u32[45000];
    buf[%tid.x] = %tid.x;
    bar_sync(0);
    out[%tid.x] = buf[127 - %tid.x];
}
"""


def test_sm80_is_held_to_the_a100s_shared_memory():
    """180 000 bytes fit an H100's CTA but not an A100's (166 912 with the opt-in)."""
    assert ".target sm_90\n" in ptxdsl.compile(BIG, arch="sm_90").ptx
    with pytest.raises(CompileError) as e:
        ptxdsl.compile_module(ptxdsl.parse(BIG, "big.ptxdsl"), arch="sm_80")
    assert e.value.render() == (
        "big.ptxdsl:1:8: error: kernel 'big' needs 180112 bytes of shared memory (layout "
        "180000 plus alignment slack); a CTA has at most 166912 on sm_80\n"
        "kernel big(out: ptr<u32>) threads(128) {\n"
        "       ^~~")


# ----------------------------------------------------------------------------- no arch names

# an architecture's name as a whole string: "sm_80", "sm_90a", "sm_100f"
_ARCH_NAME = re.compile(r"sm_\d+[a-z]?")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _names_arch(node: ast.AST) -> bool:
    """A name or attribute called `arch` (or `*_arch`): an architecture held as a string."""
    name = node.id if isinstance(node, ast.Name) else \
        node.attr if isinstance(node, ast.Attribute) else ""
    return name == "arch" or name.endswith("_arch")


def _is_none_test(node: ast.Compare) -> bool:
    """`arch is None`: whether one was named, not which."""
    return all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops) and \
        all(isinstance(x, ast.Constant) and x.value is None for x in node.comparators)


def arch_comparisons(source: str) -> list[tuple[int, str]]:
    """(line, what) for each place a module compares architecture names or spells one: a
    string that is an architecture's name (a table key, a default, an operand), or a
    comparison with an `arch` value."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                id(node) not in docs and _ARCH_NAME.fullmatch(node.value):
            found.append((node.lineno, f"the architecture name {node.value!r}"))
        elif isinstance(node, ast.Compare) and not _is_none_test(node) and \
                any(_names_arch(x) for x in (node.left, *node.comparators)):
            found.append((node.lineno, "a comparison of an arch value"))
    return found


def test_the_scan_finds_architecture_comparisons():
    assert arch_comparisons('if arch == "sm_80":\n    pass\n') != []
    assert arch_comparisons("x = info.arch != other\n") != []
    assert arch_comparisons('LIMIT = {"sm_90a": 232448}\n') != []
    assert arch_comparisons('def f(arch: str = "sm_90a"): ...\n') != []
    assert arch_comparisons('"""Ampere (sm_80) copies."""\nmsg = f"compiled for {t.name}"\n'
                            'if arch is None:\n    pass\n') == []


def test_no_module_outside_target_compares_architectures():
    found = [f"{path.relative_to(PKG.parent)}:{line}: {what}"
             for path in sorted(PKG.rglob("*.py")) if path != PKG / "target.py"
             for line, what in arch_comparisons(path.read_text())]
    assert found == [], "ask ptxdsl.target's flags and limits instead:\n" + "\n".join(found)


# ----------------------------------------------------------------------------- features

ROLES = """\
kernel roles(out: ptr<u32>) threads(256) {
    role producer warps 0 .. 4 regs 40 {
        out[%tid.x] = 1;
    }
    role consumer warps 4 .. 8 regs 232 {
        out[%tid.x] = 2;
    }
}
"""


def test_setmaxnreg_on_sm90_is_a_located_error():
    """A role's register count is setmaxnreg, which PTX reserves for sm_90a: named there
    rather than left to ptxas. A compile naming no target picks sm_90a for it."""
    assert ".target sm_90a\n" in ptxdsl.compile(ROLES).ptx
    with pytest.raises(CompileError) as e:
        ptxdsl.compile_module(ptxdsl.parse(ROLES, "roles.ptxdsl"), arch="sm_90")
    assert e.value.render() == (
        "roles.ptxdsl:2:10: error: this role's register count (setmaxnreg.dec 40) needs the "
        "sm_90a target (its setmaxnreg feature), but the module is compiled for sm_90\n"
        "    role producer warps 0 .. 4 regs 40 {\n"
        "         ^~~~~~~~")


MULTICAST = (Path(__file__).parents[2] / "samples" / "multicast_pipeline.ptxdsl").read_text()


def test_a_multicast_copy_on_sm90_is_a_located_error():
    with pytest.raises(CompileError) as e:
        ptxdsl.compile_module(ptxdsl.parse(MULTICAST, "mc.ptxdsl"), arch="sm_90")
    first = e.value.render().splitlines()[0]
    assert first == ("mc.ptxdsl:19:17: error: tma_load_multicast needs the sm_90a target (its "
                     "multicast feature), but the module is compiled for sm_90")


def test_a_cluster_on_a_target_without_clusters_is_a_located_error():
    """`Target.clusters` is asked, not the target's name: a made-up target with Hopper's
    passes and no clusters refuses a clustered kernel at the kernel."""
    flat = dataclasses.replace(target("sm_90a"), name="sm_flat", clusters=False)
    with pytest.raises(CompileError) as e:
        emit(lower(ptxdsl.parse(MULTICAST, "mc.ptxdsl"), flat), flat)
    assert e.value.render().splitlines()[0] == (
        "mc.ptxdsl:10:8: error: kernel 'multicast_pipeline' with its cluster of 4 CTAs needs "
        "the sm_90 or sm_90a target (its clusters feature), but the module is compiled for "
        "sm_flat")
