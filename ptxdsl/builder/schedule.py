"""Tile schedules: which work items a persistent grid gives each CTA, declared once and
walked the same way in every role.

    schedule work tiles(TM, TN) [group(G)] [ksteps(KT)] [splits(S) | streamk] [clusters];
    schedule work tiles(TN) groups(offs, G, BM) [group(G)] [ksteps(KT)] [clusters];
    for w in work { ... w.m, w.n, w.k0, w.k1 ... }

The output is TM x TN tiles. Worker c (%ctaid.x, or %clusterid.x with `clusters`) of U
(%nctaid.x or %nclusterid.x) visits its items in order; each is a tile and a range of its
K steps [w.k0, w.k1), never empty:

- dense (no splits, no streamk): items are the tiles, c, c + U, ...; an item has every K step.
- `splits(S)`: each tile's KT K steps in min(S, KT) near-equal ranges; items are split-major
  (every tile's first range, then every tile's second, ...).
- `streamk`: the tiles that would leave the last wave partial, plus one full wave, are
  shared K step by K step among the workers (each a contiguous run of K steps, so a tile is
  split over consecutive workers); the rest are whole tiles, U to a wave, after them. Every
  worker gets the same number of K steps, to within one. A worker walks its run from the
  end, a tile's part at a time, so that all start on some tile's first K step together.
- `group(G)`: tiles are numbered in bands of G tile-rows, column by column within a band
  (consecutive tiles share a B tile-column and G A tile-rows in L2); without it, column by
  column over all rows.
- `groups(offs, G, BM)` (with `tiles(TN)`): G groups of rows, group g owning rows offs[g] ..
  offs[g + 1] (`offs`: G + 1 u32), each cut into BM-row tile-rows; `groups(counts, G, BM,
  cap)`: group g owns rows g * cap .. g * cap + min(counts[g], cap). Every group's tiles,
  group after group (groups with no rows passed over), whole.

Fields of an item (u32 unless said): m, n (tile coordinates), tile (the tile's number in
that order: a key for semaphores and workspace slots), k0, k1, split (which range of the
tile this is, in K order) and splits (how many items share the tile), whole (pred: splits
== 1, the item alone writes its tile); with groups, group, row0 (the group's first row) and
rows (its rows), m being the tile-row within the group.

Both are desugared here into lets and a `for` (a `while` for streamk; with groups, a `for`
over the groups' tile-rows at the declaration and a `while` moving a group cursor at the top
of each item), so the verifier, the interpreter and codegen see ordinary code, and printing
gives back source that parses to the same IR. Only the fields a body reads are computed:
`w.m` becomes a `let w_m` at the top of the loop body."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from .. import ir
from .. import types as T
from ..errors import Note, Span
from .common import Lit, Operand, Symbol, describe, is_err
from .stmts import Statements

CLAUSES = {"tiles": (1, 2), "group": (1,), "ksteps": (1,), "splits": (1,), "streamk": (0,),
           "clusters": (0,), "groups": (3, 4)}
FIELDS = ("m", "n", "tile", "k0", "k1", "split", "splits", "whole", "group", "row0", "rows")
GROUPED = ("group", "row0", "rows")  # the fields of a grouped schedule only
HELPERS = ("band0", "bandrows", "shared", "wfirst", "local")  # lets fields are computed through
STATE = ("it", "end", "next", "grp", "gstart", "gend")  # a walk's state, before its loop


@dataclass
class Schedule:
    name: str
    tm: Operand
    tn: Operand
    group: int | None
    ksteps: Operand | None
    mode: str  # dense | splits | streamk
    clusters: bool
    loc: Span | None
    # groups(offs, G, BM) or groups(counts, G, BM, cap): the rows source, G, BM, cap
    groups: tuple[ir.Expr, ir.Expr, int, ir.Expr | None] | None = None
    lets: dict[str, ir.Expr] = field(default_factory=dict)  # tiles, band, splits, items, sk...


@dataclass
class Item:
    """One `for w in work` loop being built: the fields its body has read so far."""

    sched: Schedule
    var: str
    used: dict[str, Span | None] = field(default_factory=dict)
    state: str = ""  # prefix of the walk's state before the loop (var, or var2 if taken)

    def st(self, what: str) -> str:
        return f"{self.state}_{what}"


def _u(name: str) -> ir.Var:
    return ir.Var(name=name, type=T.u32)


class Schedules(Statements):
    """`schedule` declarations and `for w in work` loops, desugared on the spot."""

    # -- the declaration ------------------------------------------------------------------

    def schedule(self, name: str, clauses: list[tuple[str, list[Operand], Span | None]],
                 loc: Span | None = None) -> ir.Expr:
        """`schedule name clause...;`: checks the clauses, computes the schedule-wide values
        (lets named name_...) and declares `name`."""
        bad = ir.Const(value=0, type=T.error, loc=loc)
        errors = len(self.diags.items)
        got: dict[str, list[Operand]] = {}
        for cname, args, cloc in clauses:
            if cname not in CLAUSES:
                hint = difflib.get_close_matches(cname, list(CLAUSES), n=1)
                more = f"; did you mean '{hint[0]}'?" if hint else \
                    f" (clauses: {', '.join(CLAUSES)})"
                self.diags.error(f"unknown schedule clause '{cname}'{more}", cloc)
            elif cname in got:
                self.diags.error(f"schedule clause '{cname}' is given twice", cloc)
            elif len(args) not in CLAUSES[cname]:
                n = " or ".join(map(str, CLAUSES[cname]))
                self.diags.error(f"schedule clause '{cname}' takes {n} value(s), got "
                                 f"{len(args)}" if n != "0" else
                                 f"schedule clause '{cname}' takes no values", cloc)
            else:
                got[cname] = args
        if "tiles" not in got:
            self.diags.error(f"schedule '{name}' needs tiles(TM, TN): the output's tile-rows "
                             "and tile-columns", loc)
        elif len(got["tiles"]) != (1 if "groups" in got else 2):
            self.diags.error("tiles(TN) takes the tile-columns alone with groups(...), whose "
                             "groups give the tile-rows" if "groups" in got else
                             "tiles(TM, TN) takes the tile-rows and the tile-columns", loc)
        if "groups" in got and ("splits" in got or "streamk" in got):
            self.diags.error(f"schedule '{name}': groups(...) walks whole tiles; it takes no "
                             "splits or streamk", loc)
        if "splits" in got and "streamk" in got:
            self.diags.error(f"schedule '{name}' takes splits(S) or streamk, not both", loc)
        mode = "splits" if "splits" in got else "streamk" if "streamk" in got else "dense"
        if mode != "dense" and "ksteps" not in got:
            self.diags.error(f"schedule '{name}' divides K ({mode}), so it needs ksteps(KT): "
                             "the K steps of one tile", loc)
        if "splits" in got and isinstance(got["splits"][0], Lit) and \
                not (isinstance(got["splits"][0].value, int) and got["splits"][0].value >= 1):
            self.diags.error(f"splits(S) takes at least one range, got {got['splits'][0].value}",
                             loc)
        group = None
        if "group" in got:
            lit = self.folded(got["group"][0], "a schedule's group", loc)
            if lit is not None and (not isinstance(lit.value, int) or lit.value < 1):
                self.diags.error(f"group(G) takes a positive number of tile-rows, got "
                                 f"{lit.value}", loc)
            elif lit is not None:
                group = int(lit.value)
        groups = self._groups(got["groups"], loc) if "groups" in got else None
        if len(self.diags.items) > errors:
            self.poison(name, loc)
            return bad
        tm = Lit(0, loc) if groups else got["tiles"][0]
        sched = Schedule(name, self._held(name, "tm", tm, loc),
                         self._held(name, "tn", got["tiles"][-1], loc), group,
                         self._held(name, "ksteps", got["ksteps"][0], loc)
                         if "ksteps" in got else None, mode, "clusters" in got, loc, groups)
        self._schedule_lets(sched, got.get("splits", [None])[0], loc)
        for v in sched.lets.values():  # derived: read them, never assign them
            self._read_only(v.name, f"'{v.name}' is derived by schedule '{name}'")  # type: ignore[attr-defined]
        if not self._declare(name, Symbol("schedule", T.ScheduleRef(), loc, sched)):
            return bad
        return ir.Var(name=name, type=T.ScheduleRef(), loc=loc)

    def _read_only(self, name: str, why: str) -> None:
        """The local `name` becomes readable but not assignable (`why` says whose it is)."""
        for frame in reversed(self.frames):
            if name in frame.names:
                sym = frame.names[name]
                frame.names[name] = Symbol("derived", sym.type, sym.loc, why)
                return

    def _set(self, name: str, value: Operand, loc: Span | None) -> None:
        """`name = value;` for a variable of the walk's own (read-only to the kernel)."""
        self.emit(ir.Assign(name=name, value=self.value(value, T.u32), loc=loc))

    def _groups(self, args: list[Operand], loc: Span | None) -> tuple | None:
        """groups(offs, G, BM): group g has rows offs[g] .. offs[g + 1] (G + 1 offsets);
        groups(counts, G, BM, cap): rows g * cap .. g * cap + min(counts[g], cap)."""
        src = self.value(args[0])
        if not is_err(src.type) and not (isinstance(src.type, T.Ptr) and
                                         src.type.elem == T.u32):
            self.diags.error(f"groups(...) takes the groups' row offsets (or counts) as a "
                             f"ptr<u32>, got {src.type}", loc)
            return None
        bm = self.folded(args[2], "the rows of a tile in groups(...)", loc)
        if bm is None or not isinstance(bm.value, int) or bm.value < 1:
            self.diags.error("groups(..., BM) takes the rows of a tile, a positive constant",
                             loc)
            return None
        cap = self.value(args[3], T.u32) if len(args) == 4 else None
        return src, self.value(args[1], T.u32), int(bm.value), cap

    def _group_rows(self, s: Schedule, g: Operand, loc: Span | None) -> tuple[Operand, Operand]:
        """(first row, rows) of group g."""
        assert s.groups is not None
        src, _, _, cap = s.groups
        b = self.binary
        if cap is None:
            row0 = self.rvalue(self.index(src, [g], loc))
            end = self.rvalue(self.index(src, [b("add", g, Lit(1, loc), loc)], loc))
            return row0, b("sub", end, row0, loc)
        count = self.rvalue(self.index(src, [g], loc))
        return b("mul", g, cap, loc), self.call("min", [count, cap], loc)

    def _group_tiles(self, s: Schedule, g: Operand, loc: Span | None) -> Operand:
        """Tile-rows of group g."""
        assert s.groups is not None
        bm = s.groups[2]
        rows = self._group_rows(s, g, loc)[1]
        return self.binary("div", self.binary("add", rows, Lit(bm - 1, loc), loc),
                           Lit(bm, loc), loc)

    def _held(self, sname: str, what: str, x: Operand, loc: Span | None) -> Operand:
        """A schedule input as a u32 the loops can name again: a compile-time constant (a
        typed literal, which folds where it meets another) or a variable as it is, anything
        else in a let."""
        if isinstance(x, Lit) and isinstance(x.value, int) and not isinstance(x.value, bool):
            folded = self.const_of(x, T.u32)
            if folded is not None:
                return folded
        v = self.value(x, T.u32)
        if isinstance(v, (ir.Var, ir.Const)) or is_err(v.type):
            return v
        held = self.let(f"{sname}_{what}", T.u32, v, loc)
        self._read_only(f"{sname}_{what}", f"'{sname}_{what}' is derived by schedule '{sname}'")
        return held

    def _workers(self, sched: Schedule, loc: Span | None) -> tuple[ir.Expr, ir.Expr]:
        which = "clusterid.x" if sched.clusters else "ctaid.x"
        return self.sreg(which, loc), self.sreg(f"n{which}", loc)

    def _schedule_lets(self, s: Schedule, splits: Operand | None, loc: Span | None) -> None:
        b, c, lets = self.binary, self.call, s.lets
        name = s.name
        if s.groups is not None:
            # the tile-rows of all groups
            rows = self.let(f"{name}_mtiles", T.u32, Lit(0, loc), loc)
            header = self.for_header(f"{name}_g", Lit(0, loc), s.groups[1], None, loc)
            self._set(rows.name, b("add", rows, self._group_tiles(  # type: ignore[attr-defined]
                s, _u(f"{name}_g"), loc), loc), loc)
            self.for_stmt(f"{name}_g", header, loc)
            lets["mtiles"] = rows
            lets["tiles"] = self.let(f"{name}_tiles", T.u32, b("mul", rows, s.tn, loc), loc)
        else:
            lets["tiles"] = self.let(f"{name}_tiles", T.u32, b("mul", s.tm, s.tn, loc), loc)
        if s.group is not None:
            lets["band"] = self.let(f"{name}_band", T.u32, b("mul", Lit(s.group, loc), s.tn,
                                                              loc), loc)
        if s.mode == "splits":
            assert s.ksteps is not None and splits is not None
            # at least one range (splits(0) of a runtime 0 walks every tile whole)
            lets["splits"] = self.let(f"{name}_splits", T.u32, c("max", [
                c("min", [self.value(splits, T.u32), s.ksteps], loc), Lit(1, loc)], loc), loc)
            lets["items"] = self.let(f"{name}_items", T.u32,
                                     b("mul", lets["tiles"], lets["splits"], loc), loc)
        elif s.mode == "streamk":
            assert s.ksteps is not None
            _, nw = self._workers(s, loc)
            tiles = lets["tiles"]
            rem = b("rem", tiles, nw, loc)
            # the partial wave plus one full wave (all tiles when there is less than a
            # wave); nothing when the waves come out even
            shared = c("select", [self.compare("lt", tiles, nw, loc), tiles,
                                  b("add", rem, nw, loc)], loc)
            lets["sk"] = self.let(f"{name}_sk", T.u32, c("select", [
                self.compare("eq", rem, Lit(0, loc), loc), Lit(0, loc), shared], loc), loc)
            lets["iters"] = self.let(f"{name}_iters", T.u32, b("mul", lets["sk"], s.ksteps, loc),
                                     loc)
            # the workers that share them: all, unless there are fewer K steps than workers
            lets["sworkers"] = self.let(f"{name}_sworkers", T.u32, c("max", [
                c("min", [nw, lets["iters"]], loc), Lit(1, loc)], loc), loc)

    # -- the loop ---------------------------------------------------------------------------

    def _reserve(self, item: Item, loc: Span | None) -> None:
        """The body's frame holds var_field for every field and helper, so that the body
        cannot declare them (they are reserved: reading one is `w.field`)."""
        self._declare(item.var, Symbol("work", T.WorkRef(), loc, item))
        for attr in FIELDS + HELPERS:
            name = f"{item.var}_{attr}"
            prev = self.lookup(name)
            if prev is not None:
                self.diags.error(f"'for {item.var} in {item.sched.name}' keeps its item's "
                                 f"values in variables {item.var}_..., and '{name}' is "
                                 "already declared; rename it or the loop variable", loc,
                                 Note(f"'{name}' was declared here", prev.loc))
            else:
                self.frames[-1].names[name] = Symbol("reserved", T.u32, loc, f"{item.var}."
                                                     f"{attr}")

    def rvalue(self, x: ir.Expr) -> ir.Expr:
        if isinstance(x.type, T.ScheduleRef):
            return self.error(f"{describe(x)} is a schedule, not a value: walk it with 'for w "
                              f"in {getattr(x, 'name', 'it')} {{ ... }}'", x.loc)
        if isinstance(x.type, T.WorkRef):
            return self.error(f"{describe(x)} is a work item, not a value: read its fields "
                              f"({', '.join(FIELDS)})", x.loc)
        return super().rvalue(x)

    def assign(self, name: str, value: Operand, loc: Span | None = None,
               name_loc: Span | None = None) -> None:
        sym = self.lookup(name)
        if sym is not None and sym.kind == "derived":
            self.diags.error(f"cannot assign to '{name}': {sym.decl}", name_loc or loc,
                             Note(f"'{name}' was declared here", sym.loc))
            return
        super().assign(name, value, loc, name_loc)

    def name(self, name: str, loc: Span | None = None) -> Operand:
        sym = self.lookup(name)
        if sym is not None and sym.kind == "derived":
            return ir.Var(name=name, type=sym.type, loc=loc)
        if sym is not None and sym.kind == "reserved":
            return self.error(f"'{name}' is reserved by the work loop: write {sym.decl}"
                              if "." in sym.decl and sym.decl.split(".")[1] in FIELDS else
                              f"'{name}' is reserved by the work loop", loc,
                              Note("the loop is here", sym.loc))
        return super().name(name, loc)

    def work_begin(self, var: str, sched_expr: Operand, loc: Span | None = None) -> tuple:
        """Opens `for var in schedule { ... }`; the body reads var's fields."""
        sched = None
        if isinstance(sched_expr, ir.Var) and isinstance(sched_expr.type, T.ScheduleRef):
            sym = self.lookup(sched_expr.name)
            sched = sym.decl if sym is not None and sym.kind == "schedule" else None
            if sched is None:
                self.diags.error(f"'{sched_expr.name}' is not a declared schedule", loc)
        elif not (isinstance(sched_expr, ir.Expr) and is_err(sched_expr.type)):
            what = "a literal" if isinstance(sched_expr, Lit) else \
                f"a value of type {sched_expr.type}"
            self.diags.error(f"'for {var} in X {{ }}' walks a schedule, and X is {what}; a "
                             "counted loop is 'for i in start .. stop'", loc)
        if sched is None:
            self.push()
            self.unroll_counts.append(1)
            self._declare(var, Symbol("local", T.error, loc))
            return None, var, loc, None
        start, nw = self._workers(sched, loc)
        n = 1
        state = var
        while any(self.lookup(f"{state}_{x}") is not None for x in STATE):
            n += 1  # an earlier walk's state is still in scope
            state = f"{var}{n}"
        item = Item(sched, var, state=state)
        if sched.mode == "streamk":
            self._streamk_state(item, start, loc)
            self.push()
            self.unroll_counts.append(1)
            self._reserve(item, loc)
            return item, var, loc, None
        if sched.groups is not None:
            # the group cursor: group var_grp's tiles are var_gstart .. var_gend (before the
            # first item, "group -1", empty)
            for x, v in (("grp", 0xFFFFFFFF), ("gstart", 0), ("gend", 0)):
                self.let(item.st(x), T.u32, Lit(v, loc), loc)
                self._read_only(item.st(x), f"'{item.st(x)}' is the state of the walk "
                                f"'for {var} in {sched.name}'")
        stop = sched.lets["items"] if sched.mode == "splits" else sched.lets["tiles"]
        header = self.for_header(var, start, stop, nw, loc)
        self.frames[-1].names.pop(var, None)  # for_header declared it, unless it clashed
        self._reserve(item, loc)
        return item, var, loc, header

    def _streamk_state(self, item: Item, c: ir.Expr, loc: Span | None) -> None:
        """Before the walk: this worker's run of shared K steps [var_it, var_end) and its
        first whole tile var_next."""
        s, b, call = item.sched, self.binary, self.call
        v, iters = s.lets["sworkers"], s.lets["iters"]

        def start(w: Operand) -> Operand:
            return b("div", b("mul", call("min", [w, v], loc), iters, loc), v, loc)

        for x, value in (("it", start(c)), ("end", start(b("add", c, Lit(1, loc), loc))),
                         ("next", b("add", s.lets["sk"], c, loc))):
            self.let(item.st(x), T.u32, value, loc)
            self._read_only(item.st(x), f"'{item.st(x)}' is the state of the walk "
                            f"'for {item.var} in {s.name}'")

    def work_field(self, base: ir.Var, attr: str, loc: Span | None) -> ir.Expr:
        """`w.attr` inside `for w in work`: the variable var_attr, computed at the top of the
        loop body when the loop closes."""
        sym = self.lookup(base.name)
        if sym is None or sym.kind != "work":
            return self.error(f"'{base.name}' is not a work item here: its fields exist inside "
                              f"its own 'for {base.name} in ...' loop", loc)
        item: Item = sym.decl
        if attr not in FIELDS:
            hint = difflib.get_close_matches(attr, FIELDS, n=1)
            more = f"; did you mean '{hint[0]}'?" if hint else \
                f" (fields: {', '.join(FIELDS)})"
            return self.error(f"a work item has no field '{attr}'{more}", loc)
        s = item.sched
        if attr in GROUPED and s.groups is None:
            return self.error(f"{base.name}.{attr} is a field of a grouped schedule "
                              f"(groups(...)), and schedule '{s.name}' is not one", loc,
                              Note(f"schedule '{s.name}' is declared here", s.loc))
        if attr == "k1" and s.ksteps is None:
            return self.error(f"{base.name}.k1 is the end of the item's K steps, which "
                              f"schedule '{s.name}' does not know: add ksteps(KT)", loc,
                              Note(f"schedule '{s.name}' is declared here", s.loc))
        name = f"{item.var}_{attr}"
        item.used.setdefault(attr, loc)
        return ir.Var(name=name, type=T.pred if attr == "whole" else T.u32, loc=loc)

    def _group_cursor(self, item: Item, loc: Span | None) -> ir.Expr:
        """Move the cursor on to the group of tile var (groups with no rows are passed
        over); the tile's number within its group."""
        s, var, b = item.sched, item.var, self.binary
        w, grp, gend = _u(var), _u(item.st("grp")), _u(item.st("gend"))
        self.push()
        self._set(grp.name, b("add", grp, Lit(1, loc), loc), loc)
        self._set(item.st("gstart"), gend, loc)
        self._set(gend.name, b("add", gend, b("mul", self._group_tiles(s, grp, loc), s.tn,
                                               loc), loc), loc)
        self.while_stmt(self.value(self.compare("ge", w, gend, loc), T.pred), self.pop(), loc)
        if self._need(item, "row0", "rows"):
            row0, rows = self._group_rows(s, grp, loc)
            for attr, v in (("row0", row0), ("rows", rows)):
                if attr in item.used:
                    self._field(item, attr, v, loc)
        if "group" in item.used:
            self._field(item, "group", grp, loc)
        return self.let(f"{var}_local", T.u32, b("sub", w, _u(item.st("gstart")), loc), loc)

    def member(self, base: ir.Expr, attr: str, loc: Span | None = None) -> ir.Expr:
        if isinstance(base, ir.Var) and isinstance(base.type, T.WorkRef):
            return self.work_field(base, attr, loc)
        if isinstance(base, ir.Var) and isinstance(base.type, T.ScheduleRef):
            return self.error(f"schedule '{base.name}' is walked with 'for w in {base.name} "
                              f"{{ ... }}', and its items have the fields ({', '.join(FIELDS)})",
                              loc)
        return super().member(base, attr, loc)

    def work_end(self, header: tuple) -> None:
        item, var, loc, for_header = header
        body = self.pop()
        self.unroll_counts.pop()
        if item is None:
            return
        s = item.sched
        if s.mode == "streamk":
            self.push()
            self._streamk_fields(item, loc)
            prelude = self.pop()
            it, end, nxt = _u(item.st("it")), _u(item.st("end")), _u(item.st("next"))
            more = self.binary("lor", self.compare("lt", it, end, loc),
                               self.compare("lt", nxt, s.lets["tiles"], loc), loc)
            self.while_stmt(self.value(more, T.pred), prelude + body, loc)
            return
        self.push()
        self._declare(var, Symbol("loopvar", T.u32, loc))
        self._item_fields(item, loc)
        prelude = self.pop()
        st, sp, sc, ty, _ = for_header
        self.emit(ir.For(var=var, var_type=ty, start=st, stop=sp, step=sc, body=prelude + body,
                         unroll=False, loc=loc))

    # -- the fields -------------------------------------------------------------------------

    def _need(self, item: Item, *names: str) -> bool:
        return any(n in item.used for n in names)

    def _field(self, item: Item, attr: str, value: Operand, loc: Span | None,
               ty: T.Scalar = T.u32) -> ir.Expr:
        return self.let(f"{item.var}_{attr}", ty, value, loc)

    def _item_fields(self, item: Item, loc: Span | None) -> None:
        """The lets of a dense or split-K item, whose loop variable is the item's number."""
        s, w, b = item.sched, _u(item.var), self.binary
        u, kt = item.used, s.ksteps if s.ksteps is not None else Lit(0, loc)
        tile: ir.Expr = w
        if s.groups is not None:
            local = self._group_cursor(item, loc)
            self._whole_tile_fields(item, w, kt, loc)
            tm = b("div", b("sub", _u(item.st("gend")), _u(item.st("gstart")), loc),
                   s.tn, loc)
            self._tile_coords(item, local, loc, tm)
            return
        split: Operand = Lit(0, loc)
        if s.mode == "splits":
            if self._need(item, "tile", "m", "n"):
                tile = self._field(item, "tile", b("rem", w, s.lets["tiles"], loc), loc)
            if self._need(item, "split", "k0", "k1"):
                split = self._field(item, "split", b("div", w, s.lets["tiles"], loc), loc)
            nsplit = s.lets["splits"]
            if "k0" in u:
                self._field(item, "k0", b("div", b("mul", split, kt, loc), nsplit, loc),
                            loc)
            if "k1" in u:
                self._field(item, "k1", b("div", b("mul", b("add", split, Lit(1, loc), loc),
                                                   kt, loc), nsplit, loc), loc)
            if "splits" in u:
                self._field(item, "splits", nsplit, loc)
            if "whole" in u:
                self._field(item, "whole", self.compare("eq", nsplit, Lit(1, loc), loc), loc,
                            T.pred)
        else:
            self._whole_tile_fields(item, w, kt, loc)
        self._tile_coords(item, tile, loc)

    def _whole_tile_fields(self, item: Item, tile: ir.Expr, kt: Operand, loc: Span | None
                           ) -> None:
        """The fields of an item that is a whole tile: all its K steps, one range."""
        for attr, value in (("tile", tile), ("split", Lit(0, loc)), ("k0", Lit(0, loc)),
                            ("k1", kt), ("splits", Lit(1, loc))):
            if attr in item.used:
                self._field(item, attr, value, loc)
        if "whole" in item.used:
            self._field(item, "whole", Lit(True, loc), loc, T.pred)

    def _streamk_fields(self, item: Item, loc: Span | None) -> None:
        """The lets of a stream-K item and the advance to the next one: the run of shared K
        steps [var_it, var_end) from its end, one tile's part at a time, then whole tiles
        var_next, var_next + U, ... Walking the run backwards starts every worker on a
        tile's first K step at the same time (the A and B slices in flight are the same
        K steps, shared in L2), and a range's predecessors in K order (other workers' last
        parts) are done first."""
        s, var, b, c = item.sched, item.var, self.binary, self.call
        u, kt = item.used, s.ksteps
        assert kt is not None
        it, end, nxt = _u(item.st("it")), _u(item.st("end")), _u(item.st("next"))
        shared = self.let(f"{var}_shared", T.pred, self.compare("lt", it, end, loc), loc)
        last = b("sub", end, Lit(1, loc), loc)  # the run's last K step
        tile = self._field(item, "tile", c("select", [shared, b("div", last, kt, loc), nxt],
                                           loc), loc)
        k1 = self._field(item, "k1", c("select", [shared, b("add", b("rem", last, kt, loc),
                                                              Lit(1, loc), loc), kt], loc), loc)
        k0 = self._field(item, "k0", c("select", [shared, b("sub", k1, c("min", [
            k1, b("sub", end, it, loc)], loc), loc), Lit(0, loc)], loc), loc)
        # advance past this item
        step = b("sub", end, b("sub", k1, k0, loc), loc)
        _, nw = self._workers(s, loc)
        self.push()
        self._set(end.name, step, loc)
        then = self.pop()
        self.push()
        self._set(nxt.name, b("add", nxt, nw, loc), loc)
        self.if_stmt(shared, then, self.pop(), loc)
        if self._need(item, "split", "splits", "whole"):
            # worker(i) = ((i + 1) * V - 1) / iters holds K step i of the shared run (V
            # workers share it); a tile's splits are its first and last steps' workers
            v, iters = s.lets["sworkers"], c("max", [s.lets["iters"], Lit(1, loc)], loc)
            first = self.let(f"{var}_wfirst", T.u32, b("div", b("sub", b("mul", b("add", b(
                "mul", tile, kt, loc), Lit(1, loc), loc), v, loc), Lit(1, loc), loc), iters,
                loc), loc)
            last = b("div", b("sub", b("mul", b("mul", b("add", tile, Lit(1, loc), loc), kt,
                                                     loc), v, loc), Lit(1, loc), loc), iters, loc)
            me, _ = self._workers(s, loc)
            if "split" in u:
                self._field(item, "split", c("select", [shared, b("sub", me, first, loc),
                                                        Lit(0, loc)], loc), loc)
            if self._need(item, "splits", "whole"):
                n = self._field(item, "splits", c("select", [shared, b("add", b(
                    "sub", last, first, loc), Lit(1, loc), loc), Lit(1, loc)], loc), loc)
                if "whole" in u:
                    self._field(item, "whole", self.compare("eq", n, Lit(1, loc), loc), loc,
                                T.pred)
        self._tile_coords(item, tile, loc)

    def _tile_coords(self, item: Item, tile: ir.Expr, loc: Span | None,
                     tm: Operand | None = None) -> None:
        """w.m and w.n from the tile's number: bands of `group` tile-rows, column-major in a
        band (one band of every row without group); `tm` tile-rows (a group's)."""
        if not self._need(item, "m", "n"):
            return
        s, b = item.sched, self.binary
        tm = s.tm if tm is None else tm
        if s.group is None:
            m: Operand = b("rem", tile, tm, loc)
            n: Operand = b("div", tile, tm, loc)
        else:
            band = s.lets["band"]
            row0 = self.let(f"{item.var}_band0", T.u32,
                            b("mul", b("div", tile, band, loc), Lit(s.group, loc), loc), loc)
            rows = self.let(f"{item.var}_bandrows", T.u32, self.call("min", [
                b("sub", tm, row0, loc), Lit(s.group, loc)], loc), loc)
            within = b("rem", tile, band, loc)
            m = b("add", row0, b("rem", within, rows, loc), loc)
            n = b("div", within, rows, loc)
        if "m" in item.used:
            self._field(item, "m", m, loc)
        if "n" in item.used:
            self._field(item, "n", n, loc)


class KernelBuilder(Schedules):
    """Builds one ir.Kernel: every layer of the builder, the schedules on top."""
