"""ptxdsl.tools.autotune without a GPU or torch: keys, the JSON cache, and the choice made with an
injected launcher and timer."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import ptxdsl
from ptxdsl.tools import autotune
from ptxdsl.tools.autotune import Autotuner, DiskCache, entry_key

CONFIGS = ({"bn": 256, "stages": 3}, {"bn": 128, "stages": 4}, {"bn": 128, "stages": 6})
MACHINE = {"gpu": "NVIDIA H100 80GB HBM3", "driver": "13000"}


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    for var in ("PTXDSL_AUTOTUNE", "PTXDSL_AUTOTUNE_LOG"):
        monkeypatch.delenv(var, raising=False)


class Fake:
    """Launches that record the config run and return its output; a timer that answers
    each config's time from a table."""

    def __init__(self, ms: dict[int, float], outputs: dict[int, float] | None = None,
                 fails: tuple[int, ...] = ()):
        self.ms, self.outputs, self.fails = ms, outputs or {}, fails
        self.ran: list[int] = []
        self.timed: list[int] = []
        self.ptx_calls = 0

    def _index(self, config) -> int:
        return CONFIGS.index(dict(config))

    def run(self, config) -> float:
        i = self._index(config)
        self.ran.append(i)
        if i in self.fails:
            raise RuntimeError("cluster cannot be scheduled")
        return self.outputs.get(i, 1.0)

    def timer(self, fn) -> float:
        fn()
        self.timed.append(self.ran[-1])
        return self.ms[self.ran[-1]]

    def ptx(self, config) -> str:
        self.ptx_calls += 1
        return f"// ptx of {config}"


def tuner(fake: Fake, cache_dir: Path, machine=MACHINE, configs=CONFIGS) -> Autotuner:
    return Autotuner("ptxdsl::gemm", configs, ptx=fake.ptx, machine=lambda dev: machine,
                     timer=fake.timer, cache=DiskCache(cache_dir))


def same(out, ref) -> bool:
    return out == ref


def test_key_names_every_field_and_changes_with_each():
    base = dict(op="ptxdsl::gemm", machine=MACHINE, ptx="abc", shape=(128, 256, 64))
    fields = json.loads(entry_key(**base))
    assert fields == {"op": "ptxdsl::gemm", "gpu": MACHINE["gpu"], "driver": "13000",
                      "ptxdsl": ptxdsl.__version__, "ptx": "abc", "shape": [128, 256, 64]}
    changed = [dict(base, op="ptxdsl::rms_norm"), dict(base, ptx="abd"),
               dict(base, shape=(256, 256, 64)), dict(base, machine={**MACHINE, "driver": "13010"}),
               dict(base, machine={**MACHINE, "gpu": "NVIDIA H200"})]
    keys = {entry_key(**b) for b in changed}
    assert len(keys) == len(changed) and entry_key(**base) not in keys


def test_ptx_hash_depends_on_every_candidate_and_order():
    h = autotune.ptx_hash(["a", "b"])
    assert h == autotune.ptx_hash(["a", "b"])
    assert len({h, autotune.ptx_hash(["a", "c"]), autotune.ptx_hash(["b", "a"]),
                autotune.ptx_hash(["ab"])}) == 4


def test_tunes_to_the_fastest_and_writes_the_cache(tmp_path):
    fake = Fake({0: 3.0, 1: 1.0, 2: 2.0})
    t = tuner(fake, tmp_path)
    assert t.choose((128, 512, 64), fake.run, same) == CONFIGS[1]
    assert sorted(fake.timed) == [0, 1, 2]
    data = json.loads((tmp_path / "ptxdsl.gemm.json").read_text())
    (entry,) = data["entries"].values()
    assert entry["config"] == CONFIGS[1]
    assert entry["ms"] == {"bn=256, stages=3": 3.0, "bn=128, stages=4": 1.0,
                           "bn=128, stages=6": 2.0}


def test_a_second_call_is_answered_from_memory(tmp_path):
    fake = Fake({0: 3.0, 1: 1.0, 2: 2.0})
    t = tuner(fake, tmp_path)
    t.choose((1, 2, 3), fake.run, same)
    ran, ptx_calls = len(fake.ran), fake.ptx_calls
    (tmp_path / "ptxdsl.gemm.json").unlink()  # memory answers, not the file
    assert t.choose((1, 2, 3), fake.run, same) == CONFIGS[1]
    assert (len(fake.ran), fake.ptx_calls) == (ran, ptx_calls)


def test_a_new_tuner_reads_the_disk_cache_without_running(tmp_path):
    first = Fake({0: 3.0, 1: 1.0, 2: 2.0})
    tuner(first, tmp_path).choose((1, 2, 3), first.run, same)
    second = Fake({0: 1.0, 1: 9.0, 2: 9.0})  # would choose config 0 if it tuned
    assert tuner(second, tmp_path).choose((1, 2, 3), second.run, same) == CONFIGS[1]
    assert second.ran == [] and second.timed == []


# (not "gpu": conftest skips tests whose keywords, parameter ids included, name the gpu mark)
@pytest.mark.parametrize("what", ["driver", "gpu_name", "ptx", "shape", "version"])
def test_a_changed_key_field_tunes_again(tmp_path, monkeypatch, what):
    first = Fake({0: 3.0, 1: 1.0, 2: 2.0})
    tuner(first, tmp_path).choose((1, 2, 3), first.run, same)
    second = Fake({0: 1.0, 1: 9.0, 2: 9.0})
    machine, shape = dict(MACHINE), (1, 2, 3)
    if what in ("driver", "gpu_name"):
        machine[what.removesuffix("_name")] += "x"
    elif what == "ptx":
        second.ptx = lambda config: f"// changed {config}"  # type: ignore[method-assign]
    elif what == "shape":
        shape = (1, 2, 4)
    else:
        monkeypatch.setattr(autotune, "__version__", "0.2.0")
    assert tuner(second, tmp_path, machine).choose(shape, second.run, same) == CONFIGS[0]
    assert sorted(second.timed) == [0, 1, 2]
    assert len(DiskCache(tmp_path).entries("ptxdsl::gemm")) == 2  # the first entry kept


def test_tuning_a_new_shape_says_so_in_one_line_and_hits_are_silent(tmp_path, capsys):
    fake = Fake({0: 3.0, 1: 1.0, 2: 2.0})
    tuner(fake, tmp_path).choose((128, 512, 64), fake.run, same)
    (line,) = capsys.readouterr().err.splitlines()
    assert re.fullmatch(
        r"ptxdsl: tuned ptxdsl::gemm for shape \(128, 512, 64\) over 3 candidates "
        r"\(\[bn=256, stages=3\]; \[bn=128, stages=4\]; \[bn=128, stages=6\]\) "
        r"in \d+\.\d\d s: bn=128, stages=4", line), line
    fresh = Fake({0: 3.0, 1: 1.0, 2: 2.0})
    t = tuner(fresh, tmp_path)
    t.choose((128, 512, 64), fresh.run, same)  # from disk
    t.choose((128, 512, 64), fresh.run, same)  # from memory
    t.choose((1,), fresh.run, same, tune=False)  # not known, not tuned: the default
    assert capsys.readouterr().err == "" and fresh.ran == []


def test_failing_and_wrong_candidates_are_rejected_and_logged(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PTXDSL_AUTOTUNE_LOG", "1")
    fake = Fake({0: 3.0, 1: 1.0, 2: 0.5}, outputs={1: 2.0}, fails=(2,))
    assert tuner(fake, tmp_path).choose((8,), fake.run, same) == CONFIGS[0]
    assert fake.timed == [0]
    err = capsys.readouterr().err
    assert "ptxdsl autotune ptxdsl::gemm (8,): tuned bn=256, stages=3" in err
    assert "rejected bn=128, stages=4: output differs from the default's" in err
    assert "rejected bn=128, stages=6: RuntimeError: cluster cannot be scheduled" in err


def test_a_failing_default_raises(tmp_path):
    fake = Fake({0: 1.0, 1: 1.0, 2: 1.0}, fails=(0,))
    with pytest.raises(RuntimeError, match="cluster cannot be scheduled"):
        tuner(fake, tmp_path).choose((8,), fake.run, same)
    assert not (tmp_path / "ptxdsl.gemm.json").exists()


def test_autotune_off_runs_the_default_and_touches_no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PTXDSL_AUTOTUNE", "0")
    fake = Fake({0: 3.0, 1: 1.0, 2: 2.0})
    assert tuner(fake, tmp_path).choose((1,), fake.run, same) == CONFIGS[0]
    assert fake.ran == [] and fake.ptx_calls == 0 and list(tmp_path.iterdir()) == []


def test_without_tuning_an_unknown_shape_gets_the_default_and_a_known_one_its_choice(tmp_path):
    fake = Fake({0: 3.0, 1: 1.0, 2: 2.0})
    t = tuner(fake, tmp_path)
    assert t.choose((1,), fake.run, same, tune=False) == CONFIGS[0]
    assert fake.ran == []
    t.choose((2,), fake.run, same)
    other = tuner(Fake({}), tmp_path)
    assert other.choose((2,), fake.run, same, tune=False) == CONFIGS[1]
    # the default given while not tuning was not remembered: a tuning call tunes
    assert t.choose((1,), fake.run, same) == CONFIGS[1]


def test_a_cached_config_that_is_no_candidate_tunes_again(tmp_path):
    fake = Fake({0: 3.0, 1: 1.0, 2: 2.0})
    tuner(fake, tmp_path).choose((1,), fake.run, same)
    cache = DiskCache(tmp_path)
    (key,) = cache.entries("ptxdsl::gemm")
    cache.put("ptxdsl::gemm", key, {"config": {"bn": 64, "stages": 9}, "ms": {}})
    fresh = Fake({0: 3.0, 1: 1.0, 2: 2.0})
    assert tuner(fresh, tmp_path).choose((1,), fresh.run, same) == CONFIGS[1]
    assert sorted(fresh.timed) == [0, 1, 2]


@pytest.mark.parametrize("text", ["not json", '{"format": 99, "entries": {}}', "[]",
                                  '{"format": 1, "entries": []}'])
def test_an_unreadable_cache_file_counts_as_empty_and_is_replaced(tmp_path, text):
    (tmp_path / "ptxdsl.gemm.json").write_text(text)
    fake = Fake({0: 3.0, 1: 1.0, 2: 2.0})
    assert tuner(fake, tmp_path).choose((1,), fake.run, same) == CONFIGS[1]
    assert len(DiskCache(tmp_path).entries("ptxdsl::gemm")) == 1


def test_entries_of_other_keys_survive_a_write(tmp_path):
    cache = DiskCache(tmp_path)
    cache.put("ptxdsl::gemm", "a", {"config": {"x": 1}})
    cache.put("ptxdsl::gemm", "b", {"config": {"x": 2}})
    assert cache.get("ptxdsl::gemm", "a") == {"config": {"x": 1}}
    assert [p.name for p in tmp_path.iterdir()] == ["ptxdsl.gemm.json"]  # no temp files left


def test_cache_directory_follows_ptxdsl_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PTXDSL_CACHE_DIR", str(tmp_path / "c"))
    assert autotune.autotune_dir() == tmp_path / "c" / "autotune"
    assert DiskCache().path("ptxdsl::gemm") == tmp_path / "c" / "autotune" / "ptxdsl.gemm.json"
    monkeypatch.delenv("PTXDSL_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert autotune.autotune_dir() == tmp_path / ".cache" / "ptxdsl" / "autotune"


def test_a_tuner_needs_configs():
    with pytest.raises(ValueError, match="at least one config"):
        Autotuner("ptxdsl::x", (), ptx=str, machine=dict, timer=float)


def test_prepare_builds_every_candidate_once_before_their_ptx_is_read(tmp_path, monkeypatch):
    fake = Fake({0: 3.0, 1: 1.0, 2: 2.0})
    calls = []

    def prepare(configs):
        calls.append((list(configs), fake.ptx_calls))

    t = Autotuner("ptxdsl::gemm", CONFIGS, ptx=fake.ptx, machine=lambda dev: MACHINE,
                  timer=fake.timer, cache=DiskCache(tmp_path), prepare=prepare)
    t.choose((1, 2, 3), fake.run, same)
    t.choose((4, 5, 6), fake.run, same)
    assert calls == [(list(CONFIGS), 0)] and fake.ptx_calls == len(CONFIGS)
    monkeypatch.setenv("PTXDSL_AUTOTUNE", "0")
    fresh = Autotuner("ptxdsl::gemm", CONFIGS, ptx=fake.ptx, machine=lambda dev: MACHINE,
                      timer=fake.timer, cache=DiskCache(tmp_path), prepare=prepare)
    assert fresh.choose((1, 2, 3), fake.run, same) == CONFIGS[0] and len(calls) == 1


def test_the_cli_lists_and_clears_the_decisions(tmp_path, monkeypatch, capsys):
    from ptxdsl.tools.cli import main

    monkeypatch.setenv("PTXDSL_CACHE_DIR", str(tmp_path))
    assert main(["autotune"]) == 0
    assert "no tuned configs" in capsys.readouterr().out
    fake = Fake({0: 3.0, 1: 1.0, 2: 2.0})
    tuner(fake, tmp_path / "autotune").choose((128, 512, 64), fake.run, same)
    assert main(["autotune"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == ("ptxdsl::gemm on NVIDIA H100 80GB HBM3 (driver 13000, ptxdsl "
                   f"{ptxdsl.__version__}) shape (128, 512, 64): bn=128, stages=4 "
                   "([bn=128, stages=4] 1.0000 ms, [bn=128, stages=6] 2.0000 ms, "
                   "[bn=256, stages=3] 3.0000 ms)")
    assert main(["autotune", "--clear"]) == 0
    assert "removed 1 file" in capsys.readouterr().out
    assert not list((tmp_path / "autotune").glob("*.json"))
