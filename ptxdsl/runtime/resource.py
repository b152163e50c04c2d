"""One lifetime for everything the runtime holds on the driver's behalf.

A `Resource` (device memory, a VMM mapping, a stream, an event, a CUDA graph) is released
exactly once: by `close()` (or its own spelling of it, e.g. `free()`), at the end of a
`with` block, or when it is garbage-collected. Using it afterwards raises a LaunchError that
names it, instead of passing a stale or zero handle to the driver (a zero stream handle is
the legacy default stream: a closed stream would otherwise launch there silently)."""

from __future__ import annotations

import sys
from typing import Any, ClassVar

from ..errors import LaunchError


class Resource:
    """Base of the runtime's driver-owned objects.

    A subclass sets `noun` (how errors name it) and `released` (the word for what close()
    did: "freed", "closed"), calls `Resource.__init__(self)` once the driver handed it the
    thing it owns, and implements `_release()`, which gives it back. Until `__init__` ran
    the object counts as closed, so a constructor that fails half-way leaves nothing for
    the finaliser to release."""

    __slots__ = ("_open",)
    noun: ClassVar[str] = "resource"
    released: ClassVar[str] = "closed"

    def __init__(self) -> None:
        self._open = True

    def _release(self) -> None:
        raise NotImplementedError

    @property
    def closed(self) -> bool:
        return not getattr(self, "_open", False)

    def close(self) -> None:
        """Release it now; a second call does nothing. Marked closed before the driver is
        called, so a release that fails is not retried by the finaliser."""
        if self.closed:
            return
        self._open = False
        self._release()

    def _check_open(self) -> None:
        if self.closed:
            raise LaunchError(f"the {self.noun} was {self.released} and cannot be used any more")

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if sys.is_finalizing():  # the driver tears its contexts down with the process
            return
        try:
            self.close()
        except Exception:  # a dead context, or a fault reported late: nothing to report to
            pass
