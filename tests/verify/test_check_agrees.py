"""`ptxdsl check` runs every check `compile` runs (issue 44): on every kernel of the broken
and decided corpora, for the default target (and sm_80 under PTXDSL_DEEP=1), check fails exactly
when compile does: compile runs check's passes first, so what is left to show is that a
kernel check accepts compiles (a check that only the emitter made was a kernel `check`
accepted and `compile` refused)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import ptxdsl
from ptxdsl.lower import lower

TESTS = Path(__file__).parents[1]
FILES = sorted([*(TESTS / "broken").glob("*.ptxdsl"), *(TESTS / "decided").glob("*.ptxdsl"),
                *(TESTS / "decided" / "valid").glob("*.ptxdsl")])
# the samples compile for both targets in tests/codegen; sm_80 here is seconds: CI only
ARCHS = [None, *(["sm_80"] if os.environ.get("PTXDSL_DEEP") else [])]


def outcome(run) -> str:
    try:
        run()
    except ptxdsl.CompileError as e:
        return "error: " + e.diagnostics[0].message
    return "ok"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_check_fails_exactly_when_compile_does(path, arch):
    text = path.read_text()
    checked = outcome(lambda: lower(ptxdsl.parse(text, path.name), arch))
    if checked != "ok":
        return  # compile runs the same passes first: it fails the same way
    assert outcome(lambda: ptxdsl.compile_module(ptxdsl.parse(text, path.name), arch)) == "ok"
