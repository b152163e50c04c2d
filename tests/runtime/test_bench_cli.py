"""The benchmarks' command line and results page without a GPU or torch: every bench module
imports and parses its arguments, the page writer and the timing helpers work on synthetic
numbers, BENCHMARKS.md is in the format the generator writes, and `import ptxdsl` never
imports torch."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
from conftest import ROOT

from bench import common, gpu_runs
from bench.__main__ import WORKLOADS, defaults, main, parser, write_page
from bench.common import Row, Section

MODULES = sorted(p.stem for p in (ROOT / "bench").glob("*.py"))
PROFILES = [m for m in MODULES if m.startswith("profile_")]


def test_bench_holds_every_benchmark_and_samples_only_kernels():
    assert {"common", "refs", "__main__", "copies", "norms", "gemm", "splitk"} <= set(MODULES)
    leftovers = [p.name for p in (ROOT / "samples").iterdir()
                 if p.name.startswith(("bench", "profile")) or p.suffix == ".c"]
    assert leftovers == []


@pytest.mark.parametrize("name", MODULES)
def test_every_bench_module_imports_without_torch(name):
    importlib.import_module(f"bench.{name}")


def test_import_ptxdsl_never_imports_torch_or_matplotlib():
    code = ("import sys, ptxdsl, ptxdsl.runtime, ptxdsl.kernels, bench.common, bench.__main__; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "assert 'matplotlib' not in sys.modules, 'matplotlib imported'")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("name", [*WORKLOADS, "all", "gpu-tests"])
def test_every_workload_parses_and_has_help(name, capsys):
    with pytest.raises(SystemExit) as e:
        parser().parse_args([name, "--help"])
    assert e.value.code == 0
    assert "usage: python -m bench " + name in capsys.readouterr().out
    if name in WORKLOADS:
        a = defaults(name)
        assert a.workload == name and a.out is None


def test_workload_options_parse():
    a = parser().parse_args(["norms", "--kind", "softmax", "--dtype", "f32", "--batch", "1"])
    assert (a.kind, a.dtype, a.batch, a.sweep) == ("softmax", "f32", 1, False)
    assert parser().parse_args(["cluster-gemm"]).cluster is True
    assert parser().parse_args(["gemm", "--shape", "128x256x64"]).cluster is False
    with pytest.raises(SystemExit):
        parser().parse_args(["nonesuch"])


@pytest.mark.parametrize("name", PROFILES)
def test_profile_scripts_parse_their_arguments(name, capsys):
    mod = importlib.import_module(f"bench.{name}")
    with pytest.raises(SystemExit) as e:
        mod.main(["--help"])
    assert e.value.code == 0 and f"python -m bench.{name}" in capsys.readouterr().out


def test_sweeps_and_weight_shapes_are_checked():
    from bench.attention import sweep
    from bench.decode_gemm import weight_shapes

    assert sweep("512,1024", "64") == [(64, 512, False), (64, 1024, False), (64, 512, True),
                                       (64, 1024, True)]
    assert weight_shapes("4096x4096,28672x4096") == [(4096, 4096), (28672, 4096)]
    with pytest.raises(common.BenchError, match="--seqlens"):
        sweep("512,x", "64")
    with pytest.raises(common.BenchError, match="NxK"):
        weight_shapes("4096")


def test_decode_attention_cases_are_checked():
    from bench.decode_attention import CASES, label, parse_case

    assert parse_case("64,1,4096,16,32,8,128") == (64, 1, 4096, 16, 32, 8, 128)
    assert label((1, 1, 131072, 0, 32, 8, 128)).startswith("1 x 1 tok, cache 131072, contig")
    assert len({parse_case(c) for c in CASES}) == len(CASES) >= 8
    for bad, words in (("64,1,4096", "seven integers"), ("64,1,4000,64,32,8,128", "whole pages"),
                       ("1,1,64,0,32,6,128", "KVH dividing H"), ("a,1", "as integers")):
        with pytest.raises(common.BenchError, match=words):
            parse_case(bad)


def test_gemm_shapes_are_checked():
    from bench.gemm import shapes

    assert shapes("1x2x3,4x5x6") == [(1, 2, 3), (4, 5, 6)]
    with pytest.raises(common.BenchError, match="MxNxK"):
        shapes("1x2")


# ----------------------------------------------------------------------------- helpers


def test_ratio_counts_the_right_way_for_each_unit():
    assert common.ratio(4000, 3200, "GB/s") == pytest.approx(1.25)
    assert common.ratio(800, 1000, "TFLOP/s") == pytest.approx(0.8)
    assert common.ratio(4.0, 5.0, "us") == pytest.approx(1.25)  # fewer microseconds: ahead
    assert common.ratio(40.0, 30.0, "ms") == pytest.approx(0.75)


def test_interleaved_warms_up_takes_turns_rotates_and_keeps_each_best_round():
    calls, warmed = [], []
    times = {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 6.0, 4.0])}

    def timer(fn, reps, batch=1):
        calls.append((fn(), reps, batch))
        return next(times[calls[-1][0]])

    fns = {"a": lambda: "a", "b": lambda: "b"}
    best = common.interleaved_ms(fns, 7, rounds=3, batch=20, timer=timer,
                                 warm=lambda f: warmed.append((f, len(calls))))
    assert best == {"a": 1.0, "b": 4.0}
    assert warmed == [(fns, 0)]  # before anything is timed
    assert [c[0] for c in calls] == ["a", "b", "b", "a", "a", "b"]
    assert {c[1:] for c in calls} == {(7, 20)}


def row(**kw):
    base = dict(case="rmsnorm bf16", ours="row, 8 warps", ours_value=4024.0,
                ref="torch.compile", ref_value=4118.0, unit="GB/s",
                command="python -m bench norms --kind rmsnorm --dtype bf16", target=1.0)
    return Row(**{**base, **kw})


def test_row_renders_values_ratio_target_date_gpu_and_command():
    r = row(date="2026-11-23", gpu="H200")
    assert r.missed
    assert r.render() == (
        "| rmsnorm bf16 | 4024 GB/s (row, 8 warps) | 4118 GB/s (torch.compile) | 0.977 | "
        "1x: **missed** | 2026-11-23 | H200 | `python -m bench norms --kind rmsnorm --dtype "
        "bf16` |")
    fast = row(ours_value=6.99, ref_value=7.77, unit="us", target=None)
    assert not fast.missed and "| 6.99 us (" in fast.render() and "| 1.112 |  |" in fast.render()


def test_section_prints_what_limits_it_only_while_a_target_is_missed():
    s = Section("norms", "Row norms", "About.", rows=[row(ours_value=4200.0)], notes=["A note."],
                limits="DRAM.")
    text = s.stamp("2026-11-24", "H200").render()
    assert text.startswith("## Row norms (`python -m bench norms`)\n\nAbout.\n\n| case |")
    assert "| 2026-11-24 | H200 |" in text and "A note." in text
    assert "What limits it" not in text
    s.rows.append(row(date="2026-11-23"))  # a row keeps the date it was measured on
    text = s.stamp("2026-11-24", "H200").render()
    assert "| 2026-11-23 | H200 |" in text and "What limits it: DRAM." in text


def test_write_page_replaces_fresh_sections_and_keeps_the_others(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    copy = Section("copy", "Copy", "Old copy.", [row(case="copy")]).stamp("d1", "H200").render()
    peer = Section("peer", "Peer", "Old peer.", [row(case="peer")]).stamp("d1", "H200").render()
    write_page(str(out), "machine one", {"copy": copy, "peer": peer}, {})
    header, sections = common.split_page(out.read_text())
    assert "Machine: machine one" in header and list(sections) == ["copy", "peer"]
    new = Section("copy", "Copy", "New copy.", [row(case="copy")]).stamp("d2", "H200").render()
    write_page(str(out), "machine two", {"copy": new}, {"peer": "BenchError: needs two GPUs"})
    header, sections = common.split_page(out.read_text())
    assert "machine two" in header
    assert "New copy." in sections["copy"] and "Old copy." not in sections["copy"]
    assert "Old peer." in sections["peer"]
    assert "Not re-measured on" in sections["peer"] and "needs two GPUs" in sections["peer"]


def test_a_workload_with_two_sections_keeps_both_across_pages(tmp_path):
    out = tmp_path / "BENCHMARKS.md"  # decode-gemm writes a bf16 and an fp8 section
    two = "\n".join(Section("decode-gemm", t, f"{t} text.", [row(case=t)]).stamp("d1", "H200")
                     .render() for t in ("bf16", "fp8"))
    write_page(str(out), "m", {"decode-gemm": two}, {})
    write_page(str(out), "m", {}, {})  # kept from the old page, not re-measured
    _, sections = common.split_page(out.read_text())
    assert "bf16 text." in sections["decode-gemm"] and "fp8 text." in sections["decode-gemm"]


def test_all_keeps_sections_it_cannot_measure_and_fails_only_on_errors(tmp_path, monkeypatch,
                                                                       capsys):
    import types

    import bench.__main__ as cli

    def workload(behaviour):
        def run(a):
            if behaviour == "ok":
                return [Section(a.workload, "Fresh", "Measured now.", [row(case="new")])]
            raise behaviour

        return types.SimpleNamespace(run=run, add_args=lambda p: None, __doc__="A workload.")

    fakes = {"copy": workload("ok"), "peer": workload(common.Unavailable("needs two GPUs")),
             "norms": workload(common.BenchError("a wrong result"))}
    monkeypatch.setattr(cli, "WORKLOADS", {name: (name, {}) for name in fakes})
    monkeypatch.setattr(cli, "module", fakes.__getitem__)
    out = tmp_path / "page.md"
    old = {k: Section(k, "Old", f"Old {k}.", [row(case="old")]).stamp("d0", "H200").render()
           for k in ("copy", "peer")}
    write_page(str(out), "old machine", old, {})
    assert cli.main(["all", "--out", str(out)]) == 1  # the error fails the run ...
    _, sections = common.split_page(out.read_text())
    assert "Measured now." in sections["copy"] and "Old copy." not in sections["copy"]
    assert "Old peer." in sections["peer"] and "needs two GPUs" in sections["peer"]
    assert "a wrong result" in sections["norms"]
    fakes["norms"] = workload("ok")
    assert cli.main(["all", "--out", str(out)]) == 0  # ... an unavailable workload does not
    capsys.readouterr()


def test_the_compile_workload_runs_here_and_writes_its_section(tmp_path, capsys):
    out = tmp_path / "page.md"
    assert main(["compile", "--reps", "1", "--out", str(out)]) == 0
    _, sections = common.split_page(out.read_text())
    assert list(sections) == ["compile"]
    assert "| gemm.ptxdsl |" in sections["compile"]
    assert "`python -m bench compile` |" in sections["compile"]


# ----------------------------------------------------------------------------- the pages


def test_benchmarks_md_is_the_generators_page():
    text = (ROOT / "BENCHMARKS.md").read_text()
    # about a screenful a section (the decoding and multi-GPU sections hold a row per size)
    assert len(text.splitlines()) < 20 * len(common.SECTION_RE.findall(text))
    header, sections = common.split_page(text)
    assert header.startswith("# ptxdsl benchmarks\n") and "\nMachine: " in header
    assert list(sections) == [w for w in WORKLOADS if w in sections]
    assert set(WORKLOADS) - set(sections) == set()
    for key, body in sections.items():
        rows = [ln for ln in body.splitlines() if ln.startswith("| ") and "---" not in ln]
        if not rows:  # a workload not run yet: write_page's placeholder
            assert body.rstrip().endswith("Not measured yet."), key
            continue
        assert rows[0] == common.HEAD[0], key
        for ln in (r for r in rows[1:] if r != common.HEAD[0]):  # a second section's head
            cells = ln.split(" | ")
            assert len(cells) == 8, ln
            assert cells[-1].startswith("`") and "python -m bench " + key in cells[-1], ln


def test_gpu_runs_record_puts_the_new_run_first(tmp_path):
    output = "\n".join([
        "..s..F",
        "SKIPPED [3] tests/multigpu/test_multigpu.py:20: needs two GPUs",
        "FAILED tests/runtime/test_gpu.py::test_x - AssertionError",
        "==== 1 failed, 4 passed, 3 skipped in 12.5s ====",
    ])
    counts, failures, skips = gpu_runs.summarize(output)
    assert counts == "1 failed, 4 passed, 3 skipped in 12.5s"
    assert failures == ["FAILED tests/runtime/test_gpu.py::test_x - AssertionError"]
    assert skips == ["3 x needs two GPUs"]
    record = tmp_path / "GPU_RUNS.md"
    record.write_text((ROOT / "GPU_RUNS.md").read_text())
    newest = next(ln for ln in record.read_text().splitlines() if ln.startswith("## "))
    new = gpu_runs.section(["python3", "-m", "pytest", "-m", "gpu"], output)
    text = gpu_runs.insert(record, new)
    runs = [ln for ln in text.splitlines() if ln.startswith("## ")]
    assert text.startswith(gpu_runs.TITLE + "\n\n" + gpu_runs.INTRO + "\n\n## ")
    assert "**1 failed, 4 passed, 3 skipped in 12.5s**" in text.split(runs[1])[0]
    assert runs[1] == newest
    assert text.count(gpu_runs.INTRO) == 1


def test_a_run_on_a_changed_tree_says_so():
    assert gpu_runs.commit_text("abc1234", "") == "abc1234"
    assert gpu_runs.commit_text("abc1234", " M ptxdsl/api.py\n") == "abc1234 plus local changes"
