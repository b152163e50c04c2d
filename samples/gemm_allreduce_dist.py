"""ptxdsl's GEMM + all-reduce in one launch (ptxdsl/kernels/gemm_allreduce.py through
ptxdsl.runtime.gemm_allreduce.GemmAllReduce), a row-parallel linear layer for decoding, on
every GPU of one host, one process per GPU, checked on fresh random data:

    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 4 samples/gemm_allreduce_dist.py
    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 2 samples/gemm_allreduce_dist.py --hang

Each rank holds A_r (M x K / world) and W_r (N x K / world) and gets C = sum_r A_r W_r^T:
- the same bits on every rank (C gathered with NCCL and compared);
- close to NCCL's all_reduce of torch.mm's bf16 partials (what a PyTorch layer runs) and to
  the f32 product summed in f32;
at M 1 to 256 on a Llama-70B-like layer's shards and a ragged small shape, three calls a
plan (both launch halves, then the first again; into a given out, then a new one).
`--quick`: two shapes, one call each (for compute-sanitizer). `--hang`: rank 1 builds the plan
and never launches; the other ranks, built with the watchdog, must end in a named error.
Prints one line per check; exits 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

from ptxdsl.runtime.distributed import expect_named_hang, join_nccl, report
from ptxdsl.runtime.gemm_allreduce import GemmAllReduce

# (M, N, K over all ranks): decode rows of a Llama-70B-like MLP down projection and attention
# output projection, and a shape off every tile
SHAPES = [(1, 4096, 14336), (16, 4096, 14336), (64, 7168, 8192), (256, 7168, 8192),
          (5, 200, 1000)]


def k_local(k: int, world: int) -> int:
    """A rank's K: its share, down to a multiple of 8 (TMA's 16-byte rows)."""
    return k // world // 8 * 8


def check(rank: int, world: int, gen: torch.Generator, m: int, n: int, k: int,
          calls: int) -> int:
    fails = 0
    kl = k_local(k, world)
    plan = GemmAllReduce(m, n, kl)
    for call in range(calls):
        a = torch.randn(m, kl, device="cuda", generator=gen).to(torch.bfloat16)
        w = torch.randn(n, kl, device="cuda", generator=gen).to(torch.bfloat16)
        got = plan(a, w, torch.empty(m, n, device="cuda", dtype=torch.bfloat16)) \
            if call % 2 == 0 else plan(a, w)
        every = torch.empty(world, m, n, device="cuda", dtype=got.dtype)
        dist.all_gather_into_tensor(every, got)
        same = all(torch.equal(every[q], every[0]) for q in range(world))
        nccl = torch.mm(a, w.T)
        dist.all_reduce(nccl)
        f32 = torch.mm(a.float(), w.float().T)
        dist.all_reduce(f32)
        top = f32.abs().max().item()
        err32 = (got.float() - f32).abs().max().item()
        err = (got.float() - nccl.float()).abs().max().item()
        close = err32 <= 2 ** -7 * top and err <= 2 ** -5 * top
        fails += not (same and close)
        print(f"rank {rank}: gemm_allreduce M={m} N={n} K={kl} x {world} splits={plan.splits} "
              f"call {call}: {'same bits on every rank' if same else 'MISMATCH across ranks'}"
              f", {'close' if close else 'FAR'} to NCCL's all_reduce of torch.mm (max error "
              f"{err:.3g}) and to the f32 sum ({err32:.3g}; largest {top:.3g})", flush=True)
    plan.free()
    return fails


def hang(rank: int, world: int) -> int:
    """Rank 1 never launches; every other rank must end in the watchdog's named error."""
    m, n, k = SHAPES[0]
    plan = GemmAllReduce(m, n, k_local(k, world), watchdog_ms=2000)
    a = torch.randn(m, plan.k, device="cuda").to(torch.bfloat16)
    w = torch.randn(n, plan.k, device="cuda").to(torch.bfloat16)
    return expect_named_hang(lambda: (plan(a, w), torch.cuda.synchronize()), rank)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--hang", action="store_true")
    p.add_argument("--quick", action="store_true", help="two shapes, one call each")
    args = p.parse_args()
    rank, world = join_nccl()
    if args.hang:
        code = hang(rank, world)
        os._exit(code)  # the trapped context and the waiting peer: no orderly teardown
    gen = torch.Generator(device="cuda").manual_seed(1234 + rank)
    shapes, calls = ([SHAPES[0], SHAPES[-1]], 1) if args.quick else (SHAPES, 3)
    fails = sum(check(rank, world, gen, m, n, k, calls) for m, n, k in shapes)
    code = report(fails)
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    raise SystemExit(main())
