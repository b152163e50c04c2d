"""The e4m3 attention forward's builds assemble for sm_90a without spills (a few seconds
each with ptxas: PTXDSL_DEEP=1 runs them; ptxas reports 168 registers, the launch bound of
384 threads, which setmaxnreg then splits 24 / 240 between the producer and the consumers)."""

import os

import pytest
from conftest import assemble, assert_no_spills

from ptxdsl.kernels.attention_fp8 import make_attention_fp8

pytestmark = pytest.mark.ptxas
DEEP = bool(os.environ.get("PTXDSL_DEEP"))
deep = pytest.mark.skipif(not DEEP, reason="ptxas seconds a build: PTXDSL_DEEP=1 runs it")


@deep
@pytest.mark.parametrize("d, causal", [(128, True), (128, False), (64, False), (64, True)])
def test_attention_fp8_assembles_without_spills(d, causal, tmp_path):
    log = assemble(make_attention_fp8(d, causal).ptx("sm_90a"), tmp_path)
    assert "Used" in log and "C7508" not in log  # setmaxnreg honoured
    assert_no_spills(log)
