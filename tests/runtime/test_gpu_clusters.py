"""Thread-block clusters on the GPU (H200), against numpy: DSMEM exchange, remote arrive and
expect_tx with peer copies, multicast of 2D tiles and 1D bulk copies to every CTA and to a
subset, and the cluster pipeline, for clusters of 2, 4, 8 and 16 CTAs.

Marked `gpu`: skipped where no CUDA GPU is present; run them with `pytest -m gpu`."""

import numpy as np
import pytest
from conftest import assert_ok, sample_module, sample_path
from test_clusters import MULTICAST, ping, ping_reference

import ptxdsl
from ptxdsl.tools.runner import run_example, run_sample

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", ["dsmem_exchange", "multicast_pipeline", "longrow"])
def test_cluster_sample_matches_numpy(name):
    for _kernel, results in run_sample(sample_path(name)):
        assert_ok(results)


@pytest.mark.parametrize("cluster", [2, 4, 8, 16])
def test_dsmem_exchange(cluster):
    mod = sample_module("dsmem_exchange")
    ex = mod.example(np.random.default_rng(), nctas=cluster * 66, cluster=cluster)
    assert_ok(run_example(mod.build(cluster), ex))


@pytest.mark.parametrize("cluster", [2, 4, 8, 16])
def test_remote_arrive_expect_tx_st_async_and_peer_bulk_copy(cluster):
    nctas = cluster * 33
    src = np.random.default_rng().standard_normal(nctas * 96).astype(np.float32)
    prog = ptxdsl.compile(ping(cluster))
    ex = {"grid": nctas, "inputs": {"src": src}, "outputs": {"out": np.empty_like(src)},
          "expected": {"out": ping_reference(src, nctas)}}
    assert_ok(run_example(prog, ex))


def test_multicast_to_all_and_to_a_subset_with_tiles_and_bulk_copies():
    nclusters = 100
    rng = np.random.default_rng()
    x = rng.standard_normal((nclusters * 8, 32)).astype(np.float32)
    src = rng.standard_normal(nclusters * 32).astype(np.float32)
    want = np.zeros((nclusters, 4, 9, 32), np.float32)
    for c in range(nclusters):
        for r in range(4):
            want[c, r, :8] = x[c * 8 : c * 8 + 8] + r
            want[c, r, 8] = src[c * 32 : c * 32 + 32]
    prog = ptxdsl.compile(MULTICAST)
    ex = {"grid": nclusters * 4, "inputs": {"x": x, "src": src},
          "outputs": {"out": np.empty(want.size, np.float32)},
          "tensor_maps": {"x": {"box": (2, 32)}}, "expected": {"out": want.reshape(-1)}}
    assert_ok(run_example(prog, ex))


PIPELINES = [
    dict(cluster=2), dict(cluster=4), dict(cluster=8), dict(cluster=16),
    dict(cluster=2, copy="bulk"), dict(cluster=16, copy="bulk"),
    dict(cluster=(2, 2), mask="row"), dict(cluster=(4, 2), mask="row"),
    dict(cluster=(2, 4), mask="row", copy="bulk"), dict(cluster=(8, 2), mask="row"),
]


@pytest.mark.parametrize("opts", PIPELINES, ids=str)
def test_cluster_pipeline(opts):
    mod = sample_module("multicast_pipeline")
    ex = mod.example(np.random.default_rng(), nclusters=8, ntiles=40, **opts)
    assert_ok(run_example(mod.build(**opts), ex))


LONGROW = [("rmsnorm", 65536, 2), ("rmsnorm", 65536, 4), ("rmsnorm", 65536, 8),
           ("rmsnorm", 262144, 8), ("rmsnorm", 262144, 16), ("softmax", 65536, 2),
           ("softmax", 65536, 4), ("softmax", 65536, 8), ("softmax", 262144, 8),
           ("softmax", 262144, 16)]


@pytest.mark.parametrize("kind, n, cluster", LONGROW)
def test_long_row_norms_against_numpy(kind, n, cluster):
    mod = sample_module("longrow")
    kd = mod.make_longrow(kind, n=n, cluster=cluster)
    ex = mod.example(np.random.default_rng(), kernel=kd.name, rows=37, n=n, cluster=cluster)
    assert_ok(run_example(kd, ex))


def test_max_active_clusters_sizes_a_persistent_grid():
    from ptxdsl.runtime.driver import device_info
    from ptxdsl.runtime.occupancy import max_active_clusters

    mod = sample_module("longrow")
    k = mod.make_longrow("softmax", n=262144, cluster=8).program().kernel()
    n8 = max_active_clusters(k)  # 1 CTA (131 KB of shared memory) per SM
    assert 1 <= n8 <= device_info().sm_count // 8
    small = sample_module("dsmem_exchange").build(2).program().kernel()
    assert max_active_clusters(small) >= device_info().sm_count // 2
