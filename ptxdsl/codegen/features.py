"""What a lowered module asks of its target: the features (`Target.features`) its kernels
and statements need, the check that the target has them (a located error rather than a
ptxas failure), and the PTX ISA version its instructions need."""

from __future__ import annotations

from math import prod

from .. import ir
from ..errors import CompileError, Diagnostic, Span
from ..opdef import defined
from ..target import Target, names, target


def stmt_needs(s: ir.Stmt) -> frozenset[str]:
    """The features statement `s` needs: its operation's `needs`, and setmaxnreg where a
    role sets its register count."""
    d = defined(s)
    need = {d.needs} if d is not None and d.needs else set()
    if isinstance(s, ir.SetMaxNReg):
        need.add("setmaxnreg")
    return frozenset(need)


def kernel_needs(k: ir.Kernel) -> frozenset[str]:
    """The features kernel `k` needs as a whole: clusters where it runs in clusters of
    several CTAs."""
    return frozenset({"clusters"}) if k.cluster is not None and prod(k.cluster) > 1 \
        else frozenset()


def features_used(m: ir.Module) -> frozenset[str]:
    """The features the lowered module's kernels and statements need."""
    used: set[str] = set()
    for k in m.kernels:
        used |= kernel_needs(k)
        for s in ir.walk(k.body):
            used |= stmt_needs(s)
    return frozenset(used)


def _what(s: ir.Stmt) -> str:
    if isinstance(s, ir.SetMaxNReg):  # made by lowering a role with `regs`
        return f"this role's register count (setmaxnreg.{'inc' if s.inc else 'dec'} {s.regs})"
    d = defined(s)
    assert d is not None, type(s).__name__  # only operations and SetMaxNReg need features
    return d.syntax


def _refuse(what: str, missing: frozenset[str], t: Target, loc: Span | None) -> CompileError:
    feature = sorted(missing)[0]
    having = " or ".join(n for n in names() if feature in target(n).features)
    return CompileError(Diagnostic(f"{what} needs the {having} target (its {feature} "
                                   f"feature), but the module is compiled for {t.name}", loc))


def require_features(m: ir.Module, t: Target) -> None:
    """Each kernel and statement that needs a feature target `t` lacks: a located error
    naming the feature and the targets that have it."""
    for k in m.kernels:
        if missing := kernel_needs(k) - t.features:
            raise _refuse(f"kernel '{k.name}' with its cluster of {prod(k.cluster or (1,))} CTAs",
                          missing, t, k.loc)
        for s in ir.walk(k.body):
            if missing := stmt_needs(s) - t.features:
                raise _refuse(_what(s), missing, t, s.loc)


def ptx_version(m: ir.Module, t: Target) -> tuple[int, int]:
    """The oldest PTX ISA version with every instruction used: 8.1 for st.async."""
    if any(isinstance(s, ir.StAsync) for k in m.kernels for s in ir.walk(k.body)):
        return max(t.ptx_version, (8, 1))
    return t.ptx_version
