"""The gemm op's deterministic split-K candidate at 128 to 256 rows (ptxdsl/torch/gemm.py
`splitk_runner`: gemm_splitk's two-kernel form, each range's partial into a slot of its own,
the slots summed in slot order). Without a GPU: a plan whose tuner chooses it runs it, with
a fused epilogue after it in PyTorch (a stand-in GEMM on the CPU); a shape whose tiles get one
range each is declined. With one: against torch's
f32 reference on fresh random data (M 128, 200, 256 at N 4096 x K 4096, ragged K, ragged N
and M over the tiles), bit-identical repeats, new inputs under one plan, a CUDA-graph
replay, the fused epilogues, and the op's tuning timing the candidate."""

from __future__ import annotations

import importlib
import json

import pytest
from conftest import same_bits_thrice


def _forced(monkeypatch, gemm, mp, epilogue):
    """smallm_tuner(mp, epilogue) choosing the split-K config, whatever the shape."""
    from ptxdsl.torch.kernels import SPLITK_CONFIGS

    tuner = gemm.smallm_tuner(mp, epilogue)
    monkeypatch.setattr(tuner, "choose", lambda *a, **kw: SPLITK_CONFIGS[0])
    return SPLITK_CONFIGS[0]


@pytest.mark.parametrize("epilogue", [None, "residual", "silu_mul"])
def test_a_split_k_choice_runs_the_split_k_runner(ops, torch, monkeypatch, epilogue):
    """Up to 256 rows a tuner's split-K choice goes to splitk_runner (here a stand-in
    computing A B^T on the CPU), and a fused epilogue follows it in PyTorch."""
    gemm = importlib.import_module("ptxdsl.torch.gemm")  # ptxdsl.torch.gemm is the op
    config = _forced(monkeypatch, gemm, 256, epilogue)
    seen = []

    def stand_in(config, a, b):
        seen.append(config)

        def run(tensors, out, stream):
            out.copy_(tensors[0].float() @ tensors[1].float().T)
        return run

    monkeypatch.setattr(gemm, "splitk_runner", stand_in)
    monkeypatch.setattr(gemm, "smallm_runner", lambda *a, **kw: pytest.fail("decode kernel"))
    monkeypatch.setattr(gemm.autotune, "tuning_allowed", lambda: True)  # asks CUDA
    g = torch.Generator().manual_seed(3)
    a = torch.randn(200, 64, generator=g).to(torch.bfloat16)
    w = torch.randn(48, 64, generator=g).to(torch.bfloat16)
    c = (a.float() @ w.float().T).to(torch.bfloat16)
    args, tensors, want = {"a": a, "b": w, "residual": None}, (a, w), c
    if epilogue == "residual":
        r = torch.randn(200, 48, generator=g).to(torch.bfloat16)
        args, tensors, want = {"a": a, "b": w, "residual": r}, (a, w, r), c + r
    elif epilogue == "silu_mul":
        gate = torch.cat([c[:, :8], c[:, 16:24], c[:, 32:40]], 1).float()
        up = torch.cat([c[:, 8:16], c[:, 24:32], c[:, 40:48]], 1).float()
        want = (torch.nn.functional.silu(gate) * up).to(torch.bfloat16)
    out = torch.empty(want.shape, dtype=torch.bfloat16)
    gemm.fused_plan(args, out, 0, epilogue)(tensors, out, 0)
    assert seen == [config]
    assert torch.equal(out, want)


@pytest.mark.parametrize("m, n, k", [(256, 33792, 4096), (256, 4096, 448)])
def test_one_range_a_tile_is_no_split_k_candidate(ops, torch, monkeypatch, m, n, k):
    """264 tiles fill 132 SMs twice; 7 K steps make no two ranges of four: the runner
    declines (the tuner skips a candidate that raises) before it builds anything."""
    gemm = importlib.import_module("ptxdsl.torch.gemm")
    from ptxdsl.torch.kernels import SPLITK_CONFIGS

    monkeypatch.setattr(gemm, "launchable", lambda *a: (None, 132))
    a, b = (torch.empty(r, k, dtype=torch.bfloat16, device="meta") for r in (m, n))
    with pytest.raises(ValueError, match=f"^gemm: split-K of {m} x {n} x {k} over 132 CTAs "
                                         "takes one range a tile"):
        gemm.splitk_runner(SPLITK_CONFIGS[0], a, b)


# ----------------------------------------------------------------------------- GPU


def _operands(torch, m, n, k, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    w = torch.randn(n, k, device="cuda", generator=g).to(torch.bfloat16)
    return a, w


def _nan(torch, m, n):
    return torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)


# (M, N, K): the decode sizes (4 ranges at 2 tile-rows, 8 at one), K off the 64-wide
# step (65 K steps in ranges of 16 and 17), N off the 256-wide tile, M off the 128-row tile
SHAPES = [(128, 4096, 4096), (200, 4096, 4096), (256, 4096, 4096), (256, 4096, 4104),
          (200, 1000, 1048), (136, 4096, 14336)]


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_split_k_matches_torch_and_repeats_bit_for_bit(ops, torch, cuda, m, n, k):
    from bench.common import gemm_error
    from ptxdsl.torch.gemm import splitk_runner
    from ptxdsl.torch.kernels import SPLITK_CONFIGS

    a, w = _operands(torch, m, n, k, seed=m + n + k)
    run = splitk_runner(SPLITK_CONFIGS[0], a, w)
    stream = torch.cuda.current_stream().cuda_stream
    same_bits_thrice(torch, run, (a, w), stream, m, n)
    a2, w2 = _operands(torch, m, n, k, seed=m + n + k + 1)  # new memory, the same plan
    c = _nan(torch, m, n)
    run((a2, w2), c, stream)
    torch.cuda.synchronize()
    assert gemm_error(c, a2, w2) <= 1.0


@pytest.mark.gpu
def test_split_k_replays_from_a_cuda_graph_on_new_inputs(ops, torch, cuda):
    """Captured on a side stream after one eager call (its workspace then from the graph's
    pool), replayed after the inputs change in place."""
    from bench.common import gemm_error
    from ptxdsl.torch.gemm import splitk_runner
    from ptxdsl.torch.kernels import SPLITK_CONFIGS

    m, n, k = 256, 4096, 4096
    a, w = _operands(torch, m, n, k, seed=11)
    run = splitk_runner(SPLITK_CONFIGS[0], a, w)
    c = _nan(torch, m, n)
    run((a, w), c, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        run((a, w), c, torch.cuda.current_stream().cuda_stream)
    fresh_a, fresh_w = _operands(torch, m, n, k, seed=12)
    a.copy_(fresh_a)
    w.copy_(fresh_w)
    c.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert gemm_error(c, a, w) <= 1.0


@pytest.mark.gpu
@pytest.mark.parametrize("epilogue", [None, "residual", "silu_mul"])
def test_fused_plans_chosen_split_k_match_torch(ops, torch, cuda, monkeypatch, epilogue):
    """The gemm and gemm_silu_mul plans at 200 rows with the split-K config chosen: C, C + R,
    silu(gate) * up of the interleaved gate-up weight, against torch's f32 math."""
    from bench.common import ref_error

    gemm = importlib.import_module("ptxdsl.torch.gemm")
    _forced(monkeypatch, gemm, 256, epilogue)
    m, n, k = 200, 4096, 4096
    g = torch.Generator(device="cuda").manual_seed(21)
    a = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).to(torch.bfloat16)
    prod = a.float() @ w.float().T
    stream = torch.cuda.current_stream().cuda_stream
    if epilogue == "silu_mul":
        wi = ops.interleave_gate_up(w)
        out = _nan(torch, m, n // 2)
        gemm.fused_plan({"a": a, "b": wi}, out, stream, epilogue)((a, wi), out, stream)
        torch.cuda.synchronize()
        gate, up = prod.split(n // 2, 1)
        want = torch.nn.functional.silu(gate) * up
        tol = 2 ** -7 * (gate.abs() + 1) * (up.abs() + 1)
        assert float(((out.float() - want).abs() / tol).max()) <= 1.0
        return
    r = torch.randn(m, n, device="cuda", generator=g).to(torch.bfloat16) \
        if epilogue == "residual" else None
    tensors = (a, w) if r is None else (a, w, r)
    out = _nan(torch, m, n)
    gemm.fused_plan({"a": a, "b": w, "residual": r}, out, stream, epilogue)(
        tensors, out, stream)
    torch.cuda.synchronize()
    assert ref_error(out, prod if r is None else prod + r.float(), k) <= 1.0


@pytest.mark.gpu
def test_the_op_times_the_split_k_candidate(ops, torch, cuda, gpu_cache):
    """The op at 200 rows tunes among the decode, dense and split-K configs (each timed from
    a CUDA graph): its result matches torch, and the split-K candidate ran and matched the
    default's output (a time on disk: a failing or differing candidate gets none)."""
    from bench.common import gemm_error
    from ptxdsl.tools.autotune import config_text
    from ptxdsl.torch.gemm import smallm_tuner
    from ptxdsl.torch.kernels import SPLITK_CONFIGS

    m, n, k = 200, 3072, 4104  # a shape no other test tunes (the choice is per process)
    a, w = _operands(torch, m, n, k, seed=31)
    c = torch.ops.ptxdsl.gemm(a, w)
    torch.cuda.synchronize()
    assert gemm_error(c, a, w) <= 1.0
    tuner = smallm_tuner(256)
    entries = [e for key, e in tuner.cache.entries(tuner.op).items()
               if json.loads(key)["shape"] == [256, n, k]]
    assert len(entries) == 1, "the shape was not tuned under this module's cache"
    assert config_text(SPLITK_CONFIGS[0]) in entries[0]["ms"], entries[0]["ms"]
