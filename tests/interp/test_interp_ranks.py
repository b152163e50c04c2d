"""Several ranks in one interpreter run (`run_ranks`): launches that signal each other
through shared global memory (a token passed round a ring of 2, 4 and 8 ranks, an all-gather
through tensor maps into one array), the deadlock of a rank that never arrives, named by the
ranks left waiting, and argument problems named by their rank."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import ptxdsl
from ptxdsl.errors import LaunchError
from ptxdsl.interp import InterpError, TensorMapModel, run_ranks


def kernel(text: str, name: str = "ranks.ptxdsl"):
    return ptxdsl.parse(textwrap.dedent(text), name).kernel()


# A token goes round a ring of `world` ranks, one ring per CTA index: rank `first` starts,
# each rank waits for its flag, takes a ticket from the ring's counter, records it and
# releases the next rank's flag (rank + hop); the first rank then waits for the token to
# come back and records the final count.
RING = """
kernel ring(flags: ptr<u32>, order: ptr<u32>, rank: u32, world: u32, first: u32,
            hop: u32) threads(32) {
    if %tid.x == 0 {
        let f: u32 = %ctaid.x * world;
        let o: u32 = %ctaid.x * (world + 2);
        if rank != first {
            while ld_acquire(flags[f + rank], sys) == 0 {
            }
        }
        let ticket = order[o + world];
        order[o + rank] = ticket;
        order[o + world] = ticket + 1;
        st_release(flags[f + (rank + hop) % world], 1, sys);
        if rank == first {
            while ld_acquire(flags[f + first], sys) == 0 {
            }
            order[o + world + 1] = order[o + world] * 10;
        }
    }
    bar_sync(0);
}
"""
SPIN_LINE = 8  # the first `while ld_acquire` of RING, after dedent


def ring_args(world: int, grid: int, first: int = 0, step: int = 1, launched: int | None = None):
    flags = np.zeros(grid * world, np.uint32)
    order = np.full(grid * (world + 2), 0, np.uint32)
    args = [{"flags": flags, "order": order, "rank": r, "world": world, "first": first,
             "hop": step} for r in range(world if launched is None else launched)]
    return args, flags, order


def ring_expected(world: int, first: int, step: int) -> list[int]:
    hops = {}
    r = first
    for hop in range(world):
        hops[r] = hop
        r = (r + step) % world
    return [hops[r] for r in range(world)] + [world, 10 * world]


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("first, backwards", [(0, False), (-1, True)])
def test_token_goes_round_the_ring(world, first, backwards):
    """Seed 0 launches rank 0 first: forwards it finds its flag set by the rank before;
    backwards every rank spins until the last rank, launched last, starts the token."""
    first %= world
    step = world - 1 if backwards else 1
    args, flags, order = ring_args(world, grid=2, first=first, step=step)
    run_ranks(kernel(RING), 2, args)
    want = ring_expected(world, first, step)
    assert order.reshape(2, world + 2).tolist() == [want, want]
    assert flags.tolist() == [1] * (2 * world)


@pytest.mark.parametrize("seed", [1, 7])
def test_other_seeds_shuffle_ranks_and_still_agree(seed):
    args, flags, order = ring_args(4, grid=3, first=2)
    run_ranks(kernel(RING), 3, args, seed=seed)
    want = ring_expected(4, 2, 1)
    assert order.reshape(3, 6).tolist() == [want] * 3


def test_a_rank_that_never_arrives_deadlocks_the_waiting_ranks():
    """World 4, but rank 3, which starts the token, is never launched."""
    args, flags, order = ring_args(4, grid=1, first=3, launched=3)
    with pytest.raises(InterpError) as info:
        run_ranks(kernel(RING), 1, args)
    e = info.value
    assert e.kind == "deadlock"
    # per rank: thread 0 spins on its flag, the other threads wait for it at bar_sync
    spins = [d for d in e.diagnostics if "spin on global memory" in d.message]
    assert [d.message.split(":")[0] for d in spins] == ["rank 0", "rank 1", "rank 2"]
    assert all(d.message.split(": ")[1] == "deadlock in CTA 0" for d in e.diagnostics)
    assert all(d.span is not None and d.span.line == SPIN_LINE for d in spins)
    assert len(e.diagnostics) == 6
    assert "ranks.ptxdsl:8:" in str(e) and "rank 3" not in str(e)
    assert order.tolist() == [0] * 6  # nobody got the token


def test_errors_inside_a_rank_name_it():
    # rank 2's ring index runs past `order`: its bounds error says which rank it was
    src = RING.replace("let o: u32 = %ctaid.x * (world + 2);",
                       "let o: u32 = %ctaid.x * (world + 2) + rank / 2 * 100;")
    args, _, _ = ring_args(4, grid=1)
    with pytest.raises(InterpError) as info:
        run_ranks(kernel(src), 1, args)
    assert info.value.kind == "bounds"
    assert str(info.value).startswith("ranks.ptxdsl:"), str(info.value)
    assert info.value.diagnostics[0].message.startswith("rank 2: thread 0: load "), \
        info.value.diagnostics[0].message


# Every rank stores its 4 x 8 tile into rows 4r .. 4r + 3 of one gathered array through its
# own tensor map, publishes it with a flag, waits for every rank's flag and sums column t of
# every rank's tile into its own output row, a view of one stacked array.
GATHER = """
kernel gather(dst: tmap<u32, 2>, flags: ptr<u32>, all: ptr<u32>, mine: ptr<u32>, rank: u32,
              world: u32) threads(32) {
    shared tile: u32[4][8] align 128;
    let t = %tid.x;
    tile[t / 8, t % 8] = rank * 100 + t;
    fence_proxy_async();
    bar_sync(0);
    if t == 0 {
        tma_store(dst, [0, (rank * 4) as s32], tile);
        bulk_commit();
        bulk_wait(0);
        fence_proxy_async_global();
        st_release(flags[rank], 1, sys);
        for i in 0 .. world {
            while ld_acquire(flags[i], sys) == 0 {
            }
        }
    }
    bar_sync(0);
    let sum: u32 = 0;
    for i in 0 .. world {
        sum = sum + all[i * 32 + t];
    }
    mine[t] = sum;
}
"""


@pytest.mark.parametrize("seed", [0, 3])
def test_all_gather_through_tensor_maps_and_views(seed):
    world = 4
    gathered = np.zeros((4 * world, 8), np.uint32)
    outs = np.zeros((world, 32), np.uint32)
    flags = np.zeros(world, np.uint32)
    args = [{"dst": TensorMapModel(gathered, box=(4, 8)), "flags": flags, "all": gathered,
             "mine": outs[r], "rank": r, "world": world} for r in range(world)]
    run_ranks(kernel(GATHER), 1, args, seed=seed)
    tiles = np.arange(32, dtype=np.uint32) + 100 * np.arange(world, dtype=np.uint32)[:, None]
    assert (gathered.reshape(world, 32) == tiles).all()
    assert (outs == tiles.sum(axis=0)).all()


def test_argument_problems_name_their_rank():
    args, _, _ = ring_args(3, grid=1)
    args[1] = dict(args[1], rank=-1, flags=np.zeros(3, np.float32))
    del args[1]["world"]
    args[2] = [1, 2]
    with pytest.raises(LaunchError) as info:
        run_ranks(kernel(RING), 1, args)
    messages = [d.message for d in info.value.diagnostics]
    assert messages == [
        "rank 1: argument 'flags' is a float32 array; ptr<u32> needs uint32",
        "rank 1: argument 'rank' = -1 does not fit in u32 (range [0, 4294967295])",
        "rank 1: missing argument 'world' (u32)",
        "rank 2: the arguments must be a dict of parameter values, got list",
    ]


@pytest.mark.parametrize("bad, said", [([], "got an empty list"), ({"rank": 0}, "got dict")])
def test_the_ranks_must_be_a_list(bad, said):
    with pytest.raises(LaunchError, match=said):
        run_ranks(kernel(RING), 1, bad)


def test_clusters_are_refused():
    k = kernel("""
    kernel pair(x: ptr<u32>) threads(32) cluster(2) {
        x[%ctaid.x] = 1;
    }
    """)
    with pytest.raises(LaunchError) as info:
        run_ranks(k, 2, [{"x": np.zeros(2, np.uint32)}])
    assert "run_ranks cannot run kernel 'pair': it has clusters of 2 CTAs" in str(info.value)
    assert "ranks.ptxdsl:2:" in str(info.value)


# Each rank but the first waits for its flag, reads the row the rank before it stored into
# the symmetric buffer and stores its own; the flag is raised with `RAISE`.
HANDOFF = """
kernel handoff(flags: ptr<u32>, rows: ptr<u32>, rank: u32, world: u32) threads(32) {
    if rank != 0 {
        if %tid.x == 0 {
            while ld_acquire(flags[rank], sys) == 0 {
            }
        }
        bar_sync(0);
        rows[rank * 32 + %tid.x] = rows[(rank - 1) * 32 + %tid.x] + 1;
    } else {
        rows[%tid.x] = %tid.x;
    }
    bar_sync(0);
    if %tid.x == 0 && rank + 1 < world {
        RAISE;
    }
}
"""


def handoff(raise_flag: str, seed: int) -> np.ndarray:
    flags, rows = np.zeros(4, np.uint32), np.zeros(4 * 32, np.uint32)
    run_ranks(kernel(HANDOFF.replace("RAISE", raise_flag)), 1,
              [{"flags": flags, "rows": rows, "rank": r, "world": 4} for r in range(4)],
              seed=seed)
    return rows


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_relaxed_flag_publishes_no_row_to_the_next_rank(seed):
    """Issue 44, deliver 2 across ranks: the row is another rank's plain store, which only a
    release the waiting rank acquires makes visible."""
    with pytest.raises(InterpError, match=r"rank \d: .*reads element \d+ of 'rows', which "
                       r"thread \d+ of CTA 0 of rank \d stored, and no release") as e:
        handoff("let old: u32 = atomic_exch(flags[rank + 1], 1, relaxed, sys)", seed)
    assert "ranks.ptxdsl:9:" in str(e.value)  # the read of the row before


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_released_flag_publishes_the_row(seed):
    rows = handoff("st_release(flags[rank + 1], 1, sys)", seed)
    assert list(rows.reshape(4, 32)[:, 5]) == [5, 6, 7, 8]
