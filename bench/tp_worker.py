"""One rank of `python -m bench tp` (started by torchrun; bench/tp.py starts it): the fused
tensor-parallel layers of samples/tp_linear.py against what a PyTorch user runs, in the same
job, every result checked against NCCL + torch before it is timed.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
        torchrun --nproc-per-node 2 -m bench.tp_worker --json out.json [--quick]

Rank 0 writes the medians (ms per layer call, CUDA events on each rank's stream, calls queued
behind a sleep kernel; the slower rank's median counts) as JSON."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "samples"))

# (name, M tokens in all, K, N in all): Llama-70B-like layers, tensor-parallel over `world`
AG_SHAPES = [("gate-up, 8192 tokens", 8192, 8192, 28672), ("gate-up, decode 256 tokens", 256,
                                                            8192, 28672)]
RS_SHAPES = [("down, 8192 tokens", 8192, 28672, 8192), ("down, decode 256 tokens", 256, 28672,
                                                       8192)]
# (M tokens, N, K in all): GEMM + all-reduce at decode, row-parallel (K split across ranks):
# an MLP down projection (N 4096, K 14336) and an attention output projection (7168 x 8192)
GAR_SHAPES = [(m, n, k) for n, k in ((4096, 14336), (7168, 8192)) for m in (1, 16, 64, 256)]


def timed(fn: Any, reps: int, batch: int = 4) -> float:
    """Median ms per call over `reps` intervals of `batch` calls back to back, queued behind
    a ~1 ms sleep kernel so that the host has issued them all before the first starts (GPU
    time, not Python's launch cost), and behind a one-word all-reduce so that every rank's
    interval starts together (a rank's late start is not counted as another's wait)."""
    import torch
    import torch.distributed as dist

    word = torch.zeros(1, device="cuda")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(2_000_000)
        dist.all_reduce(word)
        a.record()
        for _ in range(batch):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / batch)
    return statistics.median(times)


def slowest(dist: Any, ms: float) -> float:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, ms)
    return max(out)


def error(got: Any, want: Any, k: int) -> float:
    """max |got - want| / tolerance (<= 1 passes): bench.common.ref_error's rule with twice
    its absolute term, since the reduce-scatters sum partials already rounded to bf16."""
    tol = 2 ** -7 * want.abs() + 2e-3 * k ** 0.5
    return float(((got.float() - want).abs() / tol).max())


def ag_case(dist: Any, name: str, m: int, k: int, n_all: int, reps: int) -> dict[str, Any]:
    import torch
    import tp_linear as tp

    world, rank = dist.get_world_size(), dist.get_rank()
    ml, n = m // world, n_all // world
    g = torch.Generator(device="cuda").manual_seed(7 + rank)
    shard = torch.randn(ml, k, device="cuda", generator=g).bfloat16()
    b = torch.randn(n, k, device="cuda", generator=g).bfloat16() / 16
    full = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    plan = tp.AllGatherGemm(ml, k, n)
    slot = torch.as_tensor(plan.shard(), device="cuda").view(torch.bfloat16)
    comm = torch.cuda.Stream()
    done = {}

    def ours():
        slot.copy_(shard)  # the layer's input is an ordinary tensor: copy it in
        plan(b, c)

    def nccl_then_gemm():
        dist.all_gather_into_tensor(full, shard)
        torch.matmul(full, b.T, out=c)

    def overlapped():  # (b): the gather on a second stream while the local rows multiply
        comm.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(comm):
            dist.all_gather_into_tensor(full, shard)
        torch.matmul(shard, b.T, out=c[rank * ml:(rank + 1) * ml])
        torch.cuda.current_stream().wait_stream(comm)
        for r in range(world):
            if r != rank:
                torch.matmul(full[r * ml:(r + 1) * ml], b.T, out=c[r * ml:(r + 1) * ml])

    def gemm_alone():
        torch.matmul(full, b.T, out=c)

    def comm_alone():
        dist.all_gather_into_tensor(full, shard)

    fns = {"ours": ours, "a": nccl_then_gemm, "b": overlapped, "gemm": gemm_alone,
           "comm": comm_alone, "ptx_gemm": dense_gemm(full, b, c)}
    symm = symm_fused(dist, lambda group: torch.ops.symm_mem.fused_all_gather_matmul(
        shard, [b.T], 0, group)[1][0])
    if isinstance(symm, str):
        done["c_error"] = symm
    else:
        fns["c"] = symm
    # correctness first: every way against the f32 product of the gathered A
    dist.all_gather_into_tensor(full, shard)
    want = full.float() @ b.float().T
    checks = {}
    for key in ("ours", "a", "b", "c"):
        if key not in fns:
            continue
        c.zero_()
        out = fns[key]()
        got = out if key == "c" else c
        checks[key] = error(got, want, k)
    gathered_ok = torch.equal(torch.as_tensor(plan.gathered(), device="cuda")
                              .view(torch.bfloat16), full)
    del want
    ms = {key: slowest(dist, timed(fn, reps)) for key, fn in fns.items()}
    plan.free()
    return {"name": name, "m": m, "k": k, "n": n_all, "ms": ms, "errors": checks,
            "gathered_ok": gathered_ok, **done}


def rs_case(dist: Any, name: str, m: int, k_all: int, n: int, reps: int,
            ordered: bool) -> dict[str, Any]:
    import torch
    import tp_linear as tp

    world, rank = dist.get_world_size(), dist.get_rank()
    ml, kl = m // world, k_all // world
    g = torch.Generator(device="cuda").manual_seed(11 + rank)
    a = torch.randn(m, kl, device="cuda", generator=g).bfloat16()
    b = torch.randn(n, kl, device="cuda", generator=g).bfloat16() / 16
    part = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(ml, n, device="cuda", dtype=torch.bfloat16)
    plan = tp.GemmReduceScatter(ml, n, kl, ordered=ordered)
    mine = torch.as_tensor(plan.shard(), device="cuda").view(torch.bfloat16)
    comm = torch.cuda.Stream()
    chunk_out = torch.empty(ml, n, device="cuda", dtype=torch.bfloat16)
    done = {}

    def ours():
        plan(a, b)

    def gemm_then_nccl():
        torch.matmul(a, b.T, out=part)
        dist.reduce_scatter_tensor(out, part)

    def overlapped():  # (b): each owner's rows multiplied, then reduced to it on a 2nd
        # stream while the next owner's rows multiply (every rank walks owners in one order,
        # so the reduces pair up)
        for r in range(world):
            torch.matmul(a[r * ml:(r + 1) * ml], b.T, out=part[r * ml:(r + 1) * ml])
            comm.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(comm):
                dist.reduce(part[r * ml:(r + 1) * ml], dst=r)
        torch.cuda.current_stream().wait_stream(comm)
        chunk_out.copy_(part[rank * ml:(rank + 1) * ml])

    def gemm_alone():
        torch.matmul(a, b.T, out=part)

    def comm_alone():
        dist.reduce_scatter_tensor(out, part)

    fns = {"ours": ours, "a": gemm_then_nccl, "b": overlapped, "gemm": gemm_alone,
           "comm": comm_alone, "ptx_gemm": dense_gemm(a, b, part)}
    symm = symm_fused(dist, lambda group: torch.ops.symm_mem.fused_matmul_reduce_scatter(
        a, b.T, "sum", 0, group))
    if isinstance(symm, str):
        done["c_error"] = symm
    else:
        fns["c"] = symm
    partial = a.float() @ b.float().T
    want = torch.empty(ml, n, device="cuda")
    dist.reduce_scatter_tensor(want, partial)
    del partial
    checks = {}
    for key, result in (("ours", lambda: mine), ("a", lambda: out), ("b", lambda: chunk_out),
                        ("c", None)):
        if key not in fns:
            continue
        got = fns[key]()
        checks[key] = error(got if key == "c" else result(), want, k_all)
    del want
    ms = {key: slowest(dist, timed(fn, reps)) for key, fn in fns.items()}
    plan.free()
    return {"name": name + (", ordered" if ordered else ""), "m": m, "k": k_all, "n": n,
            "ms": ms, "errors": checks, **done}


def gar_case(dist: Any, m: int, n: int, k_all: int, reps: int) -> dict[str, Any]:
    """GemmAllReduce (one launch a rank; and with 64-row weight tiles, more tiles for fewer K
    ranges) against torch.mm then NCCL's all_reduce (a), and torch.mm then ptxdsl's own
    all_reduce; each alone too. Times in us."""
    import torch

    from ptxdsl.runtime.distributed import AllReduce
    from ptxdsl.runtime.gemm_allreduce import GemmAllReduce

    world, rank = dist.get_world_size(), dist.get_rank()
    kl = k_all // world // 8 * 8  # a rank's K: 16-byte rows for TMA
    g = torch.Generator(device="cuda").manual_seed(13 + rank)
    a = torch.randn(m, kl, device="cuda", generator=g).bfloat16()
    w = torch.randn(n, kl, device="cuda", generator=g).bfloat16() / 16
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    part = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    plan = GemmAllReduce(m, n, kl)
    narrow = GemmAllReduce(m, n, kl, bw=64)
    ar = AllReduce(m * n, "bf16")

    def ours():
        return plan(a, w, c)

    def mm_nccl():
        torch.matmul(a, w.T, out=part)
        dist.all_reduce(part)
        return part

    def mm_ptxdsl_ar():
        torch.matmul(a, w.T, out=part)
        return ar(part)

    fns = {"ours": ours, "bw64": lambda: narrow(a, w, c), "a": mm_nccl, "ptx_ar": mm_ptxdsl_ar,
           "gemm": lambda: torch.matmul(a, w.T, out=part), "comm": lambda: dist.all_reduce(part)}
    want = a.float() @ w.float().T
    dist.all_reduce(want)
    checks = {key: error(fns[key]().clone(), want, k_all)
              for key in ("ours", "bw64", "a", "ptx_ar")}
    every = torch.empty(world, m, n, device="cuda", dtype=c.dtype)
    dist.all_gather_into_tensor(every, ours())
    same = all(torch.equal(every[q], every[0]) for q in range(world))
    us = {key: 1000 * slowest(dist, timed(fn, reps)) for key, fn in fns.items()}
    splits = {"ours": plan.splits, "bw64": narrow.splits}
    for p in (plan, narrow, ar):
        p.free()
    return {"layer": "gar", "name": f"decode M {m}", "m": m, "k": kl * world, "n": n, "us": us,
            "errors": checks, "same_bits": same, "splits": splits}


def agreed(dist: Any, symm: Any) -> Any:
    """(c) where it runs on every rank, else the first rank's reason on all of them (a rank
    timing it alone would wait in its collectives for ranks that never join)."""
    reasons: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(reasons, symm if isinstance(symm, str) else None)
    bad = [f"rank {r}: {why}" for r, why in enumerate(reasons) if why]
    return bad[0] if bad else symm


def dense_gemm(a: Any, b: Any, c: Any) -> Any:
    """ptxdsl's dense GEMM (ptxdsl/kernels/gemm.ptxdsl) on the same operands, no communication:
    what the fused kernels' main loop costs alone."""
    from bench.common import twin
    from bench.gemm import gemm_launcher

    return gemm_launcher(twin("gemm").gemm, a, b, c)


def symm_fused(dist: Any, call: Any) -> Any:
    """(c) torch's symmetric-memory fused op, `call(group name)`, as a function of no
    arguments; or, where it does not run on every rank, why (recorded on the page)."""
    try:
        import torch
        from torch.distributed import _symmetric_memory as symm

        group = dist.group.WORLD.group_name
        symm.enable_symm_mem_for_group(group)

        def fused():
            return call(group)

        fused()
        torch.cuda.synchronize()
        return agreed(dist, fused)
    except Exception as e:
        return agreed(dist, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")


def serve(cases: Any) -> int:
    """A worker's main under torchrun: parses --json and --quick, joins the NCCL group on
    LOCAL_RANK's GPU, runs `cases(dist, reps)` (a list of result dicts) and has rank 0 write
    them with the world size and GPU as JSON (bench/tp.py's `torchrun_json` reads it)."""
    import torch
    import torch.distributed as dist

    p = argparse.ArgumentParser()
    p.add_argument("--json", required=True)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    from ptxdsl.runtime.distributed import join_nccl

    join_nccl()
    results = cases(dist, 5 if a.quick else 15)
    if dist.get_rank() == 0:
        Path(a.json).write_text(json.dumps({
            "world": dist.get_world_size(), "gpu": torch.cuda.get_device_name(0),
            "results": results}, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def cases(dist: Any, reps: int) -> list[dict[str, Any]]:
    results = []
    for name, m, k, n in AG_SHAPES:
        results.append({"layer": "ag", **ag_case(dist, name, m, k, n, reps)})
    for name, m, k, n in RS_SHAPES:
        for ordered in (False, True):
            results.append({"layer": "rs", **rs_case(dist, name, m, k, n, reps, ordered)})
    for m, n, k in GAR_SHAPES:
        results.append(gar_case(dist, m, n, k, reps))
    return results


if __name__ == "__main__":
    raise SystemExit(serve(cases))
