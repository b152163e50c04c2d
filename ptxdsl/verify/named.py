"""Named barriers (`bar_sync(id, n)`, `bar_arrive(id, n)`): the count that each use gives
must be the number of threads that use that barrier.

A barrier generation completes when `n` threads have arrived. Where warpgroups hand turns to
each other (one warpgroup's `bar_sync(2 + wg, 256)` released by the other's
`bar_arrive(2 + wg', 256)`, the idiom `turn { }` derives), `n` counts both: the waiters and
the arrivers. A count that is too small completes generations early (no order at all, and
no error on the GPU); one too large never completes (a hang). The check evaluates each use's
barrier id per thread and, for every id whose uses agree on one count, compares that count
with the threads that reach the id anywhere in the kernel. Uses of one id with different
counts (one barrier reused by different thread sets in phases) are left alone."""

from __future__ import annotations

import numpy as np

from .. import ir
from ..errors import Note
from .effects import effect
from .facts import Facts, Report
from .threads import Visit


def _per_thread(v: Visit, name: str, n: int) -> np.ndarray | None:
    """The operand `name` of visit `v` in every thread, or None where it is not known."""
    val = v.args.get(name)
    k = getattr(val, "known", None)
    if k is None:
        return None
    return np.full(n, k, dtype=np.int64) if isinstance(k, int) else np.asarray(k, np.int64)


def _warps(threads: set[int]) -> str:
    warps = sorted({t // 32 for t in threads})
    runs, start = [], warps[0]
    for a, b in zip(warps, warps[1:] + [None], strict=True):
        if b != a + 1:
            runs.append(f"{start}" if a == start else f"{start} .. {a + 1}")
            start = b  # type: ignore[assignment]
    return "warp" + ("s " if len(warps) > 1 else " ") + ", ".join(runs)


def check_named_counts(facts: Facts, out: Report) -> None:
    n = facts.n
    users: dict[int, set[int]] = {}
    counts: dict[int, dict[int, Visit]] = {}
    arrived: set[int] = set()  # ids that some bar_arrive uses: a hand-off between threads
    for v in facts.trace.visits:
        role = effect(v.stmt).named_barrier
        if role is None:
            continue
        ids = _per_thread(v, role, n)
        cnt = getattr(v.args.get("nthreads"), "known", None)
        if ids is None or not isinstance(cnt, int):
            continue  # an unknown id or count, or bar_sync(id): every thread of the CTA
        for t in np.flatnonzero(v.may):
            bid = int(ids[t])
            users.setdefault(bid, set()).add(int(t))
            counts.setdefault(bid, {}).setdefault(cnt, v)
            if isinstance(v.stmt, ir.BarArrive):
                arrived.add(bid)
    for bid, by_count in sorted(counts.items()):
        if len(by_count) != 1:
            if bid in arrived:  # waiters and arrivers of one hand-off must agree
                (c1, v1), (c2, v2) = sorted(by_count.items(), key=lambda x: x[1].index)[:2]
                out.error(f"named barrier {bid} is given {c2} threads here and {c1} elsewhere: "
                          "the threads that wait on it and those that arrive on it must give "
                          f"one count, all {len(users[bid])} of them", v2.stmt.loc,
                          Note(f"barrier {bid} is given {c1} threads here", v1.stmt.loc))
            continue
        (count, v), = by_count.items()
        who = users[bid]
        if count == len(who):
            continue
        syncs = {int(t) for w in facts.trace.visits if isinstance(w.stmt, ir.BarSync)
                 and (ids := _per_thread(w, "id", n)) is not None
                 for t in np.flatnonzero(w.may) if ids[t] == bid}
        arrives = who - syncs
        parts = [f"{_warps(syncs)} wait on it"] if syncs else []
        parts += [f"{_warps(arrives)} arrive on it"] if arrives else []
        outcome = "completes its generations early, ordering nothing" if count < len(who) \
            else "never completes"
        out.error(f"named barrier {bid} counts {count} threads, but {len(who)} threads use it "
                  f"({' and '.join(parts)}): it {outcome}; give {len(who)}", v.stmt.loc)
