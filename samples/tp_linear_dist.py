"""The fused tensor-parallel layers of tp_linear.py on every GPU of one host, checked against
NCCL + torch on fresh random data, one process per GPU:

    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 2 samples/tp_linear_dist.py
    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 2 samples/tp_linear_dist.py --hang ag

- all-gather + GEMM: C and the gathered A against `all_gather_into_tensor` then a matmul;
- GEMM + reduce-scatter: the shard against `reduce_scatter_tensor` of f32 partials, in both
  modes; the ordered mode twice on the same data must give the same bits.
Each plan is launched three times (new data each time) to exercise the launch count. Ragged
shapes (rows, columns and K that are not multiples of the tile) and a decode-sized case.
`--quick`: the ragged shape and the last decode-sized one, one launch each (for
compute-sanitizer).
`--hang ag|rs`: rank 1 builds the plan but never launches; the other ranks, built with the
watchdog, must end in a named error instead of hanging. Prints one line per check; exits 1
on a mismatch.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tp_linear as tp  # noqa: E402

from ptxdsl.errors import LaunchError  # noqa: E402
from ptxdsl.runtime.distributed import expect_named_hang, join_nccl, report  # noqa: E402

# (m_local, k, n): ragged, decode-sized, one of several waves of tiles, and a decode-sized
# one with more gather units (32) than the all-gather's pulling CTAs (16) (and every
# reduce-scatter item in one wave: the owners zero their tiles first)
SHAPES = [(256, 512, 512), (200, 1000, 520), (64, 2048, 1024), (2112, 1000, 2600),
          (128, 2048, 5120)]


def bf16(x: object) -> torch.Tensor:
    return torch.as_tensor(x, device="cuda").view(torch.bfloat16)


def close(got: torch.Tensor, want: torch.Tensor, k: int) -> tuple[bool, float]:
    err = (got.float() - want).abs().max().item()
    return err <= 0.02 * want.abs().max().item() + 1e-3 * k ** 0.5, err


def check_ag(rank: int, world: int, gen: torch.Generator, shapes: list, calls: int) -> int:
    fails = 0
    for m_local, k, n in shapes:
        plan = tp.AllGatherGemm(m_local, k, n)
        for call in range(calls):
            a = torch.randn(m_local, k, device="cuda", generator=gen).bfloat16()
            b = torch.randn(n, k, device="cuda", generator=gen).bfloat16()
            bf16(plan.shard()).copy_(a)
            c = torch.empty(world * m_local, n, device="cuda", dtype=torch.bfloat16)
            plan(b, c)
            full = torch.empty(world * m_local, k, device="cuda", dtype=torch.bfloat16)
            dist.all_gather_into_tensor(full, a)
            ok_g = torch.equal(bf16(plan.gathered()), full)
            ok_c, err = close(c, full.float() @ b.float().T, k)
            fails += not (ok_g and ok_c)
            if call == 0:  # a strided or wrongly typed output is refused, not written through
                wide = torch.empty(world * m_local, n + 8, device="cuda", dtype=torch.bfloat16)
                for bad in (wide[:, :n], c.float()):
                    try:
                        plan(b, bad)
                        fails += 1
                        print(f"rank {rank}: a bad C was not refused", flush=True)
                    except LaunchError:
                        pass
            print(f"rank {rank}: all-gather GEMM m_local={m_local} k={k} n={n} call {call}: "
                  f"gathered {'ok' if ok_g else 'MISMATCH'}, C {'ok' if ok_c else 'MISMATCH'} "
                  f"(max error {err:.3g})", flush=True)
        plan.free()
    return fails


def check_rs(rank: int, world: int, gen: torch.Generator, shapes: list, calls: int) -> int:
    fails = 0
    for m_local, k, n in shapes:
        for ordered in (False, True):
            plan = tp.GemmReduceScatter(m_local, n, k, ordered=ordered)
            for call in range(calls):
                a = torch.randn(world * m_local, k, device="cuda", generator=gen).bfloat16()
                b = torch.randn(n, k, device="cuda", generator=gen).bfloat16()
                plan(a, b)
                got = bf16(plan.shard()).clone()
                part = a.float() @ b.float().T
                want = torch.empty(m_local, n, device="cuda")
                dist.reduce_scatter_tensor(want, part)
                ok, err = close(got, want, k * world)
                same = True
                if ordered:
                    plan(a, b)
                    same = torch.equal(bf16(plan.shard()), got)
                fails += not (ok and same)
                print(f"rank {rank}: GEMM reduce-scatter {'ordered' if ordered else 'unordered'}"
                      f" m_local={m_local} k={k} n={n} call {call}: "
                      f"{'ok' if ok else 'MISMATCH'} (max error {err:.3g})"
                      + ("" if not ordered else f", again {'same bits' if same else 'DIFFERS'}"),
                      flush=True)
            plan.free()
    return fails


def hang(kind: str, rank: int) -> int:
    """Rank 1 never launches; every other rank must end in the watchdog's named error."""
    m_local, k, n = SHAPES[0]
    if kind == "ag":
        plan = tp.AllGatherGemm(m_local, k, n, watchdog_ms=2000)
        args = (torch.randn(n, k, device="cuda").bfloat16(),
                torch.empty(2 * m_local, n, device="cuda", dtype=torch.bfloat16))
    else:
        plan = tp.GemmReduceScatter(m_local, n, k, watchdog_ms=2000)
        args = (torch.randn(plan.world * m_local, k, device="cuda").bfloat16(),
                torch.randn(n, k, device="cuda").bfloat16())
    return expect_named_hang(lambda: (plan(*args), torch.cuda.synchronize()), rank)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--hang", choices=("ag", "rs"))
    p.add_argument("--quick", action="store_true", help="two shapes, one call each "
                   "(for compute-sanitizer)")
    args = p.parse_args()
    rank, world = join_nccl()
    if args.hang:
        code = hang(args.hang, rank)
        os._exit(code)  # the trapped context and the waiting peer: no orderly teardown
    gen = torch.Generator(device="cuda").manual_seed(1234 + rank)
    shapes, calls = ([SHAPES[1], SHAPES[-1]], 1) if args.quick else (SHAPES, 3)
    fails = check_ag(rank, world, gen, shapes, calls) + check_rs(rank, world, gen, shapes, calls)
    code = report(fails)
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    raise SystemExit(main())
