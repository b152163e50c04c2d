"""Shared fixtures: golden regeneration, sample loading, GPU detection."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
sys.path.insert(0, str(ROOT))


def pytest_addoption(parser):
    parser.addoption("--update-goldens", action="store_true",
                     help="rewrite golden files (PTX and error renderings) from current output")


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


def sample_names() -> list[str]:
    return sorted(p.stem for p in SAMPLES.glob("*.ptxdsl"))


@functools.cache
def sample_module(name: str):
    """The Python twin of a sample (samples/<name>.py), imported once."""
    path = SAMPLES / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"ptxdsl_sample_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sample_kernel_defs(name: str) -> list:
    """The kernels a sample's Python twin defines at module level, in order."""
    import ptxdsl

    mod = sample_module(name)
    defs = [v for v in vars(mod).values() if isinstance(v, ptxdsl.KernelDef)]
    assert defs, f"samples/{name}.py defines no @ptxdsl.kernel"
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


def assert_ok(results) -> None:
    """Every check of a sample run passed (and there was at least one)."""
    assert results, "nothing was checked"
    for r in results:
        assert r.ok, f"{r.name}: {r.detail} (max abs err {r.max_abs_err:.3g})"
