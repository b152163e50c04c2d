"""The interpreter starts the CTAs of a cluster in a seeded order, some steps apart, and runs
them interleaved: a CTA that reaches a peer before the peer started, or after it exited, is
reported with both sites; exchanges that need both CTAs running at once complete. Each test
here fails when the CTAs of a cluster run one after another, or all start together."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import SAMPLES

import ptxdsl
from ptxdsl.interp import InterpError, InterpWarning, run

DECIDED = Path(__file__).parents[1] / "decided"


def run_exchange(text: str, seed: int = 0, nctas: int = 4) -> np.ndarray:
    src = np.arange(nctas * 128, dtype=np.float32)
    dst = np.zeros_like(src)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InterpWarning)
        run(ptxdsl.parse(text, "exchange.ptxdsl"), nctas, {"src": src, "dst": dst}, seed=seed)
    return dst


def test_a_store_into_a_peer_that_has_not_started_names_both_sites():
    text = (DECIDED / "cluster_peer_store_before_sync.ptxdsl").read_text()
    with pytest.raises(InterpError) as e:
        run_exchange(text)
    msg = str(e.value)
    assert e.value.kind == "cluster"
    assert "reaches the shared memory or mbarriers of cluster rank 1" in msg
    assert "which has not started yet" in msg
    assert "exchange.ptxdsl:8:5" in msg  # the store
    assert "exchange.ptxdsl:9:5: note: the first cluster barrier" in msg


# Only rank 0 stores into its partner before the cluster barrier: the bug shows when rank 0
# starts first, and stays hidden when rank 1 has started long before.
ONE_SIDED = """
kernel one_sided(src: ptr<f32>, dst: ptr<f32>) threads(128) cluster(2) {
    shared box: f32[128];
    let tid = %tid.x;
    let g = %ctaid.x * 128 + tid;
    if %cluster_ctarank == 0 {
        peer(box, 1)[tid] = src[g];
    }
    cluster_sync();
    dst[g] = box[tid];
    cluster_sync();
}
"""


def test_the_seed_chooses_the_start_order():
    seen = set()
    for seed in range(12):
        try:
            run_exchange(ONE_SIDED, seed=seed)
            seen.add("ok")
        except InterpError as e:
            assert "which has not started yet" in str(e)
            seen.add("early")
    assert seen == {"ok", "early"}


def test_the_sample_exchange_is_correct_in_every_start_order():
    text = (SAMPLES / "dsmem_exchange.ptxdsl").read_text()
    src = np.arange(4 * 128, dtype=np.float32)
    want = 2.0 * src.reshape(4, 128)[np.arange(4) ^ 1].reshape(-1)
    for seed in range(6):
        np.testing.assert_array_equal(run_exchange(text, seed=seed), want)


def test_exit_while_a_peer_still_stores_names_where_it_exited():
    text = (SAMPLES / "dsmem_exchange.ptxdsl").read_text()
    head, tail = text.rsplit("cluster_sync();", 1)
    # (reading the partner's stores without that barrier would be an unordered read first)
    tail = tail.replace("dst[g] = box[tid];", "dst[g] = src[g];")
    with pytest.raises(InterpError) as e:
        run_exchange(head + tail)
    msg = str(e.value)
    assert "which has exited" in msg and "exchange.ptxdsl:14:5" in msg
    assert "note: the threads of cluster rank" in msg  # they ran to the end of the kernel


# A relay around the cluster: rank r waits for rank r - 1's arrival before it arrives on rank
# r + 1, and rank 0 starts it. Run one CTA after another, rank 0 waits for rank 3 forever.
RELAY = """
kernel relay(src: ptr<f32>, dst: ptr<f32>) threads(32) cluster(4) {
    mbarrier token count 1;
    let rank = %cluster_ctarank;
    if %tid.x == 0 {
        mbarrier_init(token);
        fence_mbarrier_init();
    }
    cluster_sync();
    if %tid.x == 0 {
        if rank == 0 {
            mbarrier_arrive(peer(token, 1));
        } else {
            mbarrier_wait(token, 0);
            mbarrier_arrive(peer(token, (rank + 1) % 4));
        }
    }
    if %tid.x == 0 && rank == 0 {
        mbarrier_wait(token, 0);
    }
    dst[%ctaid.x * 32 + %tid.x] = src[%ctaid.x * 32 + %tid.x] + 1.0;
    cluster_sync();
}
"""


@pytest.mark.parametrize("seed", range(3))
def test_a_relay_around_the_cluster_needs_its_ctas_interleaved(seed):
    src = np.arange(128, dtype=np.float32)
    dst = np.zeros_like(src)
    run(ptxdsl.parse(RELAY, "relay.ptxdsl"), 4, {"src": src, "dst": dst}, seed=seed)
    np.testing.assert_array_equal(dst, src + 1.0)
