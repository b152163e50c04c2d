"""What the verifier decides with value ranges, congruences, iteration-by-iteration loops and
happens-before inside a role (issue 16), and across a cluster and in-flight wgmmas (issue 25):
every kernel of tests/decided/ (a `.ptxdsl` file, or a `.py` file whose `kernel` the Python
API builds) is compared with the whole rendering of its diagnostics (errors and warnings) in
the `.expected` file next to it; every kernel of tests/decided/valid/ (tricky but correct)
verifies without a diagnostic and runs in the interpreter without an error. A broken kernel
that the interpreter must refuse too says so in a header line, `// interp: <part of the
message>`, and marks the line of the error with `// <- here`. Regenerate the goldens with
`pytest --update-goldens` and review them like code."""

from __future__ import annotations

import os
import re
import runpy
from pathlib import Path

import numpy as np
import pytest

import ptxdsl
from ptxdsl.interp import InterpError, TensorMapModel, run
from ptxdsl.lower import lower
from ptxdsl.verify import verify_module

HERE = Path(__file__).parents[1] / "decided"
BROKEN = sorted([*HERE.glob("*.ptxdsl"), *HERE.glob("*.py")])
VALID = sorted([*(HERE / "valid").glob("*.ptxdsl"), *(HERE / "valid").glob("*.py")])


def kernel_ir(path: Path) -> ptxdsl.ir.Kernel:
    if path.suffix == ".py":
        return runpy.run_path(str(path))["kernel"].ir
    return ptxdsl.parse(path.read_text(), f"decided/{path.name}").kernels[0]


def diagnostics(path: Path) -> list[ptxdsl.errors.Diagnostic]:
    module = lower(ptxdsl.ir.Module(kernels=(kernel_ir(path),)), checks=False)
    try:
        return verify_module(module)
    except ptxdsl.CompileError as e:
        return e.diagnostics


def rendered(path: Path) -> str:
    text = "\n".join(d.render() for d in diagnostics(path)) + "\n"
    for shown in (f"{HERE}/", f"{os.path.relpath(HERE)}/"):  # Python spans name files by path
        text = text.replace(shown, "decided/")
    return text


@pytest.mark.parametrize("path", BROKEN, ids=lambda p: p.name)
def test_broken_kernel_diagnostics(path, update_goldens):
    got = rendered(path)
    golden = path.with_suffix(".expected")
    if update_goldens:
        golden.write_text(got)
    assert got.strip(), f"{path.name}: nothing reported"
    assert got == golden.read_text()


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_correct_kernel_has_no_diagnostic(path):
    assert [d.render() for d in diagnostics(path)] == []


def test_every_rule_has_a_broken_case():
    text = "".join(p.with_suffix(".expected").read_text() for p in BROKEN)
    for part in (
        "global address 'src[row * 1024 + 1]' is never 16-byte aligned",  # congruence
        "shared operand 'tile[r]' is never 16-byte aligned",  # ... of a shared address
        "reaches 4 in iteration 4",  # index range, decided by the iterations
        "(if the loop runs that long)",  # ... and undecided: a warning
        "can reach 4;",  # index range from the CTA shape
        "may reach 4 (the analysis bounds it to 0..4)",  # index range from the domain
        "do not follow the same ring",  # stage and parity
        "the role loops run different numbers of iterations",  # role loop counts
        "nobody waits for that phase before the kernel exits",  # last-iteration copy
        "is read before this iteration waits on",  # read not dominated by its wait
        "is read after this thread released its stage",  # release before read
        "may still be in flight",  # inval under a pending copy
        "may still wait on",  # inval under pending waits
        "before that CTA is known to have started",  # remote access before a cluster barrier
        "but not waited (cluster_wait())",  # ... after an arrive only
        "is not on every path to the access",  # ... on one path only
        "in a loop that may run no iteration",  # ... unless a loop runs: a warning
        "is delivered twice",  # multicast coverage: a race
        "no multicast delivers it there",  # ... stale data
        "expects 128 bytes per phase but receives 256",  # ... a mask naming an unready CTA
        "but the copies of the cluster deliver 128 there",  # ... a CTA left out of a mask
        "which a fresh barrier counts as complete",  # a wait that returns at once
        "names phase 0, already complete",  # ... one phase behind
        "this store writes 'sb' while a wgmma that reads it",  # smem under a pending wgmma
        "this bulk_load writes 'sa' while a wgmma",  # ... a copy into an operand
        "releases the stage of 'sa' while a wgmma",  # ... a hand-written ring's release
        "release(ring) hands the stage back",  # ... a pipeline's release
        "k is 4 in the unrolled iteration kk = 4",  # frag(p, k) past its register array
        "which declares no swizzle",  # a wgmma operand without a layout
        "which differs between the threads of a warpgroup",  # wgmma under a per-warp guard
        "before its cluster_arrive_relaxed(), which orders no memory",  # relaxed publication
        "but the stores before it went to rank 1",  # a remote arrival at the wrong rank
        "of a peer CTA, which that CTA wrote with generic stores",  # reduce into unfenced
        "on which a thread spins with ld_acquire() and then reads memory",  # relaxed flag flip
        "has relaxed order, and its result picks the threads",  # relaxed last-CTA counter
        "releases for the threads this branch picks, but every thread",  # bump before barrier
        "and the boxes of the CTAs with %ctaid.x = 0 and 1 overlap",  # a ragged per-head box
    ):
        assert part in text, part


def reads_its_place(x: object) -> bool:
    """Whether a node (or a tuple of them) reads the CTA's place in the grid."""
    if isinstance(x, tuple):
        return any(reads_its_place(y) for y in x)
    if isinstance(x, ptxdsl.ir.SReg):
        return x.name.startswith(("ctaid.", "clusterid."))
    return isinstance(x, ptxdsl.ir.Node) and any(
        reads_its_place(getattr(x, name)) for name in ptxdsl.ir.node_fields(x))


def tensor_map(path: Path, p: ptxdsl.ir.Param) -> TensorMapModel:
    """Zeros behind tensor map `p`, of the shape and box that a header line of the kernel's
    file names: `// tensor map out: tensor (10, 32), box (64, 32)`."""
    m = re.search(rf"// tensor map {p.name}: tensor \(([\d, ]+)\), box \(([\d, ]+)\)",
                  path.read_text())
    assert m, f"{path.name}: no '// tensor map {p.name}: ...' line"
    shape, box = ([int(x) for x in g.split(",")] for g in m.groups())
    return TensorMapModel(np.zeros(shape, ptxdsl.types.numpy_dtype(p.type.elem)), box=box)


def interpret(path: Path) -> None:
    """Runs the kernel of `path` on two CTAs (or clusters) with `src` random, every other
    pointer zeros (of its element type), every tensor map as its file says and every scalar
    5. A kernel that does not read its
    place in the grid runs on one: two copies of it would store the same elements, a race
    (issue 44, class 9) that is no part of what it shows."""
    k = kernel_ir(path)
    rng = np.random.default_rng(0)
    args: dict[str, object] = {}
    for p in k.params:
        if isinstance(p.type, ptxdsl.types.Ptr):
            args[p.name] = rng.standard_normal(1 << 15).astype(np.float32) \
                if p.name == "src" else np.zeros(1 << 15, ptxdsl.types.numpy_dtype(p.type.elem))
        elif isinstance(p.type, ptxdsl.types.TensorMap):
            args[p.name] = tensor_map(path, p)
        else:
            args[p.name] = 5
    cluster = k.cluster or (1, 1, 1)
    copies = 2 if any(reads_its_place(s) for s in ptxdsl.ir.walk(k.body)) else 1
    run(k, (copies * cluster[0], cluster[1], cluster[2]), args, seed=1)


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_correct_kernel_runs_in_the_interpreter(path):
    """The correct kernels are correct: the interpreter (late, reordered copies) finds no
    deadlock or race in them."""
    interpret(path)


INTERP = [p for p in BROKEN if "// interp: " in p.read_text()]


@pytest.mark.parametrize("path", INTERP, ids=lambda p: p.name)
def test_broken_kernel_fails_in_the_interpreter(path):
    """The interpreter, which runs kernels the verifier has not checked, reports the bug too,
    located at the marked line (never a Python exception)."""
    text = path.read_text()
    part = re.search(r"// interp: (.*\S)", text).group(1)
    line = next(i for i, s in enumerate(text.split("\n"), 1) if s.rstrip().endswith("// <- here"))
    with pytest.raises(InterpError) as e:
        interpret(path)
    assert part in str(e.value)
    assert f"{path.name}:{line}:" in str(e.value)
