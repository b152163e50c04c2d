"""Shared fixtures: golden regeneration, sample loading, GPU detection."""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
LIBRARY = ROOT / "ptxdsl" / "kernels"  # the kernel library: its families' sources
SOURCES = (SAMPLES, LIBRARY)
sys.path.insert(0, str(ROOT))
# A few tests share cases with a test module of another area (test_ptxas's `assemble`,
# test_clusters's cluster kernels): every area's folder is importable, whichever is collected.
sys.path[1:1] = [str(d) for d in sorted(Path(__file__).parent.iterdir())
                 if d.is_dir() and any(d.glob("test_*.py"))]


def pytest_addoption(parser):
    parser.addoption("--update-goldens", action="store_true",
                     help="rewrite golden files (PTX and error renderings) from current output")


def pytest_xdist_auto_num_workers(config) -> int:
    """Workers for `-n auto` (pyproject's default): one per core for the CPU suite, none for a
    GPU run (`-m gpu`), whose tests share one device and time kernels."""
    marks = config.getoption("markexpr") or ""
    if "gpu" in marks and "not gpu" not in marks:
        return 0
    return max(1, min(os.cpu_count() or 1, 8))


@pytest.fixture
def update_goldens(request) -> bool:
    return request.config.getoption("--update-goldens")


@functools.cache
def gpu_available() -> bool:
    try:
        from cuda.bindings import driver as drv
    except Exception:
        return False
    try:
        if drv.cuInit(0)[0] != drv.CUresult.CUDA_SUCCESS:
            return False
        err, n = drv.cuDeviceGetCount()
        return err == drv.CUresult.CUDA_SUCCESS and n > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU on this machine (run `pytest -m gpu` on an H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


IN_CHILD = "PTXDSL_ISOLATED_CHILD"


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """An `isolated` test runs in a pytest process of its own, so that a kernel's fault
    (sticky: it ends the process's CUDA context) fails that test alone, not every test after
    it in the run: for a kernel's first runs on a GPU."""
    if pyfuncitem.get_closest_marker("isolated") is None or os.environ.get(IN_CHILD):
        return None
    import subprocess

    env = {**os.environ, IN_CHILD: "1"}
    try:
        # -n 0 keeps xdist loaded, so pytest-benchmark (where installed) warns, an error here
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "-p", "no:benchmark", "-n", "0", pyfuncitem.nodeid],
                           cwd=pyfuncitem.config.rootpath, env=env, capture_output=True,
                           text=True, timeout=240)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"in its own process: no end after {e.timeout} s: "
                    f"{str(e.stdout or '')[-2000:]}")
    out = r.stdout + r.stderr
    # a skip or an xfail in the child exits 0 too: only a pass counts as one
    assert r.returncode == 0 and "1 passed" in r.stdout, f"in its own process: {out[-3000:]}"
    return True


def sample_names() -> list[str]:
    """Every kernel source: the samples' and the kernel library's (names are unique across
    both)."""
    return sorted(p.stem for d in SOURCES for p in d.glob("*.ptxdsl"))


@functools.cache
def sample_path(name: str) -> Path:
    """The .ptxdsl source `name`, in samples/ or in the kernel library."""
    for d in SOURCES:
        if (d / f"{name}.ptxdsl").is_file():
            return d / f"{name}.ptxdsl"
    raise FileNotFoundError(f"no source {name}.ptxdsl in samples/ or ptxdsl/kernels/")


def sample_key(name: str, suffix: str = ".ptxdsl") -> str:
    """`name`'s source as a path relative to the checkout ("ptxdsl/kernels/gemm.ptxdsl")."""
    return sample_path(name).with_suffix(suffix).relative_to(ROOT).as_posix()


@functools.cache
def sample_module(name: str):
    """The Python twin of a source: a library family's module (ptxdsl.kernels.<name>), or
    samples/<name>.py, imported once (the runner's import, so under one name only)."""
    from ptxdsl.tools.runner import import_twin

    lib = LIBRARY / f"{name}.py"
    return import_twin(lib if lib.is_file() else SAMPLES / f"{name}.py")


@functools.cache
def sample_ir(name: str):
    """The source `name` parsed, once per test process (IR is immutable: shared safely;
    collection alone asks for every sample several times)."""
    import ptxdsl

    return ptxdsl.parse_file(sample_path(name))


@functools.cache
def sample_ptx(name: str, arch: str | None = None) -> str:
    """The PTX of the source `name` for `arch` (None: the default target), compiled once
    per test process (the golden, pin, ptxas and two-target tests all read it)."""
    import ptxdsl

    return ptxdsl.compile(sample_path(name), arch=arch).ptx


def sample_kernel_defs(name: str) -> list:
    """The kernels a source's Python twin defines at module level, in order."""
    import ptxdsl

    mod = sample_module(name)
    defs = [v for v in vars(mod).values() if isinstance(v, ptxdsl.KernelDef)]
    assert defs, f"{sample_key(name, '.py')} defines no @ptxdsl.kernel"
    return defs


def ptxas_path() -> str:
    try:
        from cuda.pathfinder import find_nvidia_binary_utility
    except ImportError:
        find_nvidia_binary_utility = None
    path = find_nvidia_binary_utility("ptxas") if find_nvidia_binary_utility else None
    if path is None:
        import shutil

        path = shutil.which("ptxas")
    if path is None:
        pytest.fail("ptxas not found: install the test extras (pip install -e '.[test]'), "
                    "which bring the nvidia-cuda-nvcc wheel")
    return path


def assemble(ptx: str, tmp_path: Path, arch: str = "sm_90a") -> str:
    """Assemble `ptx` with ptxas (-v); fail the test with ptxas's message if it rejects it.
    Returns ptxas's report (registers, spills)."""
    src = tmp_path / f"k_{arch}.ptx"
    src.write_text(ptx)
    import subprocess

    r = subprocess.run([ptxas_path(), f"-arch={arch}", "-v", str(src), "-o",
                        str(tmp_path / f"k_{arch}.cubin")], capture_output=True, text=True,
                       check=False)
    assert r.returncode == 0, f"ptxas -arch={arch} rejected the module:\n{r.stderr}\n{ptx}"
    return r.stderr


def assert_no_spills(log: str) -> None:
    """ptxas -v says no function spilled registers to local memory (a spill in a GEMM costs
    ~10%)."""
    spills = [ln.strip() for ln in log.splitlines() if "spill stores" in ln]
    assert spills and all(" 0 bytes spill stores" in ln for ln in spills), spills


def assert_ok(results) -> None:
    """Every check of a sample run passed (and there was at least one)."""
    assert results, "nothing was checked"
    for r in results:
        assert r.ok, f"{r.name}: {r.detail} (max abs err {r.max_abs_err:.3g})"


@dataclass(frozen=True)
class CliRun:
    """What one `ptxdsl` command printed and returned."""

    returncode: int
    stdout: str
    stderr: str


def cli(*args: str, cwd: Path = ROOT) -> CliRun:
    """Run the `ptxdsl` command in this process: the same `main` the console script calls,
    with stdout/stderr captured and argparse's exits turned into exit codes. A fresh
    interpreter costs about a second per call, most of a CLI test's time; the entry point
    itself is covered by the subprocess tests in test_cli.py."""
    from ptxdsl.tools.cli import main

    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        os.chdir(here)
    return CliRun(code, out.getvalue(), err.getvalue())


# ----------------------------------------------------------------------------- torch ops
# (torch is optional: these skip where it is not installed; GPU modules add their own checks)


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def ops(torch):
    """ptxdsl.torch, which registers torch.ops.ptxdsl.*"""
    import ptxdsl.torch as ops

    return ops


@pytest.fixture(scope="module")
def gpu_cache(tmp_path_factory):
    """A fresh autotune (and cubin) cache for the GPU tests, shared with subprocesses."""
    path = tmp_path_factory.mktemp("ptxdsl-cache")
    old = os.environ.get("PTXDSL_CACHE_DIR")
    os.environ["PTXDSL_CACHE_DIR"] = str(path)
    yield path
    if old is None:
        del os.environ["PTXDSL_CACHE_DIR"]
    else:
        os.environ["PTXDSL_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def cuda(torch):
    """Skips without a CUDA GPU (a GPU module's `pytest.mark.usefixtures("cuda")`)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")


@pytest.fixture(scope="module")
def bench(cuda, request):
    """The bench/ module that the test module names in BENCH (its launcher and its check
    against an f32 reference); skipped without a CUDA GPU."""
    return importlib.import_module(f"bench.{request.module.BENCH}")


@pytest.fixture
def fake(torch):
    """Fake tensors: the ops' shapes and checks without a GPU."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        yield mode


def cuda_empty(torch, *shape, dtype=None):
    """An uninitialised CUDA tensor (bf16 unless `dtype`): a fake one under `fake`."""
    return torch.empty(*shape, device="cuda", dtype=dtype or torch.bfloat16)


def same_bits_thrice(torch, run, operands, stream, m: int, n: int) -> None:
    """A launch plan `run` on `operands` (A, W) three times into fresh NaN-filled (m, n) bf16
    C: each within the GEMM tolerance (bench.common.gemm_error), every repeat the same bits."""
    from bench.common import gemm_error

    results = []
    for _ in range(3):
        c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        run(operands, c, stream)
        torch.cuda.synchronize()
        err = gemm_error(c, *operands)
        assert err <= 1.0, f"error {err:.2f} x the tolerance"
        results.append(c.view(torch.int16).clone())
    assert all(torch.equal(r, results[0]) for r in results[1:]), "repeats differ"


def compile_one_graph(torch, f, *args):
    """`f(*args)` through torch.compile(fullgraph=True) with a recording backend: asserts one
    graph and no graph break, and returns the output and the graph's call targets (as
    text, e.g. "ptxdsl.gemm")."""
    from torch._dynamo.utils import counters

    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    counters.clear()
    out = torch.compile(f, backend=record, fullgraph=True)(*args)
    assert len(graphs) == 1 and dict(counters["graph_break"]) == {}
    return out, {str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"}
