"""Thread-block clusters without a GPU: the cluster operations parse, print, assemble and run
in the interpreter (CTAs of a cluster interleaved), and their misuse is reported."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import SAMPLES, assemble

import ptxdsl
from ptxdsl.errors import CompileError
from ptxdsl.interp import InterpError, InterpWarning, TensorMapModel, run
from ptxdsl.printer import print_module
from ptxdsl.verify import verify_module

# Every CTA sends its partner (rank ^ 1) 64 floats with a bulk copy shared::cta ->
# shared::cluster and 32 more with st.async, both completing on the partner's mbarrier, which
# the sender arms remotely (arrive.expect_tx); a remote arrive and expect_tx complete a second
# barrier. Each CTA then writes what it received.
PING = """
kernel ping(src: ptr<f32>, out: ptr<f32>) threads(32) cluster(@CLUSTER@) {
    shared a: f32[64] align 128;
    shared b: f32[64] align 128;
    shared c: f32[32] align 16;
    mbarrier bar count 1;
    mbarrier gate count @GATE@;
    let tid = %tid.x;
    let partner = %cluster_ctarank ^ 1;
    let base = %ctaid.x * 96;
    if tid == 0 {
        mbarrier_init(bar);
        mbarrier_init(gate);
        @FENCE@
    }
    a[tid] = src[base + tid];
    a[tid + 32] = src[base + tid + 32];
    fence_proxy_async();
    @SYNC@
    if tid == 0 {
        mbarrier_arrive_expect_tx(peer(bar, partner), 384);
        bulk_copy_cluster(peer(b, partner), a, peer(bar, partner));
        mbarrier_expect_tx(peer(gate, partner), 0);
        mbarrier_arrive(peer(gate, partner));
    }
    st_async(peer(c[tid], partner), src[base + 64 + tid] + 1.0, peer(bar, partner));
    mbarrier_wait(bar, 0);
    mbarrier_wait(gate, 0);
    out[base + tid] = b[tid];
    out[base + tid + 32] = b[tid + 32];
    out[base + 64 + tid] = c[tid];
    @TAIL@
}
"""


def ping(cluster: int = 2, gate: int = 1, fence: str = "fence_mbarrier_init();",
         sync: str = "cluster_sync();", tail: str = "cluster_sync();") -> str:
    shape = f"{cluster}) nonportable" if cluster > 8 else f"{cluster})"
    return (PING.replace("@CLUSTER@)", shape).replace("@GATE@", str(gate))
            .replace("@FENCE@", fence).replace("@SYNC@", sync).replace("@TAIL@", tail))


def ping_reference(src: np.ndarray, nctas: int) -> np.ndarray:
    s = src.reshape(nctas, 96)[np.arange(nctas) ^ 1]
    return np.concatenate([s[:, :64], s[:, 64:] + 1.0], axis=1).reshape(-1)


def run_ping(text: str, nctas: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    src = np.arange(nctas * 96, dtype=np.float32)
    out = np.zeros_like(src)
    run(ptxdsl.parse(text, "ping.ptxdsl"), nctas, {"src": src, "out": out}, seed=seed)
    return out, ping_reference(src, nctas)


@pytest.mark.parametrize("seed", range(4))
def test_peer_copies_and_remote_arrivals_deliver(seed):
    out, want = run_ping(ping(), seed=seed)
    np.testing.assert_array_equal(out, want)


def test_cluster_of_four_in_the_interpreter():
    out, want = run_ping(ping(cluster=4), nctas=8)
    np.testing.assert_array_equal(out, want)


def test_cluster_operations_round_trip_and_assemble(tmp_path):
    m = ptxdsl.parse(ping())
    assert ptxdsl.parse(print_module(m)) == m
    ptx = ptxdsl.compile_module(m).ptx
    for form in ("mapa.shared::cluster.u32",
                 "mbarrier.arrive.expect_tx.release.cluster.shared::cluster.b64",
                 "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes",
                 "mbarrier.expect_tx.relaxed.cluster.shared::cluster.b64",
                 "mbarrier.arrive.release.cluster.shared::cluster.b64",
                 "st.async.shared::cluster.mbarrier::complete_tx::bytes.f32",
                 "barrier.cluster.arrive.release", "barrier.cluster.wait.acquire"):
        assert form in ptx, form
    assert ".version 8.1" in ptx  # st.async
    assemble(ptx, tmp_path)


MULTICAST = """
kernel mcast(x: tmap<f32, 2>, src: ptr<f32>, out: ptr<f32>) threads(32) cluster(4) {
    shared tile: f32[4][2][32] align 128;
    shared row: f32[32] align 128;
    mbarrier full count 1;
    let tid = %tid.x;
    let rank = %cluster_ctarank;
    if tid == 0 {
        mbarrier_init(full);
        fence_mbarrier_init();
    }
    cluster_sync();
    if tid == 0 {
        // 2 tile rows from each CTA to all 4; one 32-float row from rank 0 to all 4
        mbarrier_arrive_expect_tx(full, 1024 + 128);
        tma_load_multicast(tile[rank], x, [0, %clusterid.x * 8 + rank * 2], cluster_mask(), full);
        if rank == 0 {
            bulk_load_multicast(row, src[%clusterid.x * 32], cta_mask(0, 1, 2, 3), full);
        }
    }
    mbarrier_wait(full, 0);
    for i in 0 .. 8 {
        out[(%ctaid.x * 9 + i) * 32 + tid] = tile[i >> 1, i & 1, tid] + rank as f32;
    }
    out[(%ctaid.x * 9 + 8) * 32 + tid] = row[tid];
    cluster_sync();
}
"""


def test_multicast_tile_and_bulk_loads_reach_every_cta_of_the_mask():
    nclusters = 2
    x = np.arange(nclusters * 8 * 32, dtype=np.float32).reshape(nclusters * 8, 32)
    src = -np.arange(nclusters * 32, dtype=np.float32)
    out = np.zeros(nclusters * 4 * 9 * 32, np.float32)
    m = ptxdsl.parse(MULTICAST, "mcast.ptxdsl")
    for seed in range(3):
        run(m, nclusters * 4, {"x": TensorMapModel(x, box=(2, 32)), "src": src, "out": out},
            seed=seed)
        got = out.reshape(nclusters, 4, 9, 32)
        for c in range(nclusters):
            for r in range(4):
                np.testing.assert_array_equal(got[c, r, :8], x[c * 8 : c * 8 + 8] + r)
                np.testing.assert_array_equal(got[c, r, 8], src[c * 32 : c * 32 + 32])


def test_multicast_assembles_for_sm_90a(tmp_path):
    ptx = ptxdsl.compile_module(ptxdsl.parse(MULTICAST)).ptx
    assert ".target sm_90a" in ptx
    assert ("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
            ".multicast::cluster") in ptx
    assemble(ptx, tmp_path)


# ----------------------------------------------------------------------------- misuse


def interp_error(text: str, nctas: int = 4, seeds=range(4)) -> InterpError:
    for seed in seeds:
        try:
            run_ping(text, nctas, seed)
        except InterpError as e:
            return e
    raise AssertionError("no error reported")


def test_remote_arrival_beyond_the_count_is_reported():
    e = interp_error(ping(gate=1).replace("mbarrier_arrive(peer(gate, partner));",
                                          "mbarrier_arrive(peer(gate, partner), 2);"))
    assert "too many arrivals" in str(e) and "cluster rank" in str(e)


def test_remote_use_before_a_cluster_barrier_publishes_the_init():
    e = interp_error(ping(sync="bar_sync(0);"))
    assert e.kind == "mbarrier" and "visible to the cluster" in str(e)


def test_remote_use_without_fence_mbarrier_init():
    e = interp_error(ping(fence=""))
    assert "never ran fence_mbarrier_init()" in str(e)


def test_cta_exiting_while_its_peer_still_accesses_it():
    text = (SAMPLES / "dsmem_exchange.ptxdsl").read_text()
    head, tail = text.rsplit("cluster_sync();", 1)
    # (reading the partner's stores without that barrier would be an unordered read first)
    tail = tail.replace("dst[g] = box[tid];", "dst[g] = src[g];")
    m = ptxdsl.parse(head + tail, "exchange.ptxdsl")
    src = np.ones(512, np.float32)
    with pytest.raises(InterpError) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore", InterpWarning)
        run(m, 4, {"src": src, "dst": np.zeros_like(src)})
    assert info.value.kind == "cluster"
    assert "which has exited" in str(info.value) and "exchange.ptxdsl:14:5" in str(info.value)


def test_deadlock_report_names_the_cluster_rank():
    text = ping(gate=2)  # one arrival per phase never comes
    e = interp_error(text)
    assert e.kind == "deadlock"
    assert "deadlock in CTA 0 (cluster rank 0)" in str(e) and "cluster rank 1" in str(e)


def test_cluster_barrier_deadlock_names_missing_threads():
    text = ping(gate=2).replace("mbarrier_wait(gate, 0);",
                                "if %cluster_ctarank == 0 { cluster_sync(); }\n"
                                "    mbarrier_wait(gate, 0);")
    e = interp_error(text)
    assert e.kind == "deadlock" and "on the cluster barrier" in str(e)
    assert "threads 0..31 of cluster rank 1 never arrive" in str(e)


@pytest.mark.parametrize("text, message", [
    ("kernel k() threads(32) cluster(2) { shared a: f32[4]; peer(a[0], 2) = 1.0; }",
     "cluster rank 2 is outside the cluster of 2 CTA(s)"),
    ("kernel k(p: ptr<f32>) threads(32) cluster(2) { let x = peer(p[0], 1); }",
     "peer() needs a shared-memory place or one mbarrier, got global f32"),
    ("kernel k() threads(32) cluster(16) { }", "exceed the portable cluster size of 8"),
    ("kernel k() threads(32) cluster(4) { shared a: f32[4]; mbarrier b count 1; "
     "bulk_load_multicast(a, a, cta_mask(4), b); }", "cluster rank 4 is outside the cluster"),
    ("kernel k() threads(32) cluster(2) { shared a: f32[4]; mbarrier b count 1; "
     "st_async(a[0], 1.0, b); }", "must be shared memory of another CTA"),
    ("kernel k() threads(32) cluster(2) { mbarrier b count 1; mbarrier_wait(peer(b, 1), 0); }",
     "must be an mbarrier, got cluster mbarrier"),
])
def test_misuse_is_a_located_error(text, message):
    with pytest.raises(CompileError) as info:
        ptxdsl.parse(text, "k.ptxdsl")
    assert message in str(info.value)
    assert "k.ptxdsl:1:" in str(info.value)


def test_nonportable_clusters_of_sixteen():
    m = ptxdsl.parse("kernel k() threads(32) cluster(16) nonportable { }")
    assert m.kernels[0].nonportable and ptxdsl.parse(print_module(m)) == m


# ----------------------------------------------------------------------------- samples


MULTICAST_VARIANTS = [
    dict(cluster=2), dict(cluster=8), dict(cluster=16), dict(cluster=4, copy="bulk"),
    dict(cluster=(2, 2), mask="row"), dict(cluster=(4, 2), mask="row", copy="bulk"),
]


@pytest.mark.parametrize("opts", MULTICAST_VARIANTS, ids=str)
def test_multicast_pipeline_variants_in_the_interpreter(opts):
    from conftest import sample_module

    mod = sample_module("multicast_pipeline")
    kd = mod.build(**opts)
    ex = mod.example(np.random.default_rng(3), nclusters=1, ntiles=3, **opts)
    out = ptxdsl.interp.run_sample(kd.ir, ex, seed=1)
    np.testing.assert_array_equal(out["out"], ex["expected"]["out"])


@pytest.mark.parametrize("cluster", [2, 4, 8, 16])
def test_dsmem_exchange_cluster_sizes_in_the_interpreter(cluster):
    from conftest import sample_module

    mod = sample_module("dsmem_exchange")
    ex = mod.example(np.random.default_rng(0), nctas=cluster, cluster=cluster)
    out = ptxdsl.interp.run_sample(mod.build(cluster).ir, ex)
    np.testing.assert_array_equal(out["dst"], ex["expected"]["dst"])


SUBSET = """
kernel subset(src: ptr<f32>, out: ptr<f32>) threads(32) cluster(4) {
    shared row: f32[32] align 128;
    mbarrier full count 1;
    let tid = %tid.x;
    let rank = %cluster_ctarank;
    if tid == 0 {
        mbarrier_init(full);
        fence_mbarrier_init();
    }
    cluster_sync();
    if tid == 0 {
        mbarrier_arrive_expect_tx(full, 128);
        // rank 0 feeds ranks 0 and 2, rank 1 feeds ranks 1 and 3
        if rank == 0 {
            bulk_load_multicast(row, src[%clusterid.x * 64], cta_mask(0, 2), full);
        } else if rank == 1 {
            bulk_load_multicast(row, src[%clusterid.x * 64 + 32], cta_mask(1, 3), full);
        }
    }
    mbarrier_wait(full, 0);
    out[%ctaid.x * 32 + tid] = row[tid];
    cluster_sync();
}
"""


def test_multicast_to_a_subset_with_constant_masks():
    src = np.arange(2 * 64, dtype=np.float32)
    out = np.zeros(8 * 32, np.float32)
    for seed in range(3):
        run(ptxdsl.parse(SUBSET), 8, {"src": src, "out": out}, seed=seed)
        got = out.reshape(2, 4, 32)
        for c in range(2):
            for r in range(4):
                np.testing.assert_array_equal(got[c, r], src[c * 64 + (r & 1) * 32:][:32])


def test_multicast_mask_bits_outside_the_cluster_fail_at_run_time_too():
    text = SUBSET.replace("cta_mask(1, 3)", "((1 << rank) | 16) as u16")
    with pytest.raises(InterpError) as info:
        run(ptxdsl.parse(text, "subset.ptxdsl"), 4,
            {"src": np.zeros(64, np.float32), "out": np.zeros(128, np.float32)})
    assert "names CTAs outside the cluster of 4" in str(info.value)
    assert "subset.ptxdsl:18:" in str(info.value)
    with pytest.raises(CompileError) as static:  # and the verifier, for every rank
        verify_module(ptxdsl.parse(text, "subset.ptxdsl"))
    assert "multicast mask 0x0012 (in the CTA of cluster rank 1)" in str(static.value)
    assert "cluster rank 0)" not in str(static.value)  # rank 0 does not run that copy


def test_peer_ranks_are_checked_only_where_they_are_used():
    ok = """kernel k() threads(32) cluster(4) {
        shared a: u32[32];
        cluster_sync();
        if %cluster_ctarank < 2 && %tid.x < 32 { peer(a, %cluster_ctarank + 2)[%tid.x] = 1; }
        cluster_sync();
    }"""
    verify_module(ptxdsl.parse(ok))
    with pytest.raises(CompileError, match=r"peer rank 4 \(in the CTA of cluster rank 2\)"):
        verify_module(ptxdsl.parse(ok.replace("< 2", "< 3")))
