"""One rank of `python -m bench allreduce` (started by torchrun; bench/allreduce.py starts it):
ptxdsl's all-reduce (`ptxdsl.runtime.distributed.AllReduce`) against NCCL's and torch's
symmetric-memory one-shot / two-shot all-reduces, bf16, 4 KB to 256 MB a rank, every result
checked before it is timed.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
        torchrun --nproc-per-node 4 -m bench.allreduce_worker --json out.json [--quick]

Rank 0 writes the medians (us per call, the slower rank's; `tp_worker.timed`) as JSON."""

from __future__ import annotations

from typing import Any

from bench.tp_worker import agreed, serve, slowest, timed

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20,
         256 << 20]  # bytes a rank


def symm_ops(dist: Any, x: Any) -> tuple[dict[str, Any], str]:
    """torch's symmetric-memory one-shot and two-shot all-reduces of x's values (a copy into a
    symmetric tensor, then the op), as functions of no arguments returning the result; or
    why they do not run on every rank."""
    try:
        import torch
        from torch.distributed import _symmetric_memory as symm

        group = dist.group.WORLD.group_name
        symm.enable_symm_mem_for_group(group)
        t = symm.empty(x.numel(), dtype=x.dtype, device=x.device)
        symm.rendezvous(t, group)

        def one_shot():
            t.copy_(x)
            return torch.ops.symm_mem.one_shot_all_reduce(t, "sum", group)

        def two_shot():
            t.copy_(x)
            torch.ops.symm_mem.two_shot_all_reduce_(t, "sum", group)
            return t

        fns = {"symm one-shot": one_shot, "symm two-shot": two_shot}
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
        ok = agreed(dist, fns)
    except Exception as e:
        ok = agreed(dist, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
    return ({}, ok) if isinstance(ok, str) else (ok, "")


def case(dist: Any, nbytes: int, reps: int) -> dict[str, Any]:
    import torch

    from ptxdsl.runtime.distributed import AllReduce

    rank, world = dist.get_rank(), dist.get_world_size()
    n = nbytes // 2
    g = torch.Generator(device="cuda").manual_seed(5 + rank)
    x = torch.randn(n, device="cuda", generator=g).bfloat16()
    out = torch.empty_like(x)
    y = torch.empty_like(x)
    plan = AllReduce(n, "bf16")

    def ours():
        plan(x, out)
        return out

    def nccl():
        y.copy_(x)  # dist.all_reduce works in place: the copy keeps x, as ours does
        dist.all_reduce(y)
        return y

    fns: dict[str, Any] = {"ours": ours, "nccl": nccl}
    symm, why = symm_ops(dist, x)
    fns.update(symm)
    # correctness first: ours bit for bit against the rank-order sum, everyone close to it
    # (NCCL rounds each partial sum to bf16: a few roundings of partials near the inputs')
    xs = torch.empty(world, n, device="cuda", dtype=x.dtype)
    dist.all_gather_into_tensor(xs, x)
    want = xs[0].float()
    for q in range(1, world):
        want = want + xs[q].float()
    del xs
    errors = {}
    for key, fn in fns.items():
        got = fn().float()
        errors[key] = float(((got - want).abs() / (2 ** -7 * want.abs() + 2 ** -6 * world))
                             .max())
    exact = torch.equal(ours(), want.bfloat16())
    us = {key: slowest(dist, timed(fn, reps, batch=8) * 1000) for key, fn in fns.items()}
    plan.free()
    return {"bytes": nbytes, "shots": plan.shots, "us": us, "errors": errors, "exact": exact,
            "symm_error": why}


if __name__ == "__main__":
    raise SystemExit(serve(lambda dist, reps: [case(dist, nb, reps) for nb in SIZES]))
