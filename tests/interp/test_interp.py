"""The CPU interpreter: samples against their numpy references, the bugs it must report
(with the barrier, parity and line), and the PTX semantics it models, each checked on a tiny
kernel against numpy."""

import math
import os
import re
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import sample_ir, sample_module, sample_names

import ptxdsl
from ptxdsl.errors import LaunchError
from ptxdsl.interp import InterpError, InterpWarning, TensorMapModel, run, run_sample
from ptxdsl.runtime.dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from ptxdsl.tools.runner import compare


def kernel(text: str, name: str = "test.ptxdsl"):
    return ptxdsl.parse(textwrap.dedent(text), name).kernel()


def line_of(text: str, snippet: str) -> int:
    """1-based line of the first line of `text` (dedented) containing `snippet`."""
    for i, line in enumerate(textwrap.dedent(text).splitlines(), 1):
        if snippet in line:
            return i
    raise AssertionError(snippet)


def run_quiet(k, grid, args, **kw) -> None:
    """run() with uninitialised-read warnings silenced (buggy kernels read garbage)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InterpWarning)
        run(k, grid, args, **kw)


def interp_error(text: str, grid, args, kind: str, seed: int = 0, **kw) -> str:
    with pytest.raises(InterpError) as info:
        run_quiet(kernel(text), grid, args, seed=seed, **kw)
    assert info.value.kind == kind, str(info.value)
    return str(info.value)


def assert_outputs(kd, ex: dict, max_steps: int | None = None) -> None:
    """Run the twin's kernel `kd` on the example `ex` and compare every expected output,
    each with the element type its parameter declares."""
    kw = {} if max_steps is None else {"max_steps": max_steps}
    out = run_sample(kd.ir, {"kernel": kd.name, **ex}, **kw)
    types = {p.name: getattr(p.type, "elem", None) for p in kd.ir.params}
    for param, want in ex["expected"].items():
        r = compare(param, out[param], want, types[param], ex["rtol"], ex["atol"])
        assert r.ok, f"{param}: {r.detail}"


# ----------------------------------------------------------------------------- samples


# samples whose interpreter runs take seconds: a second seed (another start order and
# interleaving of warps) only with PTXDSL_DEEP=1; test_inflight, test_wgmma and test_sm80 run
# them again in other forms (tests/runtime/test_topk.py: topk)
SLOW = {"ag_gemm", "attention", "colsum", "gemm", "gemm_fp8", "gemm_rs", "gemm_splitk",
        "grouped_gemm", "longrow", "multicast_pipeline", "norms", "topk"}
DEEP = bool(os.environ.get("PTXDSL_DEEP"))


# By default a slow sample with several kernels runs a kernel or two that stand for the rest
# (every kernel with PTXDSL_DEEP=1), and the fused layers run in tests/multigpu/test_tp.py at
# 2 to 8 ranks instead, top-k in tests/runtime/test_topk.py (with ties)
STAND_FOR = {"norms": ("rmsnorm_row", "layernorm")}
ELSEWHERE = {"ag_gemm", "gemm_rs", "topk"}


def _sample_cases() -> list:
    cases = []
    for name in sample_names():
        kernels = [k.name for k in sample_ir(name).kernels]
        if not DEEP and name in SLOW:
            if name in ELSEWHERE:
                continue
            kernels = [k for k in kernels if k in STAND_FOR.get(name, kernels[:1])]
        cases += [pytest.param(name, k, seed, id=f"{name}-{k}-seed{seed}")
                  for k in kernels for seed in ((0, 1) if DEEP or name not in SLOW else (0,))]
    return cases


@pytest.mark.parametrize("name, kname, seed", _sample_cases())
def test_sample_matches_its_numpy_reference(name, kname, seed):
    module = sample_ir(name)
    k = module.kernel(kname)
    example = sample_module(name).example
    kwargs = dict(sample_module(name).SMALL)
    if len(module.kernels) > 1:
        kwargs["kernel"] = kname
    ex = example(np.random.default_rng(100 + seed), **kwargs)
    out = run_sample(module, {"kernel": kname, **ex}, seed=seed)
    types = {p.name: getattr(p.type, "elem", None) for p in k.params}
    for param, want in ex["expected"].items():
        r = compare(param, out[param], want, types[param], ex.get("rtol", 0.0), ex.get("atol", 0.0))
        assert r.ok, f"{param}: {r.detail}"


@pytest.mark.skipif(not DEEP, reason="seconds in the interpreter: PTXDSL_DEEP=1 (CI) runs it")
@pytest.mark.parametrize("seq, kv_seq", [(1, 150), (20, 150)])
def test_attention_against_a_longer_kv_cache(seq, kv_seq):
    """Queries shorter than the keys (a KV cache; decode at seq 1), causal at head dim 64 with
    turns: the mask is aligned to the end, query row r seeing keys 0 .. r + kv_seq - seq."""
    twin = sample_module("attention")
    kd = twin.make_attention(64, causal=True, pingpong=True)
    ex = twin.example(np.random.default_rng(seq), batch=2, seq=seq, kv_seq=kv_seq, d=64,
                      causal=True, grid=3)
    assert_outputs(kd, ex)


@pytest.mark.skipif(not DEEP, reason="seconds in the interpreter: PTXDSL_DEEP=1 (CI) runs it")
@pytest.mark.parametrize("seq, kv_seq, causal", [(300, 300, False), (250, 330, True)])
def test_attention_on_three_warpgroups(seq, kv_seq, causal):
    """Head dim 64 on three consumer warpgroups (192-row tiles): ragged tiles and a causal
    diagonal that crosses the 128-key blocks off their edges."""
    twin = sample_module("attention")
    kd = twin.make_attention(64, causal=causal, nwg=3)
    ex = twin.example(np.random.default_rng(seq), batch=1, seq=seq, kv_seq=kv_seq, d=64,
                      causal=causal, grid=2, nwg=3)
    assert_outputs(kd, ex)


@pytest.mark.skipif(not DEEP, reason="seconds in the interpreter: PTXDSL_DEEP=1 (CI) runs it")
@pytest.mark.parametrize("nwg, seq, kv_seq, heads, grid",
                         [(2, 300, 300, 2, 3), (3, 400, 450, 3, 4)])
def test_attention_causal_walk_in_pairs(nwg, seq, kv_seq, heads, grid):
    """Causal with at least two tiles a CTA: each CTA takes a long and a short query block at
    a time; an odd block count (3) makes the odd heads start with their middle block, so a
    unit spans two heads. Every tile is computed once (a missed one leaves O poisoned)."""
    twin = sample_module("attention")
    kd = twin.make_attention(64, causal=True, nwg=nwg)
    ex = twin.example(np.random.default_rng(seq), batch=1, heads=heads, kv_heads=1, seq=seq,
                      kv_seq=kv_seq, d=64, causal=True, grid=grid, nwg=nwg)
    assert_outputs(kd, ex, max_steps=10_000_000)


@pytest.mark.skipif(not DEEP, reason="seconds in the interpreter: PTXDSL_DEEP=1 (CI) runs it")
@pytest.mark.parametrize("m, n, k, splits, ordered",
                         [(256, 256, 256, 2, 0), (384, 300, 320, 2, 1), (384, 256, 128, 1, 0)])
def test_splitk_on_two_cta_clusters(m, n, k, splits, ordered):
    """make_splitk(cluster=2): B halves multicast across a pair of vertically adjacent
    tiles; 3 tile-rows leave the second pair's second CTA with no rows of its own (with one
    split its tile is whole: nothing may reach C)."""
    twin = sample_module("gemm_splitk")
    kd = twin.make_splitk(cluster=2)
    ex = twin.example(np.random.default_rng(m + k), m=m, n=n, k=k, splits=splits,
                      ordered=ordered, cluster=2)
    assert_outputs(kd, ex, max_steps=20_000_000)


@pytest.mark.skipif(not DEEP, reason="seconds in the interpreter: PTXDSL_DEEP=1 (CI) runs it")
@pytest.mark.parametrize("m, n, k, splits, cluster",
                         [(128, 256, 256, 2, 1), (200, 264, 640, 3, 1), (384, 256, 256, 2, 2)])
def test_splitk_striped_sum(m, n, k, splits, cluster):
    """make_splitk(slots=True, stripes=True): a half-tile's ranges meet at its semaphore
    (CTAs, or clusters, spin for ones that run later), then each sums a stripe of the slots;
    the semaphores end at zero."""
    twin = sample_module("gemm_splitk")
    kd = twin.make_splitk(slots=True, stripes=True, cluster=cluster)
    ex = twin.example(np.random.default_rng(m + k), m=m, n=n, k=k, splits=splits,
                      cluster=cluster, stripes=True)
    assert_outputs(kd, ex, max_steps=20_000_000)


@pytest.mark.skipif(not DEEP, reason="seconds in the interpreter: PTXDSL_DEEP=1 (CI) runs it")
def test_attention_lazy_max_moves_when_scores_grow():
    """Head dim 128 keeps a row's max until it grows by more than 2^8: keys scaled up block by
    block (row maxima about 3, 15 and 67 in log2 units) make it move twice, and O and the
    log-sum-exp still match."""
    from ptxdsl.runtime.dtypes import bf16_to_f32, f32_to_bf16

    twin = sample_module("attention")
    kd = twin.make_attention(128)
    ex = twin.example(np.random.default_rng(3), batch=1, heads=1, kv_heads=1, seq=64,
                      kv_seq=384, d=128, grid=1)
    q, k, v = (bf16_to_f32(ex["inputs"][x]) for x in "qkv")
    k[:, :, 128:256] *= 6.0
    k[:, :, 256:] *= 14.0
    ex["inputs"]["k"] = f32_to_bf16(k)
    o, lse = twin.reference(q, bf16_to_f32(ex["inputs"]["k"]), v, False, 128 ** -0.5)
    ex["expected"] = {"o": o, "lse": lse.reshape(-1)}
    assert_outputs(kd, ex, max_steps=10_000_000)


@pytest.mark.parametrize("form", ["layernorm", "layernorm_row"])
def test_layernorm_stays_accurate_for_rows_far_from_zero(form):
    """LayerNorm combines (mean, squared deviations) pairs across lanes and warps, so rows of
    1000 + N(0, 1) keep their variance (E[x^2] - E[x]^2 in f32 would lose it to cancellation:
    errors of several percent)."""
    twin = sample_module("norms")
    rng = np.random.default_rng(7)
    x = (1000.0 + rng.standard_normal((3, 1024))).astype(np.float32)
    w = (1.0 + 0.1 * rng.standard_normal(1024)).astype(np.float32)
    b = (0.1 * rng.standard_normal(1024)).astype(np.float32)
    y = np.zeros_like(x)
    run(twin.make(form, 1024, ptxdsl.f32), 2, {"x": x, "w": w, "b": b, "y": y, "rows": 3})
    want = twin.reference("layernorm", x, w, b)
    assert np.abs(y - want).max() < 1e-3


@pytest.mark.parametrize("kind", ["rmsnorm", "softmax", "layernorm"])
@pytest.mark.parametrize("warps", [2, 4])
def test_norm_rows_any_warp_count(kind, warps):
    """The one-row-per-CTA form with other warp counts, bf16, more rows than CTAs."""
    twin = sample_module("norms")
    kd = twin.make_norm_row(kind, 1024, ptxdsl.bf16, warps)
    ex = twin.example(np.random.default_rng(warps), kernel=kd.name, rows=5, n=1024)
    out = run_sample(kd.ir, {"kernel": kd.name, **ex, "grid": 2})
    r = compare("y", out["y"], ex["expected"]["y"], ptxdsl.bf16, ex["rtol"], ex["atol"])
    assert r.ok, r.detail


def test_every_sample_has_small_interpreter_sizes():
    missing = [n for n in sample_names() if not hasattr(sample_module(n), "SMALL")]
    assert not missing, f"samples without SMALL example sizes: {missing}"


ORDER = """
kernel order(src: ptr<f32>, out: ptr<u32>) threads(64) {
    shared buf: f32[4][256] align 128;
    mbarrier bars[4] count 1;
    let tid = %tid.x;
    if tid == 0 {
        for i in 0 .. 4 {
            mbarrier_init(bars[i]);
        }
        fence_mbarrier_init();
    }
    bar_sync(0);
    if tid == 0 {
        for i in 0 .. 4 {
            mbarrier_arrive_expect_tx(bars[i], 1024);
            bulk_load(buf[i], src[i * 256], bars[i]);
        }
    }
    if tid < 4 {
        mbarrier_wait(bars[tid], 0);
        out[tid] = %clock;
    }
}
"""


def test_same_seed_same_schedule_and_seeds_vary_copy_completion():
    k = kernel(ORDER)
    src = np.zeros(1024, np.float32)

    def stamps(seed):
        out = np.zeros(4, np.uint32)
        run(k, 1, {"src": src, "out": out}, seed=seed)
        return out

    assert (stamps(3) == stamps(3)).all()
    orders = {tuple(np.argsort(stamps(seed))) for seed in range(8)}
    assert len(orders) > 1


# ----------------------------------------------------------------------------- deadlocks and races

RING = """
kernel ring(src: ptr<f32>, out: ptr<f32>, ntiles: u32) threads(192) {
    shared stage: f32[2][256] align 128;
    mbarrier full[2] count 1;
    mbarrier empty[2] count @EMPTY_COUNT@;
    let tid = %tid.x;
    if tid == 0 {
        for s in 0 .. 2 {
            mbarrier_init(full[s]);
            mbarrier_init(empty[s]);
        }
        fence_mbarrier_init();
    }
    bar_sync(0);
    if %warp == 0 {
        if elect() {
            for t in 0 .. ntiles {
                let s = t & 1;
                mbarrier_wait(empty[s], @PRODUCER_PARITY@);
                mbarrier_arrive_expect_tx(full[s], @EXPECT@);
                bulk_load(stage[s], src[t * 256], full[s]);
            }
        }
    } else if tid >= 64 {
        let c = (tid - 64) * 2;
        let acc: f32x2 = f32x2(0.0, 0.0);
        for t in 0 .. ntiles {
            let s = t & 1;
            @CONSUME@
            acc = f32x2(acc[0] + v[0], acc[1] + v[1]);
            mbarrier_arrive(empty[s]);
        }
        out[c] = acc;
    }
}
"""
CONSUME = """mbarrier_wait(full[s], (t >> 1) & 1);
            let v: f32x2 = vload(stage[s, c], 2);"""


def ring(**changes) -> str:
    text = RING
    defaults = {
        "EMPTY_COUNT": "128",
        "PRODUCER_PARITY": "((t >> 1) & 1) ^ 1",
        "EXPECT": "sizeof(stage[s])",
        "CONSUME": CONSUME,
    }
    for key, value in {**defaults, **changes}.items():
        text = text.replace(f"@{key}@", value)
    return text


def ring_args(ntiles=5):
    src = np.arange(ntiles * 256, dtype=np.float32)
    return {"src": src, "out": np.zeros(256, np.float32), "ntiles": ntiles}


def test_ring_kernel_is_correct_as_written():
    for seed in (0, 1, 2):
        args = ring_args()
        run(kernel(ring()), 1, args, seed=seed)
        assert (args["out"] == args["src"].reshape(5, 256).sum(axis=0)).all()


def test_deadlock_when_expect_tx_exceeds_the_copied_bytes():
    text = ring(EXPECT="sizeof(stage[s]) + 16")
    msg = interp_error(text, 1, ring_args(), "deadlock")
    wait = line_of(text, "mbarrier_wait(full[s]")
    assert f"test.ptxdsl:{wait}:" in msg
    assert "threads 64..191 (warps 2..5) wait on mbarrier full[0] for the phase of parity 0" in msg
    assert "phase 0 (parity 0, not complete): 0 of 1 arrival(s) pending, tx-count 16" in msg
    assert "16 bytes armed by expect_tx never landed" in msg


def test_deadlock_when_the_producer_first_waits_for_parity_0():
    text = ring(PRODUCER_PARITY="(t >> 1) & 1")
    msg = interp_error(text, 1, ring_args(), "deadlock")
    wait = line_of(text, "mbarrier_wait(empty[s]")
    assert f"test.ptxdsl:{wait}:" in msg
    assert "thread 0 (warp 0) waits on mbarrier empty[0] for the phase of parity 0" in msg
    assert "128 of 128 arrival(s) pending" in msg


def test_deadlock_when_the_arrival_count_exceeds_the_arriving_threads():
    text = ring(EMPTY_COUNT="256")
    msg = interp_error(text, 1, ring_args(), "deadlock")
    assert f"test.ptxdsl:{line_of(text, 'mbarrier_wait(empty[s]')}:" in msg
    assert "waits on mbarrier empty[0] for the phase of parity 0" in msg
    assert "128 of 256 arrival(s) pending" in msg


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_race_when_consumers_read_before_waiting_on_the_full_barrier(seed):
    text = ring(
        CONSUME="""let v: f32x2 = vload(stage[s, c], 2);
            mbarrier_wait(full[s], (t >> 1) & 1);"""
    )
    msg = interp_error(text, 1, ring_args(), "race", seed=seed)
    assert "race: " in msg and "stage[" in msg
    # the report points at the consumer's read and the producer's copy, wherever it caught them
    assert f"test.ptxdsl:{line_of(text, 'vload(stage')}:" in msg
    assert f"test.ptxdsl:{line_of(text, 'bulk_load(stage')}:" in msg


def test_consumers_waiting_with_a_constant_parity_race_or_hang():
    text = ring(
        CONSUME="""mbarrier_wait(full[s], 0);
            let v: f32x2 = vload(stage[s, c], 2);"""
    )
    kinds = set()
    for seed in range(4):
        with pytest.raises(InterpError) as info:
            run_quiet(kernel(text), 1, ring_args(8), seed=seed)
        kinds.add(info.value.kind)
    assert kinds <= {"race", "deadlock"} and "race" in kinds


def test_short_expect_tx_is_caught_as_a_race_or_a_hang():
    # the phase may complete while the copy's last chunk is still landing
    text = ring(EXPECT="sizeof(stage[s]) - 512")
    for seed in range(4):
        with pytest.raises(InterpError) as info:
            run_quiet(kernel(text), 1, ring_args(), seed=seed)
        assert info.value.kind in ("race", "deadlock")


STORE = """
kernel scale(src: ptr<f32>, dst: ptr<f32>) threads(128) {
    shared tile: f32[512] align 128;
    mbarrier bar count 1;
    let tid = %tid.x;
    if tid == 0 {
        mbarrier_init(bar);
        fence_mbarrier_init();
    }
    bar_sync(0);
    if tid == 0 {
        mbarrier_arrive_expect_tx(bar, sizeof(tile));
        bulk_load(tile, src[%ctaid.x * 512], bar);
    }
    mbarrier_wait(bar, 0);
    let v: f32x4 = vload(tile[tid * 4], 4);
    tile[tid * 4] = f32x4(v[0] * 2.0, v[1] * 2.0, v[2] * 2.0, v[3] * 2.0);
    @FENCE@
    if tid == 0 {
        bulk_store(dst[%ctaid.x * 512], tile);
        bulk_commit();
        @WAIT@
    }
}
"""


def store(fence="fence_proxy_async();\n    bar_sync(0);", wait="bulk_wait_read(0);") -> str:
    return STORE.replace("@FENCE@", fence).replace("@WAIT@", wait)


def store_args():
    return {"src": np.arange(1024, dtype=np.float32), "dst": np.zeros(1024, np.float32)}


def test_store_kernel_is_correct_as_written():
    args = store_args()
    run(kernel(store(wait="bulk_wait_read(0);\n        tile[0] = 1.0;")), 2, args)
    assert (args["dst"] == args["src"] * 2).all()


def test_missing_fence_proxy_async_before_a_bulk_store_is_flagged():
    text = store(fence="bar_sync(0);")
    msg = interp_error(text, 1, store_args(), "proxy-fence")
    assert f"test.ptxdsl:{line_of(text, 'bulk_store(')}:" in msg
    assert "missing proxy fence: the bulk_store issued by thread 0 reads tile[0]" in msg
    assert "has not run fence_proxy_async()" in msg
    assert f"test.ptxdsl:{line_of(text, 'tile[tid * 4] =')}:" in msg  # the write


def test_fence_after_the_barrier_is_flagged():
    msg = interp_error(
        store(fence="bar_sync(0);\n    fence_proxy_async();"), 1, store_args(), "proxy-fence"
    )
    assert "tile[4]" in msg and "thread 1 wrote it" in msg


def test_exiting_with_an_unwaited_bulk_store_is_flagged():
    text = store(wait="")
    msg = interp_error(text, 1, store_args(), "unwaited-store")
    assert f"test.ptxdsl:{line_of(text, 'bulk_store(')}:" in msg
    assert "thread 0 exits while this bulk_store is not waited for" in msg


def test_rewriting_a_bulk_store_source_before_waiting_is_a_race():
    text = store(wait="tile[0] = 1.0;\n        bulk_wait_read(0);")
    msg = interp_error(text, 1, store_args(), "race")
    assert f"test.ptxdsl:{line_of(text, 'tile[0] = 1.0')}:" in msg
    assert "writes tile[0] while a bulk_store may still read it" in msg


GENERIC = """
kernel neighbours(out: ptr<u32>) threads(64) {
    shared x: u32[64] align 16;
    x[%tid.x] = %tid.x * 3;
    @SYNC@
    out[%tid.x] = x[(%tid.x + 1) & 63];
}
"""


def test_generic_shared_accesses_race_without_a_barrier():
    out = np.zeros(64, np.uint32)
    run(kernel(GENERIC.replace("@SYNC@", "bar_sync(0);")), 1, {"out": out})
    assert (out == (np.arange(64) + 1) % 64 * 3).all()
    for seed in (0, 1):
        msg = interp_error(GENERIC.replace("@SYNC@", ""), 1, {"out": out}, "race", seed=seed)
        assert "nothing orders" in msg and "x[" in msg


def test_deadlock_at_a_cta_barrier_after_threads_exited():
    text = """
    kernel early(out: ptr<u32>) threads(64) {
        if %tid.x >= 32 {
            return;
        }
        bar_sync(0);
        out[%tid.x] = 1;
    }
    """
    msg = interp_error(text, 1, {"out": np.zeros(64, np.uint32)}, "deadlock")
    assert f"test.ptxdsl:{line_of(text, 'bar_sync')}:" in msg
    assert "threads 0..31 (warp 0) wait at barrier 0 for 64 threads, but only 32 arrived" in msg
    assert "threads 32..63 have exited" in msg
    out = np.zeros(64, np.uint32)
    run(kernel(text.replace("bar_sync(0)", "bar_sync(1, 32)")), 1, {"out": out})
    assert out.tolist() == [1] * 32 + [0] * 32


def test_deadlock_when_a_warp_diverges_around_a_shuffle():
    text = """
    kernel diverge(out: ptr<u32>) threads(32) {
        let v = %laneid;
        if %laneid < 16 {
            v = shfl_xor(v, 1);
        }
        bar_sync(0);
        out[%laneid] = v;
    }
    """
    msg = interp_error(text, 1, {"out": np.zeros(32, np.uint32)}, "deadlock")
    assert f"test.ptxdsl:{line_of(text, 'shfl_xor')}:" in msg
    assert "threads 0..15 (warp 0) wait in shfl_xor()" in msg
    assert "threads 16..31 never reach it" in msg


MBAR = """
kernel mbar(out: ptr<u32>) threads(64) {
    mbarrier bar count 1;
    @BODY@
}
"""


def test_too_many_arrivals_in_a_phase():
    body = """if %tid.x == 0 {
        mbarrier_init(bar);
        mbarrier_arrive_expect_tx(bar, 1024);
        mbarrier_arrive(bar);
    }"""
    msg = interp_error(MBAR.replace("@BODY@", body), 1, {"out": np.zeros(1, np.uint32)}, "mbarrier")
    assert "too many arrivals: thread 0 arrives on bar with count 1" in msg
    assert "0 of 1 arrival(s) pending, tx-count 1024" in msg


def test_waiting_on_an_uninitialised_barrier():
    msg = interp_error(
        MBAR.replace("@BODY@", "mbarrier_wait(bar, 1);"),
        1,
        {"out": np.zeros(1, np.uint32)},
        "mbarrier",
    )
    assert "waits on mbarrier bar, which is not initialised" in msg


def test_using_a_barrier_before_its_initialisation_is_visible():
    body = """if %tid.x == 0 {
        mbarrier_init(bar);
    }
    mbarrier_wait(bar, 1);"""
    for seed in (0, 1, 2):
        msg = interp_error(
            MBAR.replace("@BODY@", body), 1, {"out": np.zeros(1, np.uint32)}, "mbarrier", seed=seed
        )
        assert "not initialised" in msg or "before its initialisation is visible" in msg


def test_tx_count_beyond_the_hardware_range():
    body = """if %tid.x == 0 {
        mbarrier_init(bar);
        mbarrier_expect_tx(bar, 1000000);
        mbarrier_expect_tx(bar, 100000);
    }"""
    msg = interp_error(MBAR.replace("@BODY@", body), 1, {"out": np.zeros(1, np.uint32)}, "mbarrier")
    assert "tx-count of mbarrier bar would become 1100000 bytes" in msg


def test_fresh_barrier_parity_1_passes_and_parity_0_waits_for_phase_0():
    body = """if %tid.x == 0 {
        mbarrier_init(bar);
        fence_mbarrier_init();
    }
    bar_sync(0);
    mbarrier_wait(bar, 1);
    out[0] = 1;
    bar_sync(0);
    if %tid.x == 0 {
        mbarrier_arrive(bar);
    }
    mbarrier_wait(bar, 0);
    out[1] = 2;"""
    out = np.zeros(2, np.uint32)
    run(kernel(MBAR.replace("@BODY@", body)), 1, {"out": out})
    assert out.tolist() == [1, 2]


def test_step_limit_reports_the_runaway_loop():
    text = """
    kernel spin(out: ptr<u32>) threads(32) {
        let i: u32 = 0;
        while true {
            i = i + 1;
        }
    }
    """
    msg = interp_error(text, 1, {"out": np.zeros(1, np.uint32)}, "step-limit", max_steps=2000)
    assert f"test.ptxdsl:{line_of(text, 'while true')}:" in msg
    assert "still running this loop" in msg


def test_out_of_bounds_and_division_by_zero_are_located():
    text = """
    kernel oob(out: ptr<u32>, n: u32) threads(32) {
        shared x: u32[16] align 16;
        @STMT@
    }
    """
    args = {"out": np.zeros(32, np.uint32), "n": 0}
    msg = interp_error(text.replace("@STMT@", "out[%tid.x + 1] = 1;"), 1, args, "bounds")
    assert "reaches element 32 of 'out', which has 32 elements" in msg
    msg = interp_error(text.replace("@STMT@", "x[%tid.x] = 1;"), 1, args, "bounds")
    assert "is out of range for dimension 0 of 'x' (size 16)" in msg
    msg = interp_error(text.replace("@STMT@", "out[0] = 7 / n;"), 1, args, "arithmetic")
    assert "test.ptxdsl:4:" in msg and "integer division by zero" in msg


def test_reading_unwritten_shared_memory_warns():
    text = """
    kernel garbage(out: ptr<u32>) threads(32) {
        shared x: u32[32] align 16;
        out[%tid.x] = x[%tid.x];
    }
    """
    with pytest.warns(
        InterpWarning,
        match=r"test.ptxdsl:4:\d+: thread \d+ reads x\[\d+\], "
        "which nothing has written",
    ):
        run(kernel(text), 1, {"out": np.zeros(32, np.uint32)})


def test_launch_problems():
    k = kernel("kernel k(a: ptr<f32>, n: u32) threads(32) { }")
    with pytest.raises(LaunchError, match="missing argument 'n'"):
        run(k, 1, {"a": np.zeros(4, np.float32)})
    with pytest.raises(LaunchError, match="'a' is a float64 array; ptr<f32> needs float32"):
        run(k, 1, {"a": np.zeros(4), "n": 1})
    with pytest.raises(LaunchError, match="not divisible by the cluster shape"):
        run(kernel("kernel c() threads(32) cluster(2) { }"), 3, {})
    big = kernel("kernel big() threads(32) { shared a: u8[232000] align 1024; }")
    with pytest.raises(LaunchError, match="a CTA has at most 232448"):
        run(big, 1, {})


# ----------------------------------------------------------------------------- tensor copies

TILE_IN = """
kernel tile_in(src: tmap<f32, 2>, out: ptr<f32>, x: s32, y: s32) threads(64) {
    shared t: f32[@R@][@C@] align @ALIGN@;
    mbarrier bar count 1;
    if %tid.x == 0 {
        mbarrier_init(bar);
        fence_mbarrier_init();
    }
    bar_sync(0);
    if %tid.x == 0 {
        mbarrier_arrive_expect_tx(bar, sizeof(t));
        tma_load(t, src, [x, y], bar);
    }
    mbarrier_wait(bar, 0);
    for i in 0 .. 4 {
        let e = %tid.x * 4 + i;
        out[e] = t[e / @C@, e % @C@];
    }
}
"""


def tile_in(rows: int, cols: int, align: int = 1024) -> str:
    return (
        TILE_IN.replace("@R@", str(rows)).replace("@C@", str(cols)).replace("@ALIGN@", str(align))
    )


def swizzled_image(box: np.ndarray, swizzle: str) -> np.ndarray:
    """What a swizzled box looks like in shared memory read linearly: within every 128-byte
    line L, 16-byte chunk c moves to chunk c ^ (L mod k), k = 8, 4, 2 for 128B, 64B, 32B."""
    k = {"none": 1, "32B": 2, "64B": 4, "128B": 8}[swizzle]
    lines = box.reshape(-1).view(np.uint8).reshape(-1, 8, 16)
    image = np.empty_like(lines)
    for line in range(lines.shape[0]):
        for c in range(8):
            image[line, c ^ (line % k)] = lines[line, c]
    return image.reshape(-1).view(np.float32)


@pytest.mark.parametrize(
    "swizzle, rows, cols", [("none", 8, 32), ("128B", 8, 32), ("64B", 16, 16), ("32B", 32, 8)]
)
def test_tma_load_box_and_swizzle(swizzle, rows, cols):
    a = np.arange(40 * 48, dtype=np.float32).reshape(40, 48)
    out = np.zeros(256, np.float32)
    tm = TensorMapModel(a, (rows, cols), swizzle=swizzle)
    run(kernel(tile_in(rows, cols)), 1, {"src": tm, "out": out, "x": 8, "y": 4})
    box = a[4 : 4 + rows, 8 : 8 + cols]  # coordinates are innermost first: x is the column
    assert (out == swizzled_image(box, swizzle)).all()


@pytest.mark.parametrize("fill", ["zero", "nan"])
def test_tma_load_fills_out_of_bounds_elements(fill):
    a = np.arange(1, 1 + 10 * 20, dtype=np.float32).reshape(10, 20)
    out = np.zeros(256, np.float32)
    tm = TensorMapModel(a, (8, 32), oob_fill=fill)
    run(kernel(tile_in(8, 32)), 1, {"src": tm, "out": out, "x": -4, "y": 6})
    want = np.full((8, 32), 0.0 if fill == "zero" else np.nan, np.float32)
    want[:4, 4:24] = a[6:10, 0:20]
    np.testing.assert_array_equal(out.reshape(8, 32), want)


def test_tma_load_into_underaligned_shared_memory_is_flagged():
    tm = TensorMapModel(np.zeros((8, 32), np.float32), (8, 32))
    msg = interp_error(
        tile_in(8, 32, align=64),
        1,
        {"src": tm, "out": np.zeros(256, np.float32), "x": 0, "y": 0},
        "alignment",
    )
    assert "tma_load needs 128-byte aligned shared memory" in msg


TILE_COPY = """
kernel tile_copy(src: tmap<f32, 2>, dst: tmap<f32, 2>, x: s32, y: s32, x2: s32, y2: s32)
        threads(32) {
    shared t: f32[8][32] align 1024;
    mbarrier bar count 1;
    if %tid.x == 0 {
        mbarrier_init(bar);
        fence_mbarrier_init();
        mbarrier_arrive_expect_tx(bar, sizeof(t));
        tma_load(t, src, [x, y], bar);
        mbarrier_wait(bar, 0);
        tma_store(dst, [x2, y2], t);
        bulk_commit();
        bulk_wait(0);
    }
}
"""


@pytest.mark.parametrize("swizzle", ["none", "32B", "64B", "128B"])
def test_tma_store_undoes_the_swizzle_and_clips_at_the_edge(swizzle):
    a = np.arange(16 * 64, dtype=np.float32).reshape(16, 64)
    d = np.zeros((12, 40), np.float32)
    box = (8, 32) if swizzle in ("none", "128B") else (8, {"64B": 16, "32B": 8}[swizzle])
    k = kernel(TILE_COPY.replace("f32[8][32]", f"f32[{box[0]}][{box[1]}]"))
    run(
        k,
        1,
        {
            "src": TensorMapModel(a, box, swizzle=swizzle),
            "dst": TensorMapModel(d, box, swizzle=swizzle),
            "x": 4,
            "y": 2,
            "x2": 36,
            "y2": 6,
        },
    )
    want = np.zeros_like(d)
    part = a[2 : 2 + box[0], 4 : 4 + box[1]]
    want[6:12, 36:40] = part[: 12 - 6, : 40 - 36]
    assert (d == want).all()


def test_a_tma_load_off_a_16_byte_boundary_of_its_row_is_an_error():
    """The H200 traps (CUDA_ERROR_ILLEGAL_INSTRUCTION) on a tile load whose innermost
    coordinate is not a multiple of 16 bytes (f32 at 1, 2, 3 faulted; 4 and up loaded:
    2026-11-28, GPU_RUNS.md)."""
    a = np.arange(16 * 64, dtype=np.float32).reshape(16, 64)
    k = kernel(TILE_COPY)
    maps = {"src": TensorMapModel(a, (8, 32)), "dst": TensorMapModel(np.zeros((12, 40), np.float32),
                                                                       (8, 32))}
    with pytest.raises(InterpError, match="innermost coordinate of tma_load is 3, 12 bytes"):
        run(k, 1, {**maps, "x": 3, "y": 2, "x2": 0, "y2": 0})


# ----------------------------------------------------------------------------- semantics


def test_integer_arithmetic_wraps_and_divides_toward_zero():
    text = """
    kernel arith(a: ptr<s32>, b: ptr<s32>, ua: ptr<u32>, ub: ptr<u32>, sh: ptr<u32>,
                 out: ptr<s32>, uout: ptr<u32>) threads(32) {
        let i = %tid.x;
        let x = a[i];
        let y = b[i];
        out[i * 5 + 0] = x + y;
        out[i * 5 + 1] = x * y;
        out[i * 5 + 2] = x / y;
        out[i * 5 + 3] = x % y;
        out[i * 5 + 4] = x >> sh[i];
        uout[i * 5 + 0] = ua[i] - ub[i];
        uout[i * 5 + 1] = ua[i] * ub[i];
        uout[i * 5 + 2] = ua[i] / ub[i];
        uout[i * 5 + 3] = ua[i] << sh[i];
        uout[i * 5 + 4] = ua[i] >> sh[i];
    }
    """
    rng = np.random.default_rng(7)
    edge = [-(2**31), -(2**31), 2**31 - 1, -7, 7, -7, 7, -1]
    a = np.array(edge + list(rng.integers(-(2**31), 2**31, 24)), np.int64)
    b = np.array([-1, 1, 2, 2, -2, -2, 2, 3] + list(rng.integers(1, 2**31, 24)), np.int64)
    b[8::2] *= -1
    ua = rng.integers(0, 2**32, 32, dtype=np.uint64)
    ub = rng.integers(1, 2**32, 32, dtype=np.uint64)
    sh = np.array([0, 1, 31, 32, 33, 40, 255, 5] * 4, np.uint32)
    out, uout = np.zeros(160, np.int32), np.zeros(160, np.uint32)
    run(
        kernel(text),
        1,
        {
            "a": a.astype(np.int32),
            "b": b.astype(np.int32),
            "ua": ua.astype(np.uint32),
            "ub": ub.astype(np.uint32),
            "sh": sh,
            "out": out,
            "uout": uout,
        },
    )

    def s32(v):
        return (int(v) + 2**31) % 2**32 - 2**31

    for i in range(32):
        x, y, s = int(a[i]), int(b[i]), int(sh[i])
        q = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
        assert out[i * 5 : i * 5 + 5].tolist() == [
            s32(x + y),
            s32(x * y),
            s32(q),
            x - y * q,
            x >> min(s, 31),
        ], i
        u, v = int(ua[i]), int(ub[i])
        assert uout[i * 5 : i * 5 + 5].tolist() == [
            (u - v) % 2**32,
            u * v % 2**32,
            u // v,
            (u << s) % 2**32 if s < 32 else 0,
            u >> s if s < 32 else 0,
        ], i


def test_casts_truncate_saturate_and_round_to_nearest_even():
    text = """
    kernel casts(x: ptr<f32>, big: ptr<u32>, i32: ptr<s32>, u32v: ptr<u32>, h: ptr<bf16>,
                 f16v: ptr<f16>, bigf: ptr<f32>) threads(64) {
        let i = %tid.x;
        let v = x[i];
        i32[i] = v as s32;
        u32v[i] = v as u32;
        h[i] = v as bf16;
        f16v[i] = v as f16;
        bigf[i] = big[i] as f32;
    }
    """
    ties = np.array(
        [
            0x3F808000,
            0x3F818000,
            0x3F817FFF,
            0x7F7FFFFF,
            0xBF808000,
            0x00018000,
            0x477FF000,
            0x7F800000,
        ],
        np.uint32,
    ).view(np.float32)
    specials = np.array([np.nan, -np.inf, -2.5, -0.5, 0.5, 2.5, 3e9, 5e9], np.float32)
    rng = np.random.default_rng(3)
    x = np.concatenate([ties, specials, rng.standard_normal(48).astype(np.float32) * 1e5])
    big = np.array([2**24 + 1, 2**24 + 3, 2**32 - 1, 2**31 + 2**7] * 16, np.uint32)
    outs = {
        "i32": np.zeros(64, np.int32),
        "u32v": np.zeros(64, np.uint32),
        "h": np.zeros(64, np.uint16),
        "f16v": np.zeros(64, np.float16),
        "bigf": np.zeros(64, np.float32),
    }
    with np.errstate(invalid="ignore", over="ignore"):
        run(kernel(text), 1, {"x": x, "big": big, **outs})
        trunc = np.nan_to_num(np.trunc(x.astype(np.float64)), nan=0.0, posinf=2e10, neginf=-2e10)
        assert (outs["i32"] == np.clip(trunc, -(2**31), 2**31 - 1)).all()
        assert (outs["u32v"] == np.clip(trunc, 0, 2**32 - 1)).all()
        finite = ~np.isnan(x)
        assert (outs["h"][finite] == f32_to_bf16_bits(x)[finite]).all()
        assert np.isnan(bf16_bits_to_f32(outs["h"][~finite])).all()
        np.testing.assert_array_equal(outs["f16v"], x.astype(np.float16))
    assert (outs["bigf"] == big.astype(np.float32)).all()
    assert outs["h"][:3].tolist() == [0x3F80, 0x3F82, 0x3F81]  # ties to even


def test_bf16_arithmetic_rounds_each_result_to_bf16():
    text = """
    kernel bf(a: ptr<bf16>, b: ptr<bf16>, s: ptr<bf16>, p: ptr<bf16>) threads(64) {
        s[%tid.x] = a[%tid.x] + b[%tid.x];
        p[%tid.x] = a[%tid.x] * b[%tid.x];
    }
    """
    rng = np.random.default_rng(5)
    a = f32_to_bf16_bits(rng.standard_normal(64).astype(np.float32))
    b = f32_to_bf16_bits(rng.standard_normal(64).astype(np.float32) * 300)
    s, p = np.zeros(64, np.uint16), np.zeros(64, np.uint16)
    run(kernel(text), 1, {"a": a, "b": b, "s": s, "p": p})
    fa, fb = bf16_bits_to_f32(a), bf16_bits_to_f32(b)
    # an f32 result of two bf16 values, rounded again to bf16, is the correctly rounded one
    assert (s == f32_to_bf16_bits(fa + fb)).all()
    assert (p == f32_to_bf16_bits(fa * fb)).all()


def test_float_compare_is_ordered_and_intrinsics_are_exact():
    text = """
    kernel fl(x: ptr<f32>, y: ptr<f32>, ne: ptr<u32>, e: ptr<f32>, r: ptr<f32>) threads(8) {
        let i = %tid.x;
        ne[i] = select(x[i] != y[i], 1, 0);
        e[i] = ex2(x[i]);
        r[i] = rsqrt(y[i]);
    }
    """
    x = np.array([1.0, np.nan, 2.0, -3.5, 0.25, 200.0, -130.0, -126.0], np.float32)
    y = np.array([1.0, 1.0, np.nan, 4.0, 0.0, -1.0, 2.0, 3.0], np.float32)
    ne, e, r = np.zeros(8, np.uint32), np.zeros(8, np.float32), np.zeros(8, np.float32)
    run(kernel(text), 1, {"x": x, "y": y, "ne": ne, "e": e, "r": r})
    assert ne.tolist() == [0, 0, 0, 1, 1, 1, 1, 1]  # setp.ne is false on NaN
    with np.errstate(all="ignore"):
        exact = np.exp2(x.astype(np.float64)).astype(np.float32)
        # ex2.approx.ftz: 2^-130 would be subnormal and flushes to 0; 2^-126 is kept
        np.testing.assert_array_equal(e, np.where(exact < 2.0**-126, 0.0, exact))
        assert e[6] == 0.0 and e[7] == 2.0**-126
        np.testing.assert_array_equal(r, (1 / np.sqrt(y.astype(np.float64))).astype(np.float32))


def test_vector_loads_and_stores():
    text = """
    kernel vec(g: ptr<bf16>, out: ptr<f32>) threads(16) {
        shared s: f32[64] align 16;
        let i = %tid.x;
        let v: bf16x8 = vload(g[i * 8], 8);
        let w: f32x4;
        for j in 0 .. 4 unroll {
            w[j] = v[2 * j] as f32 + v[2 * j + 1] as f32;
        }
        s[i * 4] = w;
        bar_sync(0);
        let u: f32x4 = vload(s[(i * 4 + 4) & 63], 4);
        for j in 0 .. 4 unroll {
            out[i * 4 + j] = u[j];
        }
    }
    """
    g = f32_to_bf16_bits(np.arange(128, dtype=np.float32) / 8)
    out = np.zeros(64, np.float32)
    run(kernel(text), 1, {"g": g, "out": out})
    pairs = bf16_bits_to_f32(g).reshape(64, 2).sum(axis=1)
    assert (out == np.roll(pairs, -4)).all()
    bad = text.replace("vload(g[i * 8], 8)", "vload(g[i * 8 + 1], 8)")
    msg = interp_error(bad, 1, {"g": g, "out": out}, "alignment")
    assert re.search(r"load at byte \d+ of 'g' is not aligned to 16 bytes", msg)


def test_shuffles_match_shfl_sync_semantics():
    text = """
    kernel shuffles(out: ptr<u32>) threads(64) {
        let v = %tid.x * 10;
        let b = %tid.x * 4;
        out[b] = shfl_xor(v, 5);
        out[b + 1] = shfl_down(v, 3);
        out[b + 2] = shfl_up(v, 2);
        out[b + 3] = shfl_idx(v, 39);
    }
    """
    out = np.zeros(256, np.uint32)
    run(kernel(text), 1, {"out": out})
    tid = np.arange(64)
    lane, base = tid % 32, tid - tid % 32
    down = np.where(lane + 3 < 32, tid + 3, tid)
    up = np.where(lane >= 2, tid - 2, tid)
    want = np.stack([(base + (lane ^ 5)) * 10, down * 10, up * 10, (base + 7) * 10], axis=1)
    assert (out.reshape(64, 4) == want).all()


def test_elect_picks_the_lowest_live_lane_of_each_warp():
    text = """
    kernel leaders(out: ptr<u32>) threads(96) {
        if %warp > 0 && %laneid < %warp * 3 {
            return;
        }
        if elect() {
            out[%warp] = out[%warp] + %laneid + 1;
        }
    }
    """
    out = np.zeros(3, np.uint32)
    run(kernel(text), 1, {"out": out})
    assert out.tolist() == [1, 4, 7]  # exactly one leader per warp: lanes 0, 3, 6


def test_for_loops_evaluate_bounds_once_and_exclude_stop():
    text = """
    kernel loops(n: u32, neg: s32, out: ptr<u32>) threads(1) {
        let k: u32 = 0;
        for i in 3 .. n step 4 {
            out[k] = i;
            k = k + 1;
        }
        out[10] = k;
        let m = n;
        let trips: u32 = 0;
        for i in 0 .. m {
            m = m + 1;
            trips = trips + 1;
        }
        out[11] = trips;
        let down: u32 = 0;
        for j in (10 as s32) .. -1 step -3 {
            down = down * 100 + j as u32;
        }
        out[12] = down;
        let none: u32 = 0;
        for i in n .. 5 {
            none = none + 1;
        }
        out[13] = none;
        let varstep: u32 = 0;
        for j in (10 as s32) .. 0 step neg {
            varstep = varstep + 1;
        }
        out[14] = varstep;
    }
    """
    out = np.zeros(15, np.uint32)
    run(kernel(text), 1, {"n": 17, "neg": -1, "out": out})
    assert out[:4].tolist() == [3, 7, 11, 15] and out[10] == 4
    assert out[11] == 17  # stop was read once
    assert out[12] == 10070401  # 10, 7, 4, 1
    assert out[13] == 0
    assert out[14] == 0  # a variable step compares with >=, as the emitter does


def test_warp_reduction_with_shuffles():
    text = """
    kernel wsum(x: ptr<f32>, out: ptr<f32>) threads(64) {
        let v = x[%tid.x];
        for s in 0 .. 5 unroll {
            v = v + shfl_xor(v, 16 >> s);
        }
        if %laneid == 0 {
            out[%warp] = v;
        }
    }
    """
    x = np.arange(64, dtype=np.float32)
    out = np.zeros(2, np.float32)
    run(kernel(text), 1, {"x": x, "out": out})
    assert out.tolist() == [math.fsum(range(32)), math.fsum(range(32, 64))]


def test_python_api_kernels_run_and_errors_point_at_the_python_line():
    twin = sample_module("add_one")
    ex = twin.example(np.random.default_rng(0), nchunks=2)
    out = run_sample(twin.add_one, ex, seed=5)
    assert (out["dst"] == ex["expected"]["dst"]).all()

    @ptxdsl.kernel(threads=32)
    def hang(k, out: ptxdsl.ptr(ptxdsl.u32)):
        bar = k.mbarrier("bar", count=2)
        with k.if_(k.tid.x == 0):
            k.mbarrier_init(bar)
            k.fence_mbarrier_init()
        k.bar_sync(0)
        with k.if_(k.tid.x == 0):
            k.mbarrier_arrive(bar)
        k.mbarrier_wait(bar, 0)  # one arrival of two: never completes

    with pytest.raises(InterpError) as info:
        run(hang, 1, {"out": np.zeros(1, np.uint32)})
    line = hang.ir.body[-1].loc.line
    assert f"test_interp.py:{line}:" in str(info.value)
    assert "1 of 2 arrival(s) pending" in str(info.value)


BROKEN = Path(__file__).parents[1] / "broken"
INTERP_CASES = [p for p in sorted(BROKEN.glob("*.ptxdsl"))
                if "// caught-by: interp" in p.read_text()]


@pytest.mark.parametrize("path", INTERP_CASES, ids=lambda p: p.stem)
def test_interp_catches_broken_corpus_kernel(path):
    """The corpus kernels that a run shows (some of which the verifier also decides): the
    interpreter names the bug (kind from `// expect:`) at the marked line."""
    text = path.read_text()
    expect = re.search(r"// expect: (\S+)", text).group(1)
    line = next(i for i, s in enumerate(text.split("\n"), 1) if s.rstrip().endswith("// <- here"))
    k = ptxdsl.parse(text, path.name).kernels[0]
    rng = np.random.default_rng(0)
    args = {"src": rng.standard_normal(2 * 5 * 512).astype(np.float32),
            "out": np.zeros(2 * 512, np.float32), "ntiles": 5}
    with pytest.raises(InterpError) as e:
        run_quiet(k, 2, args, seed=0)
    assert e.value.kind == expect, str(e.value)
    assert f"{path.name}:{line}:" in str(e.value)


def test_swizzled_tensor_map_into_a_tile_aligned_for_no_swizzle_is_flagged():
    """A tile declared without swizzle is checked against the map's swizzle when it runs:
    128-byte alignment is enough without swizzle, a 128B-swizzled map needs 1024."""
    a = np.arange(40 * 48, dtype=np.float32).reshape(40, 48)
    out = np.zeros(256, np.float32)
    plain = TensorMapModel(a, (8, 32))
    run(kernel(tile_in(8, 32, align=128)), 1, {"src": plain, "out": out, "x": 8, "y": 4})
    assert (out == a[4:12, 8:40].reshape(-1)).all()
    msg = interp_error(tile_in(8, 32, align=128), 1,
                       {"src": TensorMapModel(a, (8, 32), swizzle="128B"), "out": out,
                        "x": 8, "y": 4}, "alignment")
    assert "tma_load needs 1024-byte aligned shared memory" in msg, msg
