"""What the verifier, the lowering passes and the emitter know about an operation is on its
OpDef (`effect`, `sm80`, `needs`): every role names a field of the operation's node, and the
flags hold their values."""

import dataclasses

import pytest

import ptxdsl  # noqa: F401  (registers every operation)
from ptxdsl import ir
from ptxdsl.opdef import NO_EFFECT, REGISTRY, Effect, effect
from ptxdsl.target import target

ROLES = ("arrive", "count", "expect", "complete", "wait", "parity", "init", "inval",
         "async_read", "async_write", "global_operand", "size", "named_barrier")


@pytest.mark.parametrize("node", sorted(REGISTRY, key=lambda n: n.__name__),
                         ids=lambda n: n.__name__)
def test_every_effect_role_names_a_field_of_its_node(node):
    d = REGISTRY[node]
    fields = {f.name for f in dataclasses.fields(node)}
    roles = {r: getattr(d.effect, r) for r in ROLES if getattr(d.effect, r) is not None}
    assert set(roles.values()) <= fields, f"{d.syntax}: {roles} against fields {fields}"
    assert d.effect.cp_async in (None, "copy", "completes")
    assert d.effect.cluster_barrier in (None, "arrive", "wait", "sync")
    assert d.sm80 in ("", "keep", "keep_one", "drop", "copy")
    assert d.needs == "" or d.needs in target("sm_90a").features


def test_the_roles_are_every_operand_field_of_an_effect():
    named = {f.name for f in dataclasses.fields(Effect) if f.type == "str | None"}
    assert named - {"cp_async", "cluster_barrier"} == set(ROLES)


def test_statements_without_an_operation_have_no_effect():
    s = ir.Return()
    assert effect(s) is NO_EFFECT
    assert effect(ir.BulkStore(dst=None, src=None, nbytes=None)).async_read == "src"
