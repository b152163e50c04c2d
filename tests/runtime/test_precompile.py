"""ptxdsl.tools.precompile: recipes built in worker processes and adopted here (no GPU or
torch)."""

from __future__ import annotations

import pickle

import pytest
from conftest import LIBRARY, SAMPLES
from fuzzing import DEEP

import ptxdsl
from ptxdsl.compiler import compile_module
from ptxdsl.runtime import compile as cc
from ptxdsl.tools import precompile as pc


def norm(warps: int, kind: str = "rmsnorm") -> pc.Recipe:
    return pc.Recipe.of("ptxdsl.kernels.norms", "make_norm_row", kind=kind, n=1024,
                        dtype=ptxdsl.f32, warps=warps, name=f"pc_{kind}_{warps}")


@pytest.fixture(autouse=True)
def fresh_pool():
    """Each test starts and ends without workers."""
    pc._pool.close()
    yield
    pc._pool.close()


def test_recipes_are_plain_data():
    r = norm(4)
    assert pickle.loads(pickle.dumps(r)) == r and hash(r) == hash(norm(4))
    assert norm(4) != norm(2)


def test_a_recipe_names_a_library_module_imported_once():
    """A library family is named by module, and the runner's import of its file is that
    same module (not a second copy by path)."""
    from ptxdsl.kernels import gemm
    from ptxdsl.tools.runner import import_twin

    assert import_twin(LIBRARY / "gemm.ptxdsl") is gemm
    assert import_twin(SAMPLES / "add_one.py") is import_twin(SAMPLES / "add_one.ptxdsl")

    r = pc.Recipe.of("ptxdsl.kernels.gemm", "make_gemm", bn=128, stages=4)
    assert pickle.loads(pickle.dumps(r)) == r and r.module == "ptxdsl.kernels.gemm"
    assert r.build().ir == gemm.make_gemm(bn=128, stages=4).ir
    with pytest.raises(ModuleNotFoundError):
        pc.Recipe.of("ptxdsl.kernels.nope", "make_nope").build()


def test_workers_build_adopted_kernels_and_cubins_and_report_failures(monkeypatch):
    monkeypatch.setenv("PTXDSL_COMPILE_WORKERS", "2")
    monkeypatch.setenv("PTXDSL_CACHE", "0")  # every cubin comes from a worker or a compile
    good = [norm(2, "softmax"), norm(4, "softmax")]
    bad = norm(2, "median")  # make_norm_row raises ValueError: unknown normalisation
    errors = pc.precompile([*good, bad])
    assert set(errors) == {bad} and "ValueError: unknown normalisation 'median'" in errors[bad]
    assert all(r.built() for r in good) and not bad.built()
    for r in good:
        kd = r.build()
        assert kd.name == dict(r.kwargs)["name"]
        # the adopted PTX is what this process would emit, and its cubin is in memory
        mine = compile_module(kd.module)
        assert kd.ptx() == mine.ptx
        compiles = cc.stats.compiles
        cc.ptx_to_cubin(mine.ptx, mine.arch)
        assert cc.stats.compiles == compiles
    with pytest.raises(ValueError, match="unknown normalisation"):
        bad.build()
    # the workers stay for the next batch: their imports are paid once
    pids = [p.pid for p in pc._pool.procs]
    assert len(pids) == 2 and all(p.poll() is None for p in pc._pool.procs)
    more = [norm(2, "layernorm"), norm(4, "layernorm"), norm(8, "layernorm")]
    assert pc.precompile(more) == {} and all(r.built() for r in more)
    assert [p.pid for p in pc._pool.procs][:2] == pids


@pytest.mark.parametrize("env, count, want", [("0", 5, 0), ("1", 5, 0), ("3", 5, 3),
                                              ("8", 3, 3), ("8", 2, 0), (None, 1, 0)])
def test_worker_count(monkeypatch, env, count, want):
    if env is None:
        monkeypatch.delenv("PTXDSL_COMPILE_WORKERS", raising=False)
    else:
        monkeypatch.setenv("PTXDSL_COMPILE_WORKERS", env)
    assert pc.workers(count) == want


@pytest.fixture
def noisy(tmp_path):
    """A twin whose factory prints (a worker's stdout is not its channel)."""
    twin = tmp_path / "noisy.py"
    twin.write_text(
        "import ptxdsl\n"
        "from ptxdsl import f32, ptr\n"
        "def example(rng):\n    return {}\n"
        "def make(value):\n"
        "    print('building', value)\n"
        "    @ptxdsl.kernel(threads=32, name=f'noisy_{value}')\n"
        "    def k(ctx, y: ptr(f32)):\n"
        "        y[ctx.tid.x] = float(value)\n"
        "    return k\n")
    return twin


@pytest.mark.skipif(not DEEP, reason="a second of worker pools: PTXDSL_DEEP=1 (CI) runs it")
def test_workers_follow_the_cache_settings_and_survive_a_printing_factory(monkeypatch,
                                                                          tmp_path, noisy):
    """The cache directory of each batch is the one set when it is sent."""
    monkeypatch.setenv("PTXDSL_COMPILE_WORKERS", "2")
    monkeypatch.delenv("PTXDSL_CACHE", raising=False)
    for round_, folder in enumerate(("a", "b")):
        monkeypatch.setenv("PTXDSL_CACHE_DIR", str(tmp_path / folder))
        recipes = [pc.Recipe.of(noisy, "make", value=10 * round_ + i) for i in range(3)]
        assert pc.precompile(recipes) == {}
        assert all(r.built() for r in recipes)
        assert len(list((tmp_path / folder).rglob("*.cubin"))) == 3, folder


def test_one_worker_or_fewer_builds_nothing_ahead(monkeypatch):
    monkeypatch.setenv("PTXDSL_COMPILE_WORKERS", "1")
    r = norm(8, "rmsnorm")
    assert pc.precompile([r, norm(4, "rmsnorm"), norm(2, "rmsnorm")]) == {} and not r.built()


@pytest.mark.skipif(not DEEP, reason="a second of worker pools: PTXDSL_DEEP=1 (CI) runs it")
def test_a_dead_worker_fails_one_batch_then_the_pool_starts_afresh(monkeypatch, noisy):
    monkeypatch.setenv("PTXDSL_COMPILE_WORKERS", "2")
    monkeypatch.setenv("PTXDSL_CACHE", "0")
    assert pc.precompile([pc.Recipe.of(noisy, "make", value=100 + i) for i in range(3)]) == {}
    pc._pool.procs[0].kill()
    pc._pool.procs[0].wait()
    lost = [pc.Recipe.of(noisy, "make", value=200 + i) for i in range(3)]
    errors = pc.precompile(lost)
    assert set(errors) == set(lost) and not any(r.built() for r in lost)
    assert pc._pool.procs == []
    assert pc.precompile(lost) == {} and all(r.built() for r in lost)
