"""The CPU interpreter: runs any ptxdsl kernel over a small grid on numpy arrays, modelling
the asynchronous hardware, and reports the bugs it meets with located diagnostics.

    from ptxdsl.interp import run, run_ranks, TensorMapModel
    run(kernel_ir, grid=4, args={"src": x, "dst": y})
    run_ranks(kernel_ir, grid=4, args_per_rank=[{"flags": f, "rank": r} for r in range(8)])

Modelled: threads grouped in warps, each a generator interleaved by a seeded scheduler;
named barriers; warp collectives (shuffles, elect); shared memory laid out as the emitter
lays it out; mbarrier phases, arrival and transaction counts; bulk and tensor copies that
complete late, in chunks and in seeded orders; bulk async-groups; tensor-map boxes with
out-of-bounds fill and swizzle. Reported: deadlocks (each blocked group, its barrier,
parity, phase and counts, at its source line), races between generic accesses and copies
in flight, two CTAs (or ranks) storing one global element unordered (`gwrites`), missing
`fence_proxy_async`, bulk stores not waited before exit, mbarrier misuse,
out-of-bounds and misaligned accesses, and runaway loops (`max_steps`). `run_ranks` runs
one launch per rank of a multi-GPU job together, over one global memory.
"""

from .errors import InterpError, InterpWarning
from .ranks import run_ranks
from .run import run, run_sample
from .tensormap import TensorMapModel

__all__ = ["InterpError", "InterpWarning", "TensorMapModel", "run", "run_ranks", "run_sample"]
