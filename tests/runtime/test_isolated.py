"""conftest's `isolated` marker: the test body runs in a pytest process of its own (where a
kernel's fault, which ends the process's CUDA context, fails that test alone)."""

import os

import pytest


@pytest.mark.isolated
def test_the_body_runs_in_a_process_of_its_own():
    assert os.environ.get("PTXDSL_ISOLATED_CHILD") == "1"
