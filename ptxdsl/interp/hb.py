"""Happens-before inside a CTA, as vector clocks, so that races are found whatever the
schedule happened to be.

Agents are the CTA's threads, then one per mbarrier: a barrier's clock counts its completed
phases, and bytes that a copy delivered in phase k count as written by the barrier at
clock k + 1 (visible to whoever observed that phase complete). A thread's accesses carry the
epoch (tid, its own clock); a release (arrive, barrier arrival, copy issue) publishes the
thread's vector and then advances its own clock; an acquire (a successful wait, a completed
barrier, a warp collective) joins the published vector into the thread's.
"""

from __future__ import annotations

import numpy as np

NOBODY = np.iinfo(np.int64).max


class Clocks:
    """The vector clocks of one CTA's threads (one row per thread)."""

    def __init__(self, nthreads: int, nbarriers: int, grid_columns: int = 0):
        # grid_columns: one a CTA of a grid that talks through global memory (gorder.py)
        self.size = nthreads + nbarriers + grid_columns + 1
        self.vc = np.zeros((nthreads, self.size), np.int64)
        own = np.arange(nthreads)
        self.vc[own, own] = 1  # epoch 1: not covered by anyone's initial zero vector
        # agent -1 (nothing recorded) reads the last column, which covers every clock
        self.vc[:, -1] = NOBODY

    def zeros(self) -> np.ndarray:
        z = np.zeros(self.size, np.int64)
        z[-1] = NOBODY
        return z

    def release(self, tid: int) -> np.ndarray:
        """The vector `tid` publishes now; its later accesses are not covered by it."""
        snap = self.vc[tid].copy()
        self.vc[tid, tid] += 1
        return snap

    def acquire(self, tid: int, vc: np.ndarray) -> None:
        np.maximum(self.vc[tid], vc, out=self.vc[tid])

    def sync(self, tids: list[int]) -> None:
        """Every thread of `tids` learns what all of them knew (a converged warp)."""
        joined = self.vc[tids].max(axis=0)
        self.vc[tids] = joined
        self.vc[tids, tids] += 1

    def knows(self, tid: int, agent: int, clock: int) -> bool:
        """Whether an event of `agent` at `clock` happened before `tid`'s present."""
        return bool(self.vc[tid, agent] >= clock)
