"""Tensor cores without a GPU: register arrays and swizzle declarations in the builder, wgmma
descriptors in the emitted PTX, every wgmma form through ptxas, and wgmma semantics in the
interpreter (against numpy) with the bugs it reports."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import assemble
from wgmma_cases import FORMS, boxes, inputs, make_mma, operands, reference

import ptxdsl
from ptxdsl.interp import run
from ptxdsl.interp.errors import InterpError
from ptxdsl.interp.tensormap import TensorMapModel


def errors(text: str) -> str:
    with pytest.raises(ptxdsl.CompileError) as e:
        ptxdsl.compile_module(ptxdsl.parse(text, "k.ptxdsl"))
    return str(e.value)


KERNEL = """
kernel k(a: tmap<bf16, 2>, b: tmap<bf16, 2>, c: ptr<f32>) threads(128) {{
    shared sa: bf16[64][64] swizzle 128;
    shared sb: bf16[64][64] swizzle 128;
    {body}
}}
"""


@pytest.mark.parametrize("body, message", [
    ("let acc: f32[30]; wgmma_fence(); wgmma(acc, sa[0, 0], sb[0, 0]);",
     "N in 8, 16, ..., 256; 'acc' has 30 elements"),
    ("let acc: f16[32]; wgmma_fence(); wgmma(acc, sa[0, 0], sb[0, 0]);",
     "accumulator must be a register array of f32"),
    ("let acc: f32[32]; wgmma_fence(); wgmma(acc, sa, sb[0, 0]);",
     "the wgmma A operand is a place"),
    ("let acc: f32[32]; let i = %tid.x; c[0] = acc[i];",
     "a register array index must be a constant or an expression of 'unroll' loop variables"),
    ("let acc: f32[32]; c[0] = acc[32];", "out of range for a register array dimension"),
    ("let acc: f32[32]; acc = 1.0;", "is assigned element by element"),
    ("let acc: f32[32]; c[0] = acc;", "is a register array of type f32[32]"),
    ("let acc: f32[300];", "a register array has 1 to 256 elements"),
    ("let acc: f32[32]; wgmma_wait(9);", "wgmma_wait takes 0 to 7"),
])
def test_builder_rejects(body, message):
    assert message in errors(KERNEL.format(body=body))


@pytest.mark.parametrize("decl, message", [
    ("shared s: bf16[64][32] swizzle 128;", "rows (last dimension) must be 128 bytes = 64 bf16"),
    ("shared s: bf16[64][64] align 128 swizzle 128;", "it needs align 1024, got 128"),
    ("shared s: bf16[64][64] swizzle 48;", "swizzle must be 16 (none), 32, 64 or 128"),
    ("shared s: bf16[64][8] swizzle 16;", "declared [k blocks][rows][16 bytes] and K-major"),
    ("shared s: bf16[64][64] swizzle 128 mn;", "is declared [blocks][k][row]"),
])
def test_swizzle_declarations_are_checked(decl, message):
    assert message in errors(f"kernel k() threads(32) {{ {decl} }}")


def test_mn_major_declaration_roundtrips():
    text = """kernel k() threads(32) {
    shared s: bf16[2][64][64] align 1024 swizzle 128 mn;
    pipeline ring stages 2 {
        t: f16[1][32][32] align 512 swizzle 64 mn;
    }
}
"""
    m = ptxdsl.parse(text)
    assert ptxdsl.print_module(m) == text
    assert m.kernels[0].body[0].major == "mn"


def test_mn_major_operand_must_span_its_blocks():
    text = KERNEL.format(body="""shared bt: bf16[1][64][64] swizzle 128 mn;
    let acc: f32[64];
    wgmma_fence();
    wgmma(acc, sa[0, 0], bt[0, 8, 0], false);""")
    assert "spans 128 elements along M / N, but 'bt' holds 64" in errors(text)


def test_k_major_rows_run_on_across_leading_dimensions():
    """[2][32][64] holds 64 K-major rows: an m64n64 B operand may start at [0, 0, k] (both
    blocks), not at [1, 0, k] (32 rows left)."""
    body = """shared bh: bf16[2][32][64] align 1024 swizzle 128;
    let acc: f32[32];
    wgmma_fence();
    wgmma(acc, sa[0, 0], bh[{blk}, 0, 16], false);
    wgmma_commit();
    wgmma_wait(0);"""
    ptxdsl.compile_module(ptxdsl.parse(KERNEL.format(body=body.format(blk=0)), "k.ptxdsl"))
    msg = errors(KERNEL.format(body=body.format(blk=1)))
    assert "the wgmma B operand needs 64 rows from row 32, but 'bh' has 64" in msg


def test_register_array_roundtrips_and_indexes_by_dimension():
    text = """kernel k(c: ptr<f32>) threads(32) {
    let acc: f32[2][4] = 1.0;
    for i in 0 .. 2 unroll {
        acc[i, 3] += 2.0;
    }
    c[%tid.x] = acc[1, 3] + acc[0];
}
"""
    m = ptxdsl.parse(text)
    assert ptxdsl.parse(ptxdsl.print_module(m)) == m
    out = np.zeros(32, np.float32)
    run(m.kernels[0], 1, {"c": out})
    assert (out == 4.0).all()


@pytest.mark.parametrize("swizzle, hi", [(128, 64 | 1 << 30), (64, 32 | 2 << 30),
                                         (32, 16 | 3 << 30)])
def test_descriptor_strides_and_mode_come_from_the_declaration(swizzle, hi):
    ptx = make_mma(64, swizzle).ptx()
    assert "mov.u32 %r" in ptx and f", {hi};" in ptx
    assert "or.b32" in ptx and ", 65536;" in ptx  # leading byte offset field 1


def test_swizzled_generic_access_xors_the_chunk():
    ptx = ptxdsl.compile_module(ptxdsl.parse("""kernel k(c: ptr<bf16>) threads(32) {
    shared s: bf16[8][64] swizzle 128;
    s[%tid.x % 8, %tid.x] = 1.0;
    fence_proxy_async();
}""")).ptx
    assert "shr.u32" in ptx and "and.b32" in ptx and ", 112;" in ptx and "xor.b32" in ptx




@pytest.mark.parametrize("form", FORMS, ids=str)
def test_every_form_assembles(form, tmp_path):
    ptx = make_mma(*form).ptx()
    log = assemble(ptx, tmp_path)
    assert "wgmma.mma_async" in ptx and "spill" in log


@pytest.mark.parametrize("form", FORMS, ids=str)
def test_interpreter_wgmma_matches_numpy(form):
    n, swizzle, dtype, a_regs, neg_a, neg_b = form[:6]
    box_a, box_b, bk = boxes(form)
    kdim = 2 * bk
    a, b, af, bf = inputs(np.random.default_rng(1), n, kdim, dtype)
    a, b = operands(a, b, form)
    c = np.zeros(64 * n, np.float32)
    sw = "none" if swizzle == 16 else f"{swizzle}B"
    run(make_mma(*form), 1, {"a": TensorMapModel(a, box_a, swizzle=sw),
                             "b": TensorMapModel(b, box_b, swizzle=sw), "c": c, "kdim": kdim})
    ref = reference(af, bf, neg_a, neg_b)
    assert np.allclose(c.reshape(64, n), ref, rtol=1e-5, atol=1e-4)


def _interp_error(body: str, kind: str, swizzle: str = "128B") -> str:
    k = ptxdsl.parse(KERNEL.format(body="""
    mbarrier bar count 1;
    if %tid.x == 0 {
        mbarrier_init(bar);
        fence_mbarrier_init();
    }
    bar_sync(0);
    if %tid.x == 0 {
        mbarrier_arrive_expect_tx(bar, 16384);
        tma_load(sa, a, [0, 0], bar);
        tma_load(sb, b, [0, 0], bar);
    }
    mbarrier_wait(bar, 0);
    let acc: f32[32];
    """ + body), "k.ptxdsl").kernels[0]
    a = np.zeros((64, 64), np.uint16)
    with pytest.raises(InterpError) as e:
        run(k, 1, {"a": TensorMapModel(a, (64, 64), swizzle=swizzle),
                   "b": TensorMapModel(a, (64, 64), swizzle=swizzle),
                   "c": np.zeros(128, np.float32)})
    assert e.value.kind == kind, str(e.value)
    return str(e.value)


def test_interpreter_reports_a_read_before_wgmma_wait():
    msg = _interp_error("wgmma_fence(); wgmma(acc, sa[0, 0], sb[0, 0], false); "
                        "wgmma_commit(); c[%tid.x] = acc[1]; wgmma_wait(0);", "wgmma")
    assert "accumulator 'acc' is accessed while a wgmma that writes it is still in flight" in msg
    assert "k.ptxdsl:" in msg


def test_interpreter_reports_a_missing_fence():
    msg = _interp_error("wgmma(acc, sa[0, 0], sb[0, 0], false); wgmma_commit(); wgmma_wait(0);",
                        "wgmma")
    assert "wgmma without a wgmma_fence() before it" in msg


def test_interpreter_reports_a_tensor_map_swizzle_that_disagrees_with_the_buffer():
    msg = _interp_error("", "copy", swizzle="none")
    assert "has swizzle none, but buffer 'sa' declares swizzle 128" in msg


def test_wait_with_groups_in_flight_completes_only_older_groups():
    """wgmma_wait(1) leaves the newest group pending: its accumulator stays unreadable."""
    msg = _interp_error("""
    let acc2: f32[32];
    wgmma_fence();
    wgmma(acc, sa[0, 0], sb[0, 0], false);
    wgmma_commit();
    wgmma(acc2, sa[0, 16], sb[0, 16], false);
    wgmma_commit();
    wgmma_wait(1);
    c[%tid.x] = acc[0];
    c[%tid.x] = acc2[0];""", "wgmma")
    assert "accumulator 'acc2'" in msg


def test_interpreter_reports_a_stage_overwritten_under_a_pending_wgmma():
    """The corpus kernel that releases its stage before wgmma_wait: in the schedules where
    the producer refills the stage first, the interpreter names the wgmma."""
    from pathlib import Path

    from ptxdsl.runtime.dtypes import f32_to_bf16

    path = Path(__file__).parents[1] / "broken" / "wgmma_release_before_wait.ptxdsl"
    k = ptxdsl.parse(path.read_text(), path.name).kernels[0]
    a = f32_to_bf16(np.random.default_rng(0).standard_normal((64, 256), np.float32))
    kinds = []
    for seed in range(6):
        try:
            run(k, 1, {"a": TensorMapModel(a, (64, 64), swizzle="128B"),
                       "b": TensorMapModel(a, (64, 64), swizzle="128B"),
                       "c": np.zeros(128, np.float32), "ktiles": 4}, seed=seed)
        except InterpError as e:
            assert "overwritten before wgmma_wait completed it" in str(e)
            assert f"{path.name}:26:" in str(e)
            kinds.append(e.kind)
    assert kinds and set(kinds) == {"race"}


@pytest.mark.skipif(not os.environ.get("PTXDSL_DEEP"),
                    reason="seconds in the interpreter: PTXDSL_DEEP=1 (CI) runs it (the "
                           "multicast pipeline variants run clusters by default)")
def test_gemm_cluster_pair_in_the_interpreter():
    """The GEMM twin on 2 x 1 clusters (each CTA loads half of the pair's B tile, multicast to
    both) on fresh data: 3 tile-rows, so the last pair's second CTA is off the matrix and still
    delivers its half of B to its partner."""
    from conftest import sample_module

    from ptxdsl.interp import run_sample
    from ptxdsl.runtime.dtypes import bf16_to_f32

    twin = sample_module("gemm")
    ex = twin.example(np.random.default_rng(), m=300, n=256, k=64, cluster=2)
    assert ex["grid"] == 4 and ex["tensor_maps"]["b"]["box"] == (128, 64)
    kdef = twin.make_gemm(cluster=(2, 1, 1))
    mod = kdef.program().ptx_module  # verified: the multicast's bytes are the lowering's
    assert "multicast::cluster" in mod.ptx and ".reqnctapercluster 2, 1, 1" in mod.ptx
    # the launch checks the swizzle of the map the multicast reads, as for plain loads
    assert {p.name: p.swizzle for p in mod.kernels[0].params if p.kind == "tmap"} == \
        {"a": 128, "b": 128, "c": 128}
    c = bf16_to_f32(run_sample(kdef.ir, ex, seed=3)["c"])
    ref = ex["expected"]["c"]
    assert (np.abs(c - ref) <= ex["rtol"] * np.abs(ref) + ex["atol"]).all()


DEEP = bool(os.environ.get("PTXDSL_DEEP"))
SLOW = pytest.mark.skipif(not DEEP, reason="seconds in the interpreter: PTXDSL_DEEP=1 (CI) runs it")
STREAMK_CASES = [
    # (m, n, k, grid): 3 tiles on 2 CTAs, all shared, the middle one cut across both (by
    # default the stream-K GEMM runs in the 128-rows-a-consumer test below)
    pytest.param(384, 256, 128, 2, marks=SLOW),
    # 5 tiles on 2 CTAs: 3 shared as above, 2 whole after them
    pytest.param(640, 256, 128, 2, marks=SLOW),
    # fewer tiles than CTAs, a partial tile-row, 3 K steps on 3 CTAs (one a part)
    pytest.param(200, 256, 192, 3, marks=SLOW),
    # 7 tiles on 3 CTAs: 4 shared, 3 whole
    pytest.param(896, 256, 320, 3, marks=SLOW),
]


@pytest.mark.parametrize("m, n, k, grid", STREAMK_CASES)
def test_gemm_stream_k_in_the_interpreter(m, n, k, grid):
    """make_gemm(streamk=True) on fresh data: shared tiles' parts meet in workspace slots and
    the last part stores the sum as a whole tile is stored; the semaphores come back zero."""
    from conftest import sample_module

    from ptxdsl.interp import run_sample
    from ptxdsl.runtime.dtypes import bf16_to_f32

    twin = sample_module("gemm")
    kdef = twin.make_gemm(streamk=True)
    ex = twin.example(np.random.default_rng(), m=m, n=n, k=k, grid=grid, streamk=True)
    assert ex["inputs"]["slots"] >= 2  # some tile is cut
    out = run_sample(kdef.ir, ex, seed=m)
    c, ref = bf16_to_f32(out["c"]), ex["expected"]["c"]
    assert (np.abs(c - ref) <= ex["rtol"] * np.abs(ref) + ex["atol"]).all()
    assert not out["sem"].any()


def test_gemm_stream_k_refuses_what_it_does_not_build():
    from conftest import sample_module

    twin = sample_module("gemm")
    with pytest.raises(ValueError, match="streamk takes no cluster"):
        twin.make_gemm(streamk=True, cluster=(2, 1, 1))


def test_gemm_stream_k_with_128_rows_a_consumer_in_the_interpreter():
    """256 x 128 tiles (two m64 blocks a warpgroup, the decode shape's tile): one tile's 3 K
    steps over 2 CTAs, each block's partial in its own rows of the slot."""
    from conftest import sample_module

    from ptxdsl.interp import run_sample
    from ptxdsl.runtime.dtypes import bf16_to_f32

    twin = sample_module("gemm")
    kdef = twin.make_gemm(bm=256, bn=128, streamk=True)
    ex = twin.example(np.random.default_rng(), m=256, n=128, k=192, grid=2, bm=256, bn=128,
                      streamk=True)
    assert ex["inputs"]["slots"] == 2
    out = run_sample(kdef.ir, ex, seed=5)
    c, ref = bf16_to_f32(out["c"]), ex["expected"]["c"]
    assert (np.abs(c - ref) <= ex["rtol"] * np.abs(ref) + ex["atol"]).all()
    assert not out["sem"].any()


def test_chunk_columns_is_the_widest_swizzled_chunk_that_divides_the_tile():
    from ptxdsl.swizzle import chunk_box, chunk_columns

    assert [chunk_columns(bn, 2) for bn in (64, 96, 192, 224, 256)] == [64, 32, 64, 32, 64]
    assert chunk_columns(224, 1) == 32 and chunk_columns(256, 1) == 128
    assert chunk_box(64, 224, 2) == ((64, 32), "64B")
    assert chunk_box(64, 256, 2) == ((64, 64), "128B")
    with pytest.raises(ValueError, match="no swizzled chunk"):
        chunk_columns(200, 2)


def test_gemm_with_224_wide_tiles_in_the_interpreter():
    """bn = 224: C goes out in 32-column chunks (64-byte swizzle); the second tile-column is
    8 columns wide (the TMA store clips the rest)."""
    from conftest import sample_module

    from ptxdsl.interp import run_sample
    from ptxdsl.runtime.dtypes import bf16_to_f32

    twin = sample_module("gemm")
    kdef = twin.make_gemm(bn=224)
    ex = twin.example(np.random.default_rng(), m=70, n=232, k=64, grid=2, bn=224)
    out = run_sample(kdef.ir, ex, seed=3)
    c, ref = bf16_to_f32(out["c"]), ex["expected"]["c"]
    assert (np.abs(c - ref) <= ex["rtol"] * np.abs(ref) + ex["atol"]).all()
