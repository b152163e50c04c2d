"""PTX emitter: goldens for the samples, header rules, determinism, launch contracts."""

import re

import pytest
from conftest import ROOT, SAMPLES, sample_names, sample_path, sample_ptx

import ptxdsl
from ptxdsl import types as T
from ptxdsl.codegen.ptx import immediate

GOLDEN = ROOT / "tests" / "golden"


@pytest.mark.parametrize("name", sample_names())
def test_sample_golden_ptx(name, update_goldens):
    ptx = sample_ptx(name).replace(str(sample_path(name)), f"samples/{name}.ptxdsl")
    golden = GOLDEN / f"{name}.ptx"
    if update_goldens:
        golden.write_text(ptx)
    assert golden.is_file(), f"missing golden {golden}; run pytest --update-goldens"
    assert ptx == golden.read_text()


def test_output_is_deterministic():
    a = ptxdsl.compile(SAMPLES / "pipeline.ptxdsl").ptx
    b = ptxdsl.compile(SAMPLES / "pipeline.ptxdsl").ptx
    assert a == b


def test_header_version_and_target():
    ptx = ptxdsl.compile(SAMPLES / "add_one.ptxdsl").ptx
    version = re.search(r"^\.version (\d+)\.(\d+)$", ptx, re.M)
    assert version and (int(version[1]), int(version[2])) <= (9, 0)
    assert re.search(r"^\.target sm_90$", ptx, re.M)
    assert ".target sm_90a" in ptxdsl.compile(SAMPLES / "add_one.ptxdsl", arch="sm_90a").ptx


def test_tensor_map_params_are_byvalue_and_cvta_param():
    src = """kernel t(m: tmap<bf16, 2>) threads(128) {
        shared tile: bf16[64][64] align 1024; mbarrier b count 1;
        if %tid.x == 0 { mbarrier_init(b); fence_mbarrier_init(); }
        bar_sync(0);
        if %tid.x == 0 {
            tma_prefetch_desc(m);
            mbarrier_arrive_expect_tx(b, sizeof(tile));
            tma_load(tile, m, [0, %ctaid.x as s32 * 64], b);
        }
        mbarrier_wait(b, 0);
    }"""
    ptx = ptxdsl.compile(src).ptx
    assert ".param .align 64 .b8 p_m[128]" in ptx
    assert re.search(r"mov\.u64 (%rd\d+), p_m;\n\s+cvta\.param\.u64 \1, \1;", ptx)
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes" in ptx


def test_launch_contract():
    prog = ptxdsl.compile(SAMPLES / "pipeline.ptxdsl")
    (info,) = prog.kernels
    assert info.name == "pipeline_sum" and info.threads == (256, 1, 1)
    assert [(p.name, p.kind, p.dtype.name) for p in info.params] == [
        ("src", "ptr", "f32"), ("out", "ptr", "f32"), ("ntiles", "scalar", "u32")]
    # 2 x 512 f32 stages + 4 mbarriers, plus 128 - 16 bytes of base-alignment slack
    assert info.smem_bytes == 4096 + 32 + 112


def test_shared_layout_orders_by_alignment():
    prog = ptxdsl.compile("""kernel k() threads(32) {
        mbarrier b[3] count 1; shared small: u32[4] align 16; shared big: f32[256] align 1024;
    }""")
    ptx = prog.ptx
    assert "big: offset 0, 1024 bytes, align 1024" in ptx
    assert "small: offset 1024, 16 bytes, align 16" in ptx
    assert "b: offset 1040, 24 bytes, align 8" in ptx
    assert "and.b32 %r1, %r1, -1024;" in ptx  # the base is aligned in-kernel


@pytest.mark.parametrize("value,t,text", [
    (1.0, T.f32, "0f3F800000"), (-2.5, T.f64, "0dC004000000000000"),
    (1.0, T.bf16, "0x3F80"), (1.0, T.f16, "0x3C00"), (7, T.u32, "7"),
])
def test_immediates(value, t, text):
    assert immediate(value, t) == text
