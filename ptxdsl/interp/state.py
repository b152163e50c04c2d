"""The floor of the interpreter: what its models of barriers, memory, copies, warp
collectives and clusters may use of a thread, a CTA and a compiled kernel.

`cta.Thread`, `cta.CTA` and `program.Program` implement these protocols; the models
(`mbarrier`, `memory`, `copies`, `cpasync`, `sync`, `cluster`, `exprs`) name only them, so
they sit below the CTA that holds them and the scheduler that drives them. Members that hold
the models' own objects (a CTA's shared memory, a thread's bulk groups) are `Any` here: their
types live above this floor, and `CTA` gives them those types."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from .. import ir
from ..codegen.layout import Layout
from .hb import Clocks

Sel = slice | np.ndarray  # a set of shared-memory byte offsets: a range or an index array


class ThreadState(Protocol):
    """One thread of a CTA, as the models see it."""

    wait: tuple[Any, Any, Any] | None  # (site, waitable, detail) while blocked
    cluster_gen: int  # the cluster-barrier generation of its pending arrival, or -1

    @property
    def cta(self) -> CTAState: ...
    @property
    def tid(self) -> int: ...
    @property
    def lane(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def exited(self) -> bool: ...
    @property
    def bulk(self) -> Any: ...  # copies.BulkGroups
    @property
    def unfenced(self) -> list[list[Any]]: ...
    @property
    def inits(self) -> list[Any]: ...  # mbarrier.MBarrier
    @property
    def warp_threads(self) -> Sequence[ThreadState]: ...
    @property
    def warp_gathers(self) -> dict[int, Any]: ...  # sync.Gather


class CTAState(Protocol):
    """One CTA, as the models see it."""

    @property
    def threads(self) -> Sequence[ThreadState]: ...
    @property
    def nthreads(self) -> int: ...
    @property
    def live(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def label(self) -> str: ...
    @property
    def rng(self) -> random.Random: ...
    @property
    def clocks(self) -> Clocks: ...
    @property
    def smem(self) -> Any: ...  # memory.SharedMemory
    @property
    def gmem(self) -> Any: ...  # memory.GlobalMemory
    @property
    def cluster(self) -> Any: ...  # cluster.Cluster, when it runs with peers
    @property
    def publication(self) -> Any: ...  # dsmem.Publication: its cluster-scope releases
    @property
    def cluster_fenced(self) -> set[tuple[int, int]]: ...
    @property
    def runnable(self) -> list[Any]: ...  # the threads the scheduler may pick next

    def new_copy_id(self) -> int: ...
    def issue(self, th: Any, copy: Any) -> None: ...
    def wake(self, obj: Any) -> None: ...


class KernelCode(Protocol):
    """A compiled kernel: its tables, and `body(thread)`, a thread's generator."""

    @property
    def kernel(self) -> ir.Kernel: ...
    @property
    def layout(self) -> Layout: ...
    @property
    def decls(self) -> dict[str, Any]: ...
    @property
    def barriers(self) -> list[tuple[str, int]]: ...
    @property
    def slots(self) -> dict[str, int]: ...
    @property
    def hoisted(self) -> dict[int, int]: ...
    @property
    def track_proxy(self) -> bool: ...
    @property
    def body(self) -> Callable[[Any], Any]: ...

    def scratch(self) -> list[Any]: ...
