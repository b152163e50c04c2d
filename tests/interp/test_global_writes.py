"""Two CTAs (or ranks) storing one global element with nothing ordering the stores race at
every seed, whichever CTA happened to run last (issue 44, class 9; interp/gwrites.py): for
plain, vector, bulk and tensor stores. Atomics and reductions of one element do not race,
and neither do stores that a release/acquire chain or a cluster barrier orders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ptxdsl
from ptxdsl.interp import InterpError, TensorMapModel, run, run_ranks

SEEDS = range(3)
DECIDED = Path(__file__).parents[1] / "decided"
RACE = "and nothing orders the two stores"


def kernel(source: str) -> ptxdsl.ir.Kernel:
    return ptxdsl.parse(source, "writes.ptxdsl").kernels[0]


def heads(path: Path, out: TensorMapModel, seed: int) -> np.ndarray:
    """Two heads of 5 rows (x 32) through the kernel of `path`; the source rows."""
    src = np.random.default_rng(seed).standard_normal(1 << 12).astype(np.float32)
    run(ptxdsl.parse(path.read_text(), path.name).kernels[0], 2,
        {"src": src, "out": out, "rows": 5}, seed=seed)
    return src[:10 * 32].reshape(10, 32)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_ragged_head_over_a_flat_map_races(seed):
    out = TensorMapModel(np.zeros((10, 32), np.float32), box=(64, 32))
    with pytest.raises(InterpError, match=r"the tma_store issued by thread 0 of CTA \d writes "
                       rf"element \[\d, \d+\] of 'out', .*{RACE}") as e:
        heads(DECIDED / "ragged_head_flat_map.ptxdsl", out, seed)
    assert "ragged_head_flat_map.ptxdsl:18:9" in str(e.value)
    assert e.value.kind == "race"


@pytest.mark.parametrize("seed", SEEDS)
def test_a_map_per_head_clips_each_box(seed):
    out = TensorMapModel(np.zeros((2, 5, 32), np.float32), box=(1, 64, 32))
    want = heads(DECIDED / "valid" / "ragged_head_map_per_head.ptxdsl", out, seed)
    np.testing.assert_array_equal(out.array.reshape(10, 32), want)


# every CTA stores the same 16-byte vectors (STORE), or adds into the same words (atomics)
SHARED_WORDS = """
kernel shared_words(src: ptr<u32>, dst: ptr<u32>) threads(32) {
    let v: u32x4 = vload(src[%ctaid.x * 128 + %tid.x * 4], 4);
    STORE;
}
"""


@pytest.mark.parametrize("seed", SEEDS)
def test_vector_stores_of_two_ctas_race(seed):
    src = np.arange(3 * 128, dtype=np.uint32)
    with pytest.raises(InterpError, match=rf"thread \d+ of CTA \d writes element \d+ of 'dst', "
                       rf"which thread \d+ of CTA \d stored, {RACE}"):
        run(kernel(SHARED_WORDS.replace("STORE", "dst[%tid.x * 4] = v")), 3,
            {"src": src, "dst": np.zeros(128, np.uint32)}, seed=seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_atomics_of_two_ctas_do_not_race(seed):
    src = np.arange(3 * 128, dtype=np.uint32)
    dst = np.zeros(128, np.uint32)
    run(kernel(SHARED_WORDS.replace("STORE", "let old: u32 = atomic_add(dst[%tid.x], v[0])")),
        3, {"src": src, "dst": dst}, seed=seed)
    np.testing.assert_array_equal(dst[:32], src.reshape(3, 32, 4)[:, :, 0].sum(axis=0))


# thread 0 of each CTA copies a 16-byte-per-thread tile to global memory with one bulk copy:
# OP stores it or adds it
BULK = """
kernel bulk(src: ptr<f32>, dst: ptr<f32>) threads(32) {
    shared tile: f32[128] align 128;
    for i in 0 .. 4 {
        tile[i * 32 + %tid.x] = src[%ctaid.x * 128 + i * 32 + %tid.x];
    }
    fence_proxy_async();
    bar_sync(0);
    if %tid.x == 0 {
        OP(dst[AT], tile);
        bulk_commit();
        bulk_wait(0);
    }
}
"""


def bulk(op: str, at: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    src = np.random.default_rng(seed).standard_normal(3 * 128).astype(np.float32)
    dst = np.zeros(3 * 128, np.float32)
    run(kernel(BULK.replace("OP", op).replace("AT", at)), 3, {"src": src, "dst": dst},
        seed=seed)
    return src.reshape(3, 128), dst.reshape(3, 128)


@pytest.mark.parametrize("seed", SEEDS)
def test_bulk_stores_of_two_ctas_race(seed):
    with pytest.raises(InterpError, match=r"the bulk_store issued by thread 0 of CTA \d writes "
                       rf"element \d+ of 'dst', which the bulk_store issued by thread 0 of CTA "
                       rf"\d stored, {RACE}") as e:
        bulk("bulk_store", "0", seed)
    assert "writes.ptxdsl:10:9" in str(e.value)


@pytest.mark.parametrize("seed", SEEDS)
def test_bulk_stores_of_own_rows_and_bulk_reductions_pass(seed):
    src, dst = bulk("bulk_store", "%ctaid.x * 128", seed)
    np.testing.assert_array_equal(dst, src)
    src, dst = bulk("bulk_reduce_add", "0", seed)
    np.testing.assert_allclose(dst[0], src.sum(axis=0), rtol=1e-5, atol=1e-6)


# CTA 1 stores the word after CTA 0 has: ordered by a flag that CTA 0 raises with RAISE and
# CTA 1 waits for with ld_acquire
HANDOFF = """
kernel handoff(dst: ptr<u32>, flag: ptr<u32>) threads(32) {
    if %ctaid.x == 0 {
        dst[%tid.x] = 1;
        bar_sync(0);
        if %tid.x == 0 {
            RAISE;
        }
    } else {
        if %tid.x == 0 {
            while ld_acquire(flag[0]) == 0 {
            }
        }
        bar_sync(0);
        dst[%tid.x] = 2;
    }
}
"""


@pytest.mark.parametrize("seed", SEEDS)
def test_a_released_flag_orders_the_second_store(seed):
    dst = np.zeros(32, np.uint32)
    run(kernel(HANDOFF.replace("RAISE", "st_release(flag[0], 1)")), 2,
        {"dst": dst, "flag": np.zeros(1, np.uint32)}, seed=seed)
    assert (dst == 2).all()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_relaxed_flag_leaves_the_stores_unordered(seed):
    with pytest.raises(InterpError, match=rf"thread \d+ of CTA 1 writes element \d+ of 'dst', "
                       rf"which thread \d+ of CTA 0 stored, {RACE}"):
        run(kernel(HANDOFF.replace("RAISE", "let old: u32 = atomic_exch(flag[0], 1, relaxed)")),
            2, {"dst": np.zeros(32, np.uint32), "flag": np.zeros(1, np.uint32)}, seed=seed)


# the two CTAs of a cluster store the same words one after the other, SYNC between them
CLUSTER = """
kernel turns(dst: ptr<u32>) threads(32) cluster(2) {
    if %cluster_ctarank == 0 {
        dst[%tid.x] = 1;
    }
    SYNC
    if %cluster_ctarank == 1 {
        dst[%tid.x] = 2;
    }
}
"""


@pytest.mark.parametrize("seed", SEEDS)
def test_a_cluster_barrier_orders_the_stores_of_its_ctas(seed):
    dst = np.zeros(32, np.uint32)
    run(kernel(CLUSTER.replace("SYNC", "cluster_sync();")), 2, {"dst": dst}, seed=seed)
    assert (dst == 2).all()


@pytest.mark.parametrize("seed", SEEDS)
def test_stores_of_a_cluster_without_its_barrier_race(seed):
    with pytest.raises(InterpError, match=rf"CTA 1 \(cluster rank 1\) writes element \d+ of "
                       rf"'dst', which thread \d+ of CTA 0 \(cluster rank 0\) stored, {RACE}|"
                       rf"CTA 0 \(cluster rank 0\) writes element \d+ of 'dst', which thread "
                       rf"\d+ of CTA 1 \(cluster rank 1\) stored, {RACE}"):
        run(kernel(CLUSTER.replace("SYNC", "")), 2, {"dst": np.zeros(32, np.uint32)}, seed=seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_two_ranks_storing_one_shared_word_race(seed):
    """A symmetric array that two ranks store the same words of, nothing ordering them."""
    dst = np.zeros(32, np.uint32)
    k = kernel("kernel k(dst: ptr<u32>, rank: u32) threads(32) { dst[%tid.x] = rank; }")
    with pytest.raises(InterpError, match=rf"which thread \d+ of CTA 0 of rank \d stored, {RACE}"):
        run_ranks(k, 1, [{"dst": dst, "rank": r} for r in range(2)], seed=seed)
