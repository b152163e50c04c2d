"""Ampere (sm_80) forms in the verifier: cp.async copies must be waited for (a
wait_group/wait_all, or an mbarrier arrive-on). The arrive-on and the test_wait loop are an
arrival and a wait through their effects (`ptxdsl.ops.sm80`)."""

from __future__ import annotations

from .. import ir
from .. import types as T
from ..errors import DiagnosticBag, Note
from ..fp8 import conversion_unsupported
from ..target import Target
from .effects import bar, effect, issuers
from .facts import Facts, Report


def check_cp_async(facts: Facts, out: Report) -> None:
    """Copies that nothing waits for, and group waits with no group ever committed."""
    stmts = list(ir.walk(facts.kernel.body))
    copies = [s for s in stmts if effect(s).cp_async == "copy"]
    if copies and not any(effect(s).cp_async == "completes" for s in stmts):
        out.error(f"this {copies[0].syntax} is never waited for: follow the copies with "  # type: ignore[attr-defined]
                  "cp_async_commit() and cp_async_wait(n) / cp_async_wait_all(), or with "
                  "cp_async_mbarrier_arrive[_noinc](bar) and a wait on bar", copies[0].loc)
    waits = [s for s in stmts if isinstance(s, ir.CpAsyncWait)]
    if copies and waits and not any(isinstance(s, ir.CpAsyncCommit) for s in stmts):
        out.error("cp_async_wait(n) waits for committed groups, but no cp_async_commit() ever "
                  "closes one, so it waits for nothing; commit the copies or use "
                  "cp_async_wait_all()", waits[0].loc)


def check_noinc_arrivals(facts: Facts, out: Report) -> None:
    """A barrier that cp.async arrive-ons complete: the threads arriving at all its sites in
    one phase (plain and noinc arrivals together) = its count. (The general arrival check
    gives up when one thread arrives at two sites, as the elected issuer does here.)"""
    from .barriers import _init_count

    sites: dict[str, list] = {}
    for v in facts.trace.visits:
        b = bar(v, effect(v.stmt).arrive)
        if b is not None and v.counted:
            sites.setdefault(b.decl.name, []).append((v, b))
    for visits in sites.values():
        if not any(isinstance(v.stmt, ir.CpAsyncArriveNoinc) for v, _ in visits):
            continue
        if not all(v.certain and getattr(v.stmt, "count", None) is None for v, _ in visits):
            continue
        decl = visits[0][1].decl
        want, where = _init_count(facts, decl)
        total = sum(issuers(v) for v, _ in visits)
        if want is not None and total != want:
            head = visits[0][0]
            notes = [Note(f"{issuers(v)} more arrival(s) here", v.stmt.loc) for v, _ in visits[1:]]
            out.error(f"'{decl.name}' gets {total} arrivals in each phase ({issuers(head)} here, "
                      f"the rest from cp.async arrive-ons and other arrives), but its arrival "
                      f"count is {want}", head.stmt.loc, *notes, where)


def check_fp8_conversions(facts: Facts, out: Report) -> None:
    """Conversions to or from fp8 need a target with fp8 `cvt` (what codegen would refuse,
    `check` reports)."""
    if facts.target.fp8_cvt:
        return
    for s in facts.statements:
        for e in ir.exprs_of(s, ir.Cast):
            src, dst = e.x.type, e.type
            if isinstance(src, T.Scalar) and isinstance(dst, T.Scalar) and \
                    (src.is_fp8 or dst.is_fp8) and not src.is_pred:
                out.error(conversion_unsupported(src, dst, facts.target.name), e.loc or s.loc)


def verify_sm80_kernel(k: ir.Kernel, diags: DiagnosticBag, t: Target) -> None:
    """The checks that apply to a kernel after the sm_80 pass: the re-derived arrival counts
    (noinc arrivals included), waits that can return, and the cp.async rules."""
    from .barriers import check_arrival_counts, check_waits

    facts, report = Facts(k, t), Report(diags)
    for check in (check_arrival_counts, check_noinc_arrivals, check_waits, check_cp_async,
                  check_fp8_conversions):
        check(facts, report)
