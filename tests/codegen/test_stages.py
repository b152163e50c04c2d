"""PTXDSL_DUMP=DIR: every stage of every compile, from the CLI and the Python API, one file
per kernel per stage in pass order; nothing printed when it is unset."""

from __future__ import annotations

import pytest
from conftest import SAMPLES, cli

import ptxdsl
import ptxdsl.lower.dump
from ptxdsl.lower import lower
from ptxdsl.printer import print_kernel, print_module

TWO = """\
kernel first(a: ptr<f32>) threads(32) {
    a[%tid.x] = a[%tid.x] + 1.0;
}

kernel second(a: ptr<u32>, n: u32) threads(64) {
    shared s: u32[64];
    s[%tid.x] = n;
    bar_sync(0);
    a[%tid.x] = s[63 - %tid.x];
}
"""


def test_cli_dumps_every_stage_of_the_target(tmp_path, monkeypatch):
    out = tmp_path / "dump"
    monkeypatch.setenv("PTXDSL_DUMP", str(out))
    ptx = tmp_path / "p.ptx"
    r = cli("compile", "samples/pipeline.ptxdsl", "--arch", "sm_80", "-o", str(ptx))
    assert r.returncode == 0, r.stderr
    stem = "pipeline_sum.sm_80"
    assert sorted(p.name for p in out.iterdir()) == [
        f"{stem}.00-source.ptxdsl", f"{stem}.01-turns.ptxdsl", f"{stem}.02-pipelines.ptxdsl",
        f"{stem}.03-verify.ptxdsl", f"{stem}.04-sm80.ptxdsl", f"{stem}.05-verify_sm80.ptxdsl",
        f"{stem}.06-emit.ptx"]
    module = ptxdsl.parse_file(SAMPLES / "pipeline.ptxdsl")
    assert (out / f"{stem}.00-source.ptxdsl").read_text() == print_module(module)
    for n, step in ((1, "turns"), (2, "pipelines"), (4, "sm80")):
        after = cli("compile", "samples/pipeline.ptxdsl", "--emit", "ir", "--arch", "sm_80",
                    "--after", step).stdout
        assert (out / f"{stem}.0{n}-{step}.ptxdsl").read_text() == after
    assert "cp_async_cg(" in (out / f"{stem}.04-sm80.ptxdsl").read_text()
    assert (out / f"{stem}.06-emit.ptx").read_text() == ptx.read_text()


def test_python_api_dumps_each_kernel_apart(tmp_path, monkeypatch):
    monkeypatch.setenv("PTXDSL_DUMP", str(tmp_path))
    prog = ptxdsl.compile(TWO)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"{k}.sm_90.{s}" for k in ("first", "second") for s in (
        "00-source.ptxdsl", "01-turns.ptxdsl", "02-pipelines.ptxdsl", "03-verify.ptxdsl",
        "04-emit.ptx")]
    first = (tmp_path / "first.sm_90.04-emit.ptx").read_text()
    second = (tmp_path / "second.sm_90.04-emit.ptx").read_text()
    assert ".entry first(" in first and ".entry second(" not in first
    assert ".entry second(" in second and ".entry first(" not in second
    head = prog.ptx[:prog.ptx.index(".visible .entry")]
    assert first.startswith(head) and second.startswith(head)
    assert prog.ptx == head + first[len(head):] + second[len(head):]
    lowered = lower(ptxdsl.parse(TWO)).kernels[1]
    assert (tmp_path / "second.sm_90.02-pipelines.ptxdsl").read_text() == print_kernel(lowered)


def test_kerneldef_ptx_dumps_under_the_target_it_ends_on(tmp_path, monkeypatch):
    """A compile that names no target is named after the one it picks (sm_90a for
    setmaxnreg), in every stage's file."""
    monkeypatch.setenv("PTXDSL_DUMP", str(tmp_path))
    from ptxdsl import u32

    @ptxdsl.kernel(threads=256, maxnreg=128, name="regs")
    def regs(k, out: ptxdsl.ptr(u32)):
        with k.role("low", 0, 4, regs=40):
            pass
        with k.role("high", 4, 8, regs=232):
            out[k.tid.x] = k.tid.x

    ptx = regs.ptx()
    assert ".target sm_90a" in ptx
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files and all(f.startswith("regs.sm_90a.") for f in files), files
    assert "setmaxnreg_inc(232);" in (tmp_path / "regs.sm_90a.02-pipelines.ptxdsl").read_text()
    assert (tmp_path / "regs.sm_90a.04-emit.ptx").read_text() == ptx


def test_stages_before_a_failing_pass_are_written(tmp_path, monkeypatch):
    monkeypatch.setenv("PTXDSL_DUMP", str(tmp_path))
    bad = (SAMPLES / "multicast_pipeline.ptxdsl").read_text()
    with pytest.raises(ptxdsl.CompileError, match="sm_80"):
        ptxdsl.compile(bad, arch="sm_80")
    steps = {p.name.split(".")[-2] for p in tmp_path.iterdir()}
    assert {"00-source", "01-turns", "02-pipelines", "03-verify"} <= steps
    assert not any(s.endswith(("sm80", "emit")) for s in steps)


def test_nothing_is_printed_without_ptxdsl_dump(monkeypatch):
    def fail(_k):
        raise AssertionError("printed a stage with PTXDSL_DUMP unset")

    monkeypatch.delenv("PTXDSL_DUMP", raising=False)
    monkeypatch.setattr(ptxdsl.lower.dump, "print_kernel", fail)
    assert ".entry first(" in ptxdsl.compile(TWO).ptx
