"""`await(load)`: wait for a one-shot asynchronous load (`async load { ... }`).

It has no PTX of its own: `ptxdsl.lower.oneshot` turns it into `mbarrier.try_wait.parity`
on the load's derived barrier with parity 0, and the block into an armed barrier."""

from __future__ import annotations

from .. import ir
from ..opdef import OpDef, register


@register
class AsyncAwait(OpDef):
    node = ir.AsyncAwait
    operands = (("load", "async", False),)
