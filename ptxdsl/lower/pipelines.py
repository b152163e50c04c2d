"""Lowering: pipelines and roles become the base IR (mbarriers, ifs, loops).

What the author does not write is derived here:
  - each stage's full barrier expects as many arrivals as threads run `commit`, and each commit
    arms it with the bytes of the copies issued since `acquire`;
  - each stage's empty barrier expects as many arrivals as threads run `release`;
  - stage index and phase are registers per pipeline side, advanced by commit / release;
    where a consumer waits again before it releases (a lagging release, see lag.py), its
    wait advances the wait cursor and its release a release cursor of its own;
  - barriers are initialised by one thread, fenced, and published with `bar.sync 0`;
  - roles become one if/else chain on `%warp` with `setmaxnreg` and a derived register cap;
  - a producer waits for every stage to be released before it exits (the producer tail), so
    no consumer can still signal a CTA that has left. Only threads that acquired wait: where
    the producer loop runs on more threads than its `acquire` (a role that both produces and
    consumes, one thread fetching for all), a per-thread flag set by `acquire` guards the
    tail, since a thread that never acquired waits for a phase that never completes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .. import ir
from .. import types as T
from ..errors import DiagnosticBag, Note, Span
from ..opdef import const_int, effect
from .lag import lagging_pipes
from .multicast import group_size, remote_release
from .oneshot import OneShots
from .threads import ThreadModel

REGISTER_FILE = 65536


def _c(v: int, t: T.Scalar = T.u32) -> ir.Const:
    return ir.Const(value=v, type=t)


def _var(name: str) -> ir.Var:
    return ir.Var(name=name, type=T.u32)


def _and(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    return ir.Binary(op="and", a=a, b=b, type=T.pred)


def _cmp(op: str, a: ir.Expr, b: ir.Expr) -> ir.Expr:
    return ir.Compare(op=op, a=a, b=b, type=T.pred)


# ----------------------------------------------------------------------------- analysis


@dataclass
class _PipeFacts:
    decl: ir.PipelineDecl
    commit_threads: dict[int, tuple[int, Span | None]] = field(default_factory=dict)
    # the threads that run each release, and where it is
    release_threads: dict[int, tuple[frozenset[int], Span | None]] = field(default_factory=dict)
    release_per_warp: dict[int, bool] = field(default_factory=dict)
    commit_bytes: dict[int, int] = field(default_factory=dict)
    mask: ir.Expr | None = None  # multicast group of a cluster pipeline (see multicast.py)
    group: int = 1  # CTAs whose copies fill each stage
    # some producer loop runs on threads that do not acquire: the tail needs the acquired flag
    partial_tail: bool = False


class _Lowerer:
    def __init__(self, k: ir.Kernel, diags: DiagnosticBag):
        self.k = k
        self.diags = diags
        self.pipes: dict[str, _PipeFacts] = {}
        self.lagging: set[str] = set()
        self.oneshots = OneShots(diags)
        self.model = ThreadModel(k.threads)
        self.roles: list[ir.Role] = [s for s in k.body if isinstance(s, ir.Role)]
        assigned = {s.name for s in ir.walk(k.body) if isinstance(s, ir.Assign)}
        for s in ir.walk(k.body):
            if isinstance(s, ir.Let) and s.value is not None and s.name not in assigned:
                self.model.env[s.name] = s.value

    # -- pass 1: who commits / releases, and how many bytes each commit covers
    def analyse(self, stmts: tuple[ir.Stmt, ...], path: list, in_role: bool = False,
                tail_path: list | None = None, local: dict[str, int] | None = None) -> None:
        """`tail_path`: the path to the producer loop that gets the tail (see `block`);
        `local`: the bytes copied so far into each acquired stage, shared with the copies of
        an `unroll` loop between an acquire and its commit (each iteration counts)."""
        local = {} if local is None else local
        for s in stmts:
            if isinstance(s, ir.PipelineDecl):
                self.pipes[s.name] = _PipeFacts(s)
            elif isinstance(s, ir.Role):
                cond = self.role_cond(s)
                self.analyse(s.body, path + [(cond, True)], True)
            elif isinstance(s, ir.If) and self.either_way(s, path):
                # one thread runs this branch on data, and both arms issue the same pipeline
                # operations: whichever arm it takes, that thread acquires, commits or
                # releases the same stages (a copy's source chosen per stage)
                self.analyse(s.then, path, in_role, tail_path)
                self.analyse(s.orelse, path, in_role, tail_path)
            elif isinstance(s, ir.If):
                self.analyse(s.then, path + [(s.cond, True)], in_role, tail_path)
                self.analyse(s.orelse, path + [(s.cond, False)], in_role, tail_path)
            elif isinstance(s, ir.For) and s.unroll and local and not any(
                    isinstance(x, (ir.Acquire, ir.Commit)) for x in ir.walk(s.body)):
                before = dict(local)
                self.analyse(s.body, path, in_role, tail_path, local)
                trips = len(range(const_int(s.start) or 0, const_int(s.stop) or 0,
                                  const_int(s.step) or 1))
                for name, n in local.items():
                    local[name] = before.get(name, 0) + (n - before.get(name, 0)) * trips
            elif isinstance(s, (ir.For, ir.While)):
                tails = in_role and tail_path is None and bool(_committed(s.body))
                self.analyse(s.body, path, in_role, path if tails else tail_path)
            elif isinstance(s, ir.Acquire):
                local[s.pipe.name] = 0  # type: ignore[attr-defined]
                if tail_path is not None and not self.same_threads(tail_path, path):
                    self.pipes[s.pipe.name].partial_tail = True  # type: ignore[attr-defined]
            elif isinstance(s, ir.Commit):
                name = s.pipe.name  # type: ignore[attr-defined]
                self.pipes[name].commit_bytes[id(s)] = local.pop(name, 0)
                self.pipes[name].commit_threads[id(s)] = (self.count(path, s), s.loc)
            elif isinstance(s, ir.Release):
                name = s.pipe.name  # type: ignore[attr-defined]
                facts = self.pipes[name]
                threads = self.threads(path, s)
                # whole warps release with one elected arrival each: fewer atomics on the
                # barrier, and the warp has converged, so all its lanes are done with the stage
                warps = {t // 32 for t in threads}
                per_warp = bool(threads) and all(
                    all(w * 32 + i in threads for i in range(32)) for w in warps)
                facts.release_per_warp[id(s)] = per_warp
                facts.release_threads[id(s)] = (threads, s.loc)
            elif (effect(s).loads_global or effect(s).multicast) and \
                    isinstance(s.bar, ir.StageBarrier):  # type: ignore[attr-defined]
                name = s.bar.pipe  # type: ignore[attr-defined]
                if name not in local:
                    self.diags.error(f"a copy into a stage of '{name}' must be issued in the same "
                                     f"block as its acquire({name}) and commit({name}), so the "
                                     "bytes it delivers can be derived", s.loc)
                    continue
                # a multicast stage fills with the copies of every CTA of its group
                group = self.multicast_group(name, s) if effect(s).multicast else 1  # type: ignore[arg-type]
                local[name] += self.copy_bytes(s) * group
            else:  # any other block (an async one) runs once, where it stands (see `block`)
                for b in ir.blocks(s):
                    self.analyse(b, path, in_role, tail_path, local)

    def multicast_group(self, name: str, s: ir.TensorLoadMulticast | ir.BulkLoadMulticast) -> int:
        """The group size of a multicast into a stage; every such copy of a pipeline shares
        one mask."""
        facts = self.pipes[name]
        g = group_size(s.mask, self.k.cluster)
        if g is None:
            self.diags.error("a multicast into a pipeline stage needs a group mask that every "
                             "CTA of the group uses alike: cluster_mask(), cluster_row_mask() or "
                             "cluster_col_mask()", s.mask.loc or s.loc)
            return 1
        if facts.mask is not None and facts.mask != s.mask:
            self.diags.error(f"every multicast into '{name}' must use the same mask",
                             s.mask.loc or s.loc)
        facts.mask, facts.group = s.mask, g
        return g

    def copy_bytes(self, s) -> int:
        if effect(s).tma:  # a tensor copy moves its whole box, the shared view
            return s.dst.type.nbytes  # type: ignore[attr-defined]
        if isinstance(s.nbytes, ir.Const):
            return int(s.nbytes.value)
        self.diags.error("a copy whose barrier is derived (into a pipeline stage, or in an "
                         "async block) needs a constant byte count", s.loc)
        return 0

    def either_way(self, s: ir.If, path: list) -> bool:
        """Whether `s` branches on data (not on thread indices) where at most one thread runs,
        with arms that issue the same pipeline operations, none of them in a nested block:
        the arrivals then do not depend on the arm taken."""
        try:
            if len(self.model.active(path)) > 1:
                return False
        except ir.Unknown:
            return False
        try:
            self.model.active(path + [(s.cond, True)])
            return False  # a condition the thread model follows: the ordinary case
        except ir.Unknown:
            pass
        arms = [_pipeline_ops(s.then), _pipeline_ops(s.orelse)]
        return arms[0] is not None and arms[0] == arms[1] and bool(arms[0])

    def same_threads(self, a: list, b: list) -> bool:
        """Whether paths `a` and `b` are run by the same threads (False when unknown)."""
        try:
            return self.model.active(a) == self.model.active(b)
        except ir.Unknown:
            return False

    def count(self, path: list, s: ir.Stmt) -> int:
        return len(self.threads(path, s))

    def threads(self, path: list, s: ir.Stmt) -> frozenset[int]:
        try:
            return self.model.active(path)
        except ir.Unknown:
            self.diags.error("cannot tell which threads run this statement, so its barrier "
                             "arrival count cannot be derived; select threads with conditions on "
                             "%tid, %warp, %laneid, elect() or a role", s.loc)
            return frozenset()

    def arrivals(self, facts: dict[int, tuple[int, Span | None]], what: str, pipe: str) -> int:
        counts = {n for n, _ in facts.values()}
        if not facts:
            return 1
        if len(counts) > 1:
            first, *rest = facts.values()
            self.diags.error(f"every {what}({pipe}) must be run by the same number of threads; "
                             f"this one by {rest[0][0]}", rest[0][1],
                             Note(f"this one by {first[0]}", first[1]))
        n = max(counts)
        if n == 0:
            loc = next(iter(facts.values()))[1]
            self.diags.error(f"no thread runs this {what}({pipe})", loc)
            return 1
        return n

    def releases(self, facts: _PipeFacts, pipe: str) -> int:
        """The arrivals on a stage's empty barrier per phase. Every thread's cursor visits
        every stage in turn, so the threads of each release arrive on every stage: releases
        run by other threads (another role, other warps) add up, while those run by the same
        threads (the arms of a branch) arrive once between them; a whole warp arrives once."""
        sites: dict[frozenset[int], tuple[int, Span | None]] = {}
        for key, (threads, loc) in facts.release_threads.items():
            per_warp = facts.release_per_warp[key]
            sites.setdefault(threads, (len({t // 32 for t in threads}) if per_warp
                                       else len(threads), loc))
        if not sites:
            return 1
        seen: dict[int, Span | None] = {}
        for threads, (_, loc) in sites.items():
            shared = threads & seen.keys()
            if shared:
                other = seen[min(shared)]
                self.diags.error(f"this release({pipe}) is run by some threads of another "
                                 f"release({pipe}) and not by others, so the arrivals on a "
                                 "stage cannot be derived; release with the same threads, or "
                                 "with threads of their own", loc,
                                 Note("the other release is here", other))
            seen.update(dict.fromkeys(threads, loc))
        n = sum(count for count, _ in sites.values())
        if n == 0:
            self.diags.error(f"no thread runs this release({pipe})",
                             next(iter(sites.values()))[1])
            return 1
        return n

    # -- pass 2: rewrite
    def role_cond(self, r: ir.Role) -> ir.Expr:
        warp = ir.SReg(name="warp", type=T.u32)
        upper = _cmp("lt", warp, _c(r.warp_stop))
        return upper if r.warp_start == 0 else _and(_cmp("ge", warp, _c(r.warp_start)), upper)

    def expr(self, e):
        if isinstance(e, ir.StageBuf):
            decl = next(d for d in self.pipes[e.pipe].decl.buffers if d.name == e.buf)
            stages = self.pipes[e.pipe].decl.stages
            whole = ir.SharedBuf(name=f"{e.pipe}.{e.buf}", loc=e.loc,
                                 type=T.SharedRef(decl.elem, (stages, *decl.shape)))
            return ir.Index(base=whole, indices=(_var(f"{e.pipe}.{e.side}_stage"),), type=e.type,
                            loc=e.loc)
        if isinstance(e, ir.StageIndex):
            return _var(f"{e.pipe}.{e.side}_stage")
        if isinstance(e, ir.StageBarrier):
            return self.stage_bar(e.pipe, "full", "put")
        if isinstance(e, ir.AsyncBarrier):
            return self.oneshots.bar(e.name)
        if isinstance(e, tuple):
            return tuple(self.expr(x) for x in e)
        if not isinstance(e, ir.Expr):
            return e
        changes = {}
        for f in dataclasses.fields(e):
            v = getattr(e, f.name)
            if isinstance(v, (ir.Expr, tuple)):
                nv = self.expr(v)
                if nv is not v:
                    changes[f.name] = nv
        return dataclasses.replace(e, **changes) if changes else e

    def stage_bar(self, pipe: str, which: str, side: str) -> ir.Expr:
        stages = self.pipes[pipe].decl.stages
        arr = ir.BarrierObj(name=f"{pipe}.{which}", type=T.BarrierRef(stages))
        return ir.Index(base=arr, indices=(_var(f"{pipe}.{side}_stage"),), type=T.BarrierRef(0))

    def advance(self, pipe: str, side: str, loc: Span | None) -> list[ir.Stmt]:
        """The cursor of `side` moves to the next stage; its phase flips on the wrap-around
        (the release cursor of a lagging consumer has no phase: an arrival needs none)."""
        n = self.pipes[pipe].decl.stages
        stage, phase = _var(f"{pipe}.{side}_stage"), _var(f"{pipe}.{side}_phase")
        last = _cmp("eq", stage, _c(n - 1))
        flip = ir.Select(cond=last, a=_c(1), b=_c(0), type=T.u32)
        nxt = ir.Select(cond=last, a=_c(0), b=ir.Binary(op="add", a=stage, b=_c(1), type=T.u32),
                        type=T.u32)
        step: list[ir.Stmt] = [ir.Assign(name=stage.name, value=nxt, loc=loc)]
        if side == "rel":
            return step
        return [ir.Assign(name=phase.name, value=ir.Binary(op="xor", a=phase, b=flip,
                                                          type=T.u32), loc=loc), *step]

    def acquire(self, pipe: str, loc: Span | None, role=None) -> ir.MBarrierWait:
        parity = ir.Binary(op="xor", a=_var(f"{pipe}.put_phase"), b=_c(1), type=T.u32)
        return ir.MBarrierWait(bar=self.stage_bar(pipe, "empty", "put"), parity=parity, loc=loc,
                               role=role[1].name if role else "")

    def tail(self, pipe: str, loc: Span | None, role: tuple[int, ir.Role]) -> list[ir.Stmt]:
        """The producer tail: wait until every stage is released, on the phase this thread's
        acquires reached; only threads that acquired wait where some did not."""
        out: list[ir.Stmt] = []
        for _ in range(self.pipes[pipe].decl.stages):
            wait = self.acquire(pipe, loc, role)
            out.append(dataclasses.replace(wait, role=f"{wait.role}, producer tail"))
            out += self.advance(pipe, "put", loc)
        if not self.pipes[pipe].partial_tail:
            return out
        acquired = _cmp("ne", _var(f"{pipe}.put_acquired"), _c(0))
        return [ir.If(cond=acquired, then=tuple(out), orelse=(), loc=loc)]

    def block(self, stmts: tuple[ir.Stmt, ...], role: tuple[int, ir.Role] | None,
              in_commit_loop: bool = False) -> tuple[ir.Stmt, ...]:
        out: list[ir.Stmt] = []
        stores: set[str] = set()
        for s in stmts:
            if isinstance(s, ir.Acquire):
                name = s.pipe.name  # type: ignore[attr-defined]
                out.append(self.acquire(name, s.loc, role))
                if self.pipes[name].partial_tail:
                    out.append(ir.Assign(name=f"{name}.put_acquired", value=_c(1), loc=s.loc))
            elif isinstance(s, ir.Commit):
                name = s.pipe.name  # type: ignore[attr-defined]
                nbytes = self.pipes[name].commit_bytes.get(id(s), 0)
                out.append(ir.MBarrierArriveExpectTx(bar=self.stage_bar(name, "full", "put"),
                                                     nbytes=_c(nbytes), loc=s.loc))
                out += self.advance(name, "put", s.loc)
            elif isinstance(s, ir.Wait):
                name = s.pipe.name  # type: ignore[attr-defined]
                if name in self.lagging:  # the cursor rests on the stage waited last
                    out += self.advance(name, "get", s.loc)
                out.append(ir.MBarrierWait(bar=self.stage_bar(name, "full", "get"),
                                           parity=_var(f"{name}.get_phase"), loc=s.loc,
                                           role=role[1].name if role else ""))
            elif isinstance(s, ir.Release):
                name = s.pipe.name  # type: ignore[attr-defined]
                if name in stores:  # the stage is reused only once the store has read it
                    out.append(ir.BulkWaitRead(n=_c(0), loc=s.loc))
                    stores.discard(name)
                side = "rel" if name in self.lagging else "get"
                arrive: ir.Stmt = ir.MBarrierArrive(bar=self.stage_bar(name, "empty", side),
                                                    loc=s.loc)
                mask = self.pipes[name].mask
                if mask is not None:
                    arrive = remote_release(self.stage_bar(name, "empty", side), mask,
                                            self.k.cluster, s.loc)
                if self.pipes[name].release_per_warp.get(id(s)):
                    elect = ir.Call(fn="elect", args=(), type=T.pred)
                    out.append(ir.If(cond=elect, then=(arrive,), orelse=(), loc=s.loc))
                else:
                    out.append(arrive)
                out += self.advance(name, side, s.loc)
            elif (src := effect(s).async_read) is not None and \
                    isinstance(getattr(s, src), ir.StageBuf):  # a store out of a stage
                stores.add(getattr(s, src).pipe)
                out.append(ir.FenceProxyAsync(loc=s.loc))
                out.append(self.stmt(s, role, in_commit_loop))
                out.append(ir.BulkCommit(loc=s.loc))
            elif isinstance(s, (ir.For, ir.While)) and role is not None and \
                    not in_commit_loop and (pipes := _committed(s.body)):
                out.append(self.stmt(s, role, True))
                for name in pipes:
                    out += self.tail(name, s.loc, role)
            elif isinstance(s, ir.AsyncLoad):
                out += self.oneshots.expand(s, lambda b: self.block(b, role, in_commit_loop))
            elif isinstance(s, ir.AsyncAwait):
                out.append(self.oneshots.wait(s, role[1].name if role else "", s.loc))
            else:
                out.append(self.stmt(s, role, in_commit_loop))
        return tuple(out)

    def stmt(self, s: ir.Stmt, role, in_commit_loop: bool) -> ir.Stmt:
        if isinstance(s, ir.Role):
            return s  # lowered by `role_chains`, which knows its place in the chain
        if isinstance(s, ir.MBarrierWait) and role is not None:
            return dataclasses.replace(s, bar=self.expr(s.bar), parity=self.expr(s.parity),
                                       role=role[1].name)
        if isinstance(s, ir.RoleSync):
            idx, r = role  # type: ignore[misc]
            return ir.BarSync(id=_c(1 + idx), nthreads=_c(32 * (r.warp_stop - r.warp_start)),
                              loc=s.loc)
        changes = {}
        for name in ir.node_fields(s):
            v = getattr(s, name)
            if isinstance(v, (ir.Expr, tuple)):
                nv = self.expr(v)
                if nv is not v:
                    changes[name] = nv
        s = dataclasses.replace(s, **changes) if changes else s
        return ir.with_blocks(s, lambda b: self.block(b, role, in_commit_loop))

    def lower(self) -> ir.Kernel:
        self.analyse(self.k.body, [])
        self.oneshots.analyse(self.k.body, [], None, self.role_cond, self.threads,
                              self.copy_bytes)
        self.check_role_coverage()
        self.lagging = lagging_pipes(self.k.body, {n: f.decl.stages for n, f in self.pipes.items()},
                                     self.diags)
        maxnreg = self.register_cap()
        top: list[ir.Stmt] = []
        inits: list[ir.Stmt] = []
        cursors: list[ir.Stmt] = []
        top += self.oneshots.decls()
        inits += self.oneshots.inits()
        for name, facts in self.pipes.items():
            d = facts.decl
            full = self.arrivals(facts.commit_threads, "commit", name)
            empty = self.releases(facts, name) * facts.group
            for b in d.buffers:
                top.append(dataclasses.replace(b, name=f"{name}.{b.name}",
                                               shape=(d.stages, *b.shape)))
            top.append(ir.BarrierDecl(name=f"{name}.full", n=d.stages, count=full, loc=d.loc))
            top.append(ir.BarrierDecl(name=f"{name}.empty", n=d.stages, count=empty, loc=d.loc))
            for s in range(d.stages):
                for which in ("full", "empty"):
                    arr = ir.BarrierObj(name=f"{name}.{which}", type=T.BarrierRef(d.stages))
                    bar = ir.Index(base=arr, indices=(_c(s),), type=T.BarrierRef(0))
                    inits.append(ir.MBarrierInit(bar=bar, loc=d.loc))
            # a lagging consumer's wait cursor starts one stage before stage 0 (it advances
            # before it waits), its release cursor at stage 0
            lag = name in self.lagging
            for side, what, v in (("put", "stage", 0), ("put", "phase", 0),
                                  ("get", "stage", d.stages - 1 if lag else 0),
                                  ("get", "phase", int(lag)), *([("rel", "stage", 0)] * lag)):
                cursors.append(ir.Let(name=f"{name}.{side}_{what}", var_type=T.u32,
                                      value=_c(v), loc=d.loc))
            if facts.partial_tail:
                cursors.append(ir.Let(name=f"{name}.put_acquired", var_type=T.u32, value=_c(0),
                                      loc=d.loc))
        clustered = any(f.mask is not None for f in self.pipes.values())
        body: list[ir.Stmt] = []
        for st in self.k.body:
            if not isinstance(st, ir.PipelineDecl):
                body.append(st)
        decls = [s for s in body if isinstance(s, (ir.SharedDecl, ir.BarrierDecl))]
        rest = [s for s in body if not isinstance(s, (ir.SharedDecl, ir.BarrierDecl))]
        prologue: list[ir.Stmt] = []
        if inits:
            leader = _cmp("eq", ir.SReg(name="warp", type=T.u32), _c(0))
            leader = _and(leader, _cmp("eq", ir.SReg(name="laneid", type=T.u32), _c(0)))
            prologue.append(ir.If(cond=leader, then=(*inits, ir.FenceMBarrierInit()), orelse=()))
            # a cluster pipeline publishes its barriers to the peers that multicast into them
            prologue.append(ir.ClusterSync() if clustered else ir.BarSync(id=_c(0)))
        lowered = self.block(tuple(rest), None)
        lowered = self.role_chains(lowered, maxnreg)
        if clustered:  # no CTA leaves while a peer may still write to it or arrive on it
            lowered = (*lowered, ir.ClusterSync())
        new_body = (*decls, *top, *cursors, *prologue, *lowered)
        return dataclasses.replace(self.k, body=new_body, maxnreg=maxnreg)

    def role_chains(self, stmts: tuple[ir.Stmt, ...], maxnreg: int | None) -> tuple[ir.Stmt, ...]:
        """Consecutive roles become one if/else-if chain (setmaxnreg needs that shape)."""
        out: list[ir.Stmt] = []
        group: list[ir.Role] = []

        def flush() -> None:
            chain: tuple[ir.Stmt, ...] = ()
            for r in reversed(group):
                idx = self.roles.index(r)
                body = self.block(r.body, (idx, r))
                if r.regs is not None and maxnreg is not None and r.regs != maxnreg:
                    body = (ir.SetMaxNReg(regs=r.regs, inc=r.regs > maxnreg, loc=r.loc), *body)
                chain = (ir.If(cond=self.role_cond(r), then=body, orelse=chain, loc=r.loc),)
            out.extend(chain)
            group.clear()

        for s in stmts:
            if isinstance(s, ir.Role):
                group.append(s)
                continue
            if group:
                flush()
            out.append(s)
        if group:
            flush()
        return tuple(out)

    def check_role_coverage(self) -> None:
        """Every warp of a warp-specialised CTA belongs to a role, so no warp's work is implicit."""
        if not self.roles:
            return
        nwarps = (self.k.nthreads + 31) // 32
        covered = {w for r in self.roles for w in range(r.warp_start, r.warp_stop)}
        missing = [w for w in range(nwarps) if w not in covered]
        if missing:
            runs = _ranges(missing)
            self.diags.error(f"warps {runs} of this {self.k.nthreads}-thread CTA belong to no "
                             "role; give them one (an idle role is `role idle warps a .. b { }`)",
                             self.roles[0].loc)

    def register_cap(self) -> int | None:
        """The entry register count that makes ptxas honour setmaxnreg, and the budget check."""
        k = self.k
        if not any(r.regs is not None for r in self.roles):
            return k.maxnreg
        nthreads = k.nthreads
        cap = k.maxnreg
        if cap is None:
            cap = min(255, REGISTER_FILE // (nthreads * (k.minctas or 1)) // 8 * 8)
        in_roles = sum(32 * (r.warp_stop - r.warp_start) for r in self.roles)
        total = sum(32 * (r.warp_stop - r.warp_start) * (r.regs if r.regs is not None else cap)
                    for r in self.roles) + (nthreads - in_roles) * cap
        if total * (k.minctas or 1) > REGISTER_FILE:
            self.diags.error(f"the roles' registers add up to {total} per CTA (threads x regs); "
                             f"the register file holds {REGISTER_FILE}", self.roles[0].loc)
        return cap


def _ranges(ws: list[int]) -> str:
    """[2, 3, 5] -> '2 .. 4, 5 .. 6' (half-open, as roles write them)."""
    out, start = [], ws[0]
    for a, b in zip(ws, [*ws[1:], None], strict=True):
        if b != a + 1:
            out.append(f"{start} .. {a + 1}")
            if b is not None:
                start = b
    return ", ".join(out)


def _pipeline_ops(stmts: tuple[ir.Stmt, ...]) -> tuple[tuple[str, str], ...] | None:
    """The pipeline operations of a block in order, as (operation, pipeline); None when one
    sits in a nested block (a loop or a branch: how often it runs is not the block's)."""
    top = [s for s in stmts if effect(s).pipeline]
    if len(top) != sum(effect(s).pipeline for s in ir.walk(stmts)):
        return None
    return tuple((type(s).__name__, s.pipe.name) for s in top)  # type: ignore[attr-defined]


def _committed(stmts: tuple[ir.Stmt, ...]) -> list[str]:
    names = []
    for s in ir.walk(stmts):
        if isinstance(s, ir.Commit) and s.pipe.name not in names:  # type: ignore[attr-defined]
            names.append(s.pipe.name)  # type: ignore[attr-defined]
    return names


def lower_kernel(k: ir.Kernel, diags: DiagnosticBag) -> ir.Kernel:
    """The kernel with every pipeline, role and one-shot load lowered; problems go to `diags`."""
    if not any(isinstance(s, (ir.PipelineDecl, ir.Role, ir.AsyncLoad)) for s in ir.walk(k.body)):
        return k
    return _Lowerer(k, diags).lower()
