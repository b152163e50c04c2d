"""ptxdsl's all-reduce (ptxdsl/kernels/all_reduce.py through
ptxdsl.runtime.distributed.AllReduce) on every GPU of one host, one process per GPU, checked
on fresh random data:

    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 4 samples/all_reduce_dist.py
    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 2 samples/all_reduce_dist.py --hang

- bit for bit against the sum in rank order of every rank's input (gathered with NCCL, added
  in f32 by torch, rounded once), and so the same bits on every rank;
- close to NCCL's all_reduce of the same inputs (which adds in its own order);
- both modes at each size (one-shot and two-shot forced), bf16 and f32, lengths that are not
  whole vectors, in place, into another tensor and through `input()`, three calls a plan
  (both input slots, then the first again); `all_reduce()` once.
`--quick`: two sizes, one call each (for compute-sanitizer). `--hang`: rank 1 builds the plan
and never launches; the other ranks, built with the watchdog, must end in a named error.
Prints one line per check; exits 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

from ptxdsl.runtime.distributed import (
    AllReduce,
    all_reduce,
    expect_named_hang,
    free_all_reduce_plans,
    join_nccl,
    report,
)

SIZES = [1, 7, 1000, 4099, 65536, (1 << 20) + 5, 3 << 20]
TORCH = {"bf16": torch.bfloat16, "f32": torch.float32}


def rank_order_sum(x: torch.Tensor, world: int) -> torch.Tensor:
    """Every rank's x gathered, summed in rank order in f32, rounded once to x's type."""
    xs = torch.empty(world, *x.shape, device=x.device, dtype=x.dtype)
    dist.all_gather_into_tensor(xs, x)
    acc = xs[0].float()
    for q in range(1, world):
        acc = acc + xs[q].float()
    return acc.to(x.dtype)


def check(rank: int, world: int, gen: torch.Generator, n: int, dtype: str, shots: int,
          calls: int) -> int:
    fails = 0
    plan = AllReduce(n, dtype, shots=shots)
    for call in range(calls):
        x = (torch.randn(n, device="cuda", generator=gen) * 4).to(TORCH[dtype])
        want = rank_order_sum(x, world)
        nccl = x.to(torch.float32, copy=True)  # (x.float() of f32 is x itself)
        dist.all_reduce(nccl)
        how = ("in place", "into out", "input()")[call % 3]
        if how == "in place":
            got = x.clone()
            plan(got)
        elif how == "into out":
            got = torch.empty_like(x)
            plan(x, got)
        else:
            got = torch.empty_like(x)
            # the slot's bf16 crosses as its bits (uint16): viewed back as x's type
            torch.as_tensor(plan.input(), device="cuda").view(x.dtype).copy_(x)
            plan(None, got)
        exact = torch.equal(got, want)
        err = (got.float() - nccl).abs().max().item()
        close = err <= 2 ** -7 * nccl.abs().max().item() + 1e-6
        fails += not (exact and close)
        print(f"rank {rank}: all_reduce {dtype} n={n} shots={plan.shots} call {call} ({how}): "
              f"{'same bits' if exact else 'MISMATCH'} as the rank-order sum, "
              f"{'close' if close else 'FAR'} to NCCL (max error {err:.3g})", flush=True)
    plan.free()
    return fails


def check_function(rank: int, world: int, gen: torch.Generator) -> int:
    x = torch.randn(4096, device="cuda", generator=gen).to(torch.bfloat16)
    want = rank_order_sum(x, world)
    y = x.clone()
    all_reduce(y)
    ok = torch.equal(y, want)
    print(f"rank {rank}: all_reduce() in place: {'same bits' if ok else 'MISMATCH'}", flush=True)
    free_all_reduce_plans()
    return int(not ok)


def hang(rank: int) -> int:
    """Rank 1 never launches; every other rank must end in the watchdog's named error."""
    plan = AllReduce(4096, "bf16", watchdog_ms=2000)
    x = torch.randn(4096, device="cuda").to(torch.bfloat16)
    return expect_named_hang(lambda: (plan(x), torch.cuda.synchronize()), rank)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--hang", action="store_true")
    p.add_argument("--quick", action="store_true", help="two sizes, one call each")
    args = p.parse_args()
    rank, world = join_nccl()
    if args.hang:
        code = hang(rank)
        os._exit(code)  # the trapped context and the waiting peer: no orderly teardown
    gen = torch.Generator(device="cuda").manual_seed(1234 + rank)
    sizes, calls = ([1000, (1 << 20) + 5], 1) if args.quick else (SIZES, 3)
    fails = sum(check(rank, world, gen, n, dtype, shots, calls)
                for n in sizes for dtype in ("bf16", "f32") for shots in (1, 2))
    fails += check_function(rank, world, gen)
    code = report(fails)
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    raise SystemExit(main())
