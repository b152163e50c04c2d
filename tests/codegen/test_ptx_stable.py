"""The PTX of every sample, for sm_90a and sm_80, and of every kernel of the samples' Python
twins, pinned by sha256 in tests/golden/ptx_sha256.txt: a restructuring proves it changed no
output byte. `pytest --update-goldens` rewrites the file when a change to the PTX is meant."""

from __future__ import annotations

import hashlib

from conftest import (
    KERNELS,
    ROOT,
    SAMPLES,
    sample_kernel_defs,
    sample_names,
    sample_path,
    sample_ptx,
)

import ptxdsl

PINS = ROOT / "tests" / "golden" / "ptx_sha256.txt"
ARCHS = ("sm_90a", "sm_80")
NO_FORM = "no-ptx"  # the source has no build for this target (a located CompileError)


def _sha(ptx: str) -> str:
    # Sources are named by absolute path in the PTX; pin what depends on neither the checkout
    # nor the folder (samples/ or the library's) that holds the source: a move keeps the pin.
    ptx = ptx.replace(str(SAMPLES), "samples").replace(str(KERNELS), "samples")
    return hashlib.sha256(ptx.encode()).hexdigest()


def _pin(build, *args) -> str:
    try:
        return _sha(build(*args))
    except ptxdsl.CompileError:
        return NO_FORM




def current_pins() -> dict[str, str]:
    pins = {}
    for name in sample_names():
        src = sample_path(name).relative_to(ROOT).with_suffix("")
        for arch in ARCHS:
            pins[f"{src}.ptxdsl {arch}"] = _pin(sample_ptx, name, arch)
        for kd in sample_kernel_defs(name):
            for arch in ARCHS:
                pins[f"{src}.py:{kd.name} {arch}"] = _pin(kd.ptx, arch)
    return pins


def _read(text: str) -> dict[str, str]:
    return dict(line.rsplit(" ", 1) for line in text.splitlines() if line)


def changed(now: dict[str, str], pinned: dict[str, str]) -> list[str]:
    """Entries whose sha differs, or that one side lacks."""
    return sorted(k for k in now.keys() | pinned.keys() if now.get(k) != pinned.get(k))


def test_every_sample_ptx_is_pinned(update_goldens):
    pins = current_pins()
    if update_goldens:
        PINS.write_text("".join(f"{k} {v}\n" for k, v in pins.items()))
    assert PINS.is_file(), f"missing {PINS}; run pytest --update-goldens"
    differ = changed(pins, _read(PINS.read_text()))
    assert not differ, f"PTX differs from the pinned sha256 for: {differ}"
    assert sum(v != NO_FORM for v in pins.values()) > len(pins) // 2, "most samples build"


def test_pins_tell_a_changed_byte():
    """The pin is of the bytes themselves, and a changed, new or missing entry is reported."""
    ptx = ptxdsl.compile(SAMPLES / "add_one.ptxdsl").ptx
    a, b = _sha(ptx), _sha(ptx + " ")
    assert a != b
    pinned = _read(f"samples/a.ptxdsl sm_80 {a}\nsamples/b.ptxdsl sm_80 {a}\n")
    assert changed({"samples/a.ptxdsl sm_80": a, "samples/b.ptxdsl sm_80": a}, pinned) == []
    assert changed({"samples/a.ptxdsl sm_80": b, "samples/c.ptxdsl sm_80": a}, pinned) == [
        "samples/a.ptxdsl sm_80", "samples/b.ptxdsl sm_80", "samples/c.ptxdsl sm_80"]
