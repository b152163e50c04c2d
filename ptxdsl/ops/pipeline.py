"""Pipeline and role operations: acquire, commit, wait, release, role_sync.

They have no PTX of their own: `ptxdsl.lower.pipelines` rewrites them into mbarrier
operations with derived stage indices, phases, arrival counts and byte totals (and role_sync
into bar.sync).
The builder tracks their regions (an acquire is closed by a commit in the same block)."""

from __future__ import annotations

from .. import ir
from ..opdef import Effect, OpDef, register


@register
class Acquire(OpDef):
    node = ir.Acquire
    effect = Effect(pipeline=True)
    operands = (("pipe", "pipe", False),)


@register
class Commit(OpDef):
    node = ir.Commit
    effect = Effect(pipeline=True)
    operands = (("pipe", "pipe", False),)


@register
class Wait(OpDef):
    node = ir.Wait
    effect = Effect(pipeline=True)
    operands = (("pipe", "pipe", False),)


@register
class Release(OpDef):
    node = ir.Release
    effect = Effect(pipeline=True)
    operands = (("pipe", "pipe", False),)


@register
class RoleSync(OpDef):
    node = ir.RoleSync
    effect = Effect(publishes=True)  # a bar.sync of the role's warps, once lowered
