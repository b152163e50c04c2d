"""Every emitted module assembles with ptxas -arch=sm_90a (the nvidia-cuda-nvcc wheel's ptxas).

These tests never skip: CI installs the test extras, so a missing ptxas is a failure."""


import pytest
from conftest import (
    assemble,
    assert_no_spills,
    sample_ir,
    sample_kernel_defs,
    sample_names,
    sample_path,
    sample_ptx,
)

import ptxdsl

pytestmark = pytest.mark.ptxas




@pytest.mark.parametrize("name", sample_names())
@pytest.mark.parametrize("arch", ["sm_90a", "sm_90"])
def test_sample_assembles(name, arch, tmp_path):
    if arch == "sm_90" and ".target sm_90a\n" in sample_ptx(name):  # wgmma, setmaxnreg, multicast
        with pytest.raises(ptxdsl.CompileError, match="needs the sm_90a target"):
            ptxdsl.compile(sample_path(name), arch=arch)
        return
    log = assemble(sample_ptx(name, arch), tmp_path, arch)
    assert "Used" in log
    assert "C7508" not in log  # setmaxnreg, where used, is honoured
    assert_no_spills(log)


@pytest.mark.parametrize("name", sample_names())
def test_python_twin_assembles(name, tmp_path):
    """The twin's kernels that its text does not spell out (those the text has are assembled
    above: test_twins pins their PTX to the text's; the goldens are that PTX too)."""
    in_text = {k.name for k in sample_ir(name).kernels}
    for kd in sample_kernel_defs(name):
        if kd.name not in in_text:
            log = assemble(kd.ptx(), tmp_path)
            assert "C7508" not in log


def test_every_operation_and_type_assembles(tmp_path):
    """A kernel that touches every statement, operator, conversion and type the emitter knows."""
    src = """
kernel everything(g: ptr<f32>, h: ptr<bf16>, m: tmap<f32, 2>, n: u32, big: u64, sf: f32,
                  hf: f16, flag: pred, b8: u8) threads(128, 1, 1) maxnreg(128) minctas(1) {
    shared t: f32[2][64] align 1024;
    shared hb: bf16[128] align 128;
    shared w: u32[32] align 16;
    mbarrier bars[2] count 1;
    mbarrier one count 128;
    let tid = %tid.x;
    let lane = %laneid;
    let wp = %warp;
    let r: u64 = %clock64 + %globaltimer;
    let a: s32 = tid as s32 - 64;
    let b = a / 3 + a % 5 - abs(a) + min(a, 2) + max(a, -2);
    let c = (tid << 2) >> 1 | (tid & 3) ^ ~tid;
    let d: u64 = big * 2 + (tid as u64) - (big >> 3);
    let f = (tid as f32) * sf / 2.0 - 1.0;
    let e = ex2(f) + lg2(f) + rsqrt(f) + sqrt(f) + rcp(f) + sin(f) + cos(f) + tanh(f);
    let ff = fma(f, e, 1.0) + abs(f);
    let dd: f64 = (ff as f64) * 2.0 + sqrt(1.0 as f64) + rcp(2.0 as f64);
    let hh: bf16 = ff as bf16;
    let hs = hh * hh + hh - hh;
    let h16 = hf + hf;
    let hconv = h16 as bf16;
    let i8 = b8 as u32 + (hs as s32) as u32 + (dd as u32);
    let p = flag && (tid < n || d == big) && !(a >= 0);
    let q = select(p, f, ff);
    let pi = p as u32;
    let s1 = shfl_xor(q, 16) + shfl_down(q, 1) + shfl_up(q, 1) + shfl_idx(q, 0);
    let cl = %cluster_ctarank + %nctaid.x + %ntid.y + %dynamic_smem_size;
    if tid == 0 {
        for s in 0 .. 2 { mbarrier_init(bars[s]); }
        mbarrier_init(one, 128);
        fence_mbarrier_init();
    }
    bar_sync(0);
    t[tid & 1, lane] = q + s1;
    hb[tid] = hs;
    w[lane] = c + cl + pi + i8;
    let v: f32x4 = vload(t[0, lane & 60], 4);
    let hv: bf16x8 = vload(hb[(tid & 15) * 8], 8);
    let hv2: bf16x2 = vload(hb[(tid & 63) * 2], 2);
    let gv: f32x2 = vload(g[tid * 2], 2);
    g[tid * 4 + 256] = v;
    h[tid * 8] = hv;
    h[tid * 2 + 2048] = hv2;
    g[tid] = gv[0] + gv[1] + (hconv as f32);
    fence_proxy_async();
    bar_sync(1, 128);
    bar_arrive(2, 128);
    if tid == 0 {
        tma_prefetch_desc(m);
        tma_prefetch(m, [0, 64]);
        mbarrier_arrive_expect_tx(bars[0], sizeof(t[0]));
        tma_load(t[0], m, [0, 0], bars[0]);
        mbarrier_expect_tx(bars[1], 256);
        mbarrier_arrive(bars[1]);
        bulk_load(t[1], g[1024], bars[1], 256);
    }
    mbarrier_wait(bars[0], 0);
    mbarrier_wait(bars[1], 0);
    mbarrier_arrive(one);
    mbarrier_wait(one, 0);
    bar_sync(0);  // every thread is past its wait on 'one' before it is invalidated
    if elect() && wp == 0 {
        tma_store(m, [64, 0], t[0]);
        bulk_store(g[2048], t[1]);
        bulk_commit();
        bulk_wait_read(0);
        bulk_wait(0);
        mbarrier_inval(one);
    }
    let k: u32 = 0;
    while k < n { k += 1; if k == 7 { return; } }
    let x: u32 = 0;
    asm "mov.u32 {0}, {1};" : x : k;
    for j in 8 .. 0 step -1 as s32 { }
}
"""
    for arch in ("sm_90a", "sm_90"):
        log = assemble(ptxdsl.compile(src, arch=arch).ptx, tmp_path, arch)
        assert "everything" in log
