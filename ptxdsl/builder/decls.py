"""Declarations: parameters, shared buffers, mbarriers, pipelines and their stage regions,
roles, local variables."""

from __future__ import annotations

from .. import ir
from .. import types as T
from ..errors import Note, Span
from .common import (
    MAX_REG_ARRAY,
    MAX_SMEM_BYTES,
    MBARRIER_MAX_COUNT,
    REGION_OPENER,
    REGION_OPS,
    Lit,
    Operand,
    Symbol,
    describe,
    is_err,
)
from .exprs import Expressions
from .named import let_value


class Declarations(Expressions):
    """Declarations and pipeline regions."""

    def param(self, name: str, ty: T.Type | None, loc: Span | None = None) -> None:
        if ty is None:
            return
        if not isinstance(ty, (T.Scalar, T.Ptr, T.TensorMap)):
            self.diags.error(f"parameter '{name}' has type {ty}; parameters are scalars, "
                             "ptr<T> or tmap<T, rank>", loc)
            return
        if isinstance(ty, T.TensorMap) and not 1 <= ty.rank <= 5:
            self.diags.error(f"tensor map rank must be in [1, 5], got {ty.rank}", loc)
        p = ir.Param(name=name, type=ty, loc=loc)
        if self._declare(name, Symbol("param", ty, loc, p)):
            self.params.append(p)

    def swizzle_align(self, name: str, elem: T.Scalar, shape: tuple[int, ...],
                      align: int | None, swizzle: int, loc: Span | None) -> int | None:
        """The alignment of a buffer with a declared swizzle (8 rows of the swizzle span:
        1024 bytes for 128B), or None after reporting an inconsistent declaration."""
        if swizzle == 0:
            return align
        if swizzle not in (16, 32, 64, 128):
            self.diags.error(f"swizzle must be 16 (none), 32, 64 or 128 (bytes), got {swizzle}",
                             loc)
            return None
        row = shape[-1] * elem.nbytes if shape else 0
        if row != swizzle:
            self.diags.error(f"buffer '{name}' has {swizzle}B swizzle, so its rows (last "
                             f"dimension) must be {swizzle} bytes = {swizzle // elem.nbytes} "
                             f"{elem}, got {shape[-1] if shape else 0}", loc)
            return None
        atom = 8 * swizzle
        if align is not None and align < atom:
            self.diags.error(f"buffer '{name}' has {swizzle}B swizzle, whose pattern repeats "
                             f"every {atom} bytes; it needs align {atom}, got {align}", loc)
            return None
        return atom if align is None else align

    def major_ok(self, name: str, swizzle: int, major: str, loc: Span | None) -> bool:
        if major not in ("k", "mn"):
            self.diags.error(f"buffer '{name}': major is 'k' or 'mn', got {major!r}", loc)
            return False
        if major == "mn" and not swizzle:
            self.diags.error(f"buffer '{name}' is MN-major, a property of swizzled wgmma "
                             "layouts: declare its swizzle too (swizzle 128 mn)", loc)
            return False
        return True

    def mn_shape_ok(self, name: str, shape: tuple[int, ...], major: str,
                    loc: Span | None, swizzle: int = 0) -> bool:
        if major == "mn" and len(shape) < 3:
            self.diags.error(f"MN-major buffer '{name}' is declared [blocks][k][row]: blocks of "
                             f"one swizzle row along M / N, got {len(shape)} dimension(s)", loc)
            return False
        if swizzle == 16 and (len(shape) < 3 or major == "mn"):
            self.diags.error(f"buffer '{name}' has the unswizzled wgmma layout (swizzle 16), "
                             "declared [k blocks][rows][16 bytes] and K-major", loc)
            return False
        return True

    def shared(self, name: str, elem: T.Type | None, shape: tuple[int, ...], align: int | None,
               loc: Span | None = None, swizzle: int = 0, major: str = "k") -> ir.Expr:
        if not self.at_top:
            return self.error("shared memory is declared at the top level of the kernel body",
                              loc)
        if not isinstance(elem, T.Scalar) or elem.is_pred:
            return self.error(f"shared buffer '{name}' needs a scalar element type, got "
                              f"{elem}", loc)
        if swizzle and shape:
            align = self.swizzle_align(name, elem, tuple(shape), align, swizzle, loc)
            if align is None:
                return ir.Const(value=0, type=T.error, loc=loc)
        align = 128 if align is None else align
        if align < 1 or align & (align - 1) or align > 1024:
            return self.error(f"alignment must be a power of two in [1, 1024], got {align}", loc)
        if align < elem.nbytes:
            return self.error(f"alignment {align} is smaller than the element size "
                              f"{elem.nbytes} of {elem}", loc)
        if not shape or any((not isinstance(d, int)) or d < 1 for d in shape):
            return self.error(f"shared buffer '{name}' needs positive dimensions, got "
                              f"{list(shape)}", loc)
        if not self.major_ok(name, swizzle, major, loc) or \
                not self.mn_shape_ok(name, tuple(shape), major, loc, swizzle):
            return ir.Const(value=0, type=T.error, loc=loc)
        decl = ir.SharedDecl(name=name, elem=elem, shape=tuple(shape), align=align, loc=loc,
                             swizzle=swizzle, major=major)
        if decl.nbytes > MAX_SMEM_BYTES:
            return self.error(f"shared buffer '{name}' is {decl.nbytes} bytes; a CTA has at "
                              f"most {MAX_SMEM_BYTES}", loc)
        self.smem_total += decl.nbytes
        ty = T.SharedRef(elem, tuple(shape))
        if not self._declare(name, Symbol("shared", ty, loc, decl)):
            return ir.Const(value=0, type=T.error, loc=loc)
        self.emit(decl)
        return ir.SharedBuf(name=name, type=ty, loc=loc)

    def mbarrier(self, name: str, n: int, count: int, loc: Span | None = None) -> ir.Expr:
        if not self.at_top:
            return self.error("mbarriers are declared at the top level of the kernel body", loc)
        if not 1 <= count <= MBARRIER_MAX_COUNT:
            return self.error(f"mbarrier arrival count must be in [1, {MBARRIER_MAX_COUNT}], "
                              f"got {count}", loc)
        if n < 0 or n > 4096:
            return self.error(f"mbarrier array size must be in [1, 4096], got {n}", loc)
        decl = ir.BarrierDecl(name=name, n=n, count=count, loc=loc)
        ty = T.BarrierRef(n)
        if not self._declare(name, Symbol("barrier", ty, loc, decl)):
            return ir.Const(value=0, type=T.error, loc=loc)
        self.emit(decl)
        return ir.BarrierObj(name=name, type=ty, loc=loc)

    def pipeline(self, name: str, stages: int, buffers: list[tuple], loc: Span | None = None
                 ) -> ir.Expr:
        """`pipeline name stages N { buf: T[dims] align A; ... }`."""
        if not self.at_top:
            return self.error("pipelines are declared at the top level of the kernel body", loc)
        if not 1 <= stages <= 64:
            return self.error(f"a pipeline has 1 to 64 stages, got {stages}", loc)
        if not buffers:
            return self.error(f"pipeline '{name}' declares no stage buffer", loc)
        decls = []
        seen: set[str] = set()
        for bname, elem, shape, align, bloc, *rest in buffers:
            swizzle = rest[0] if rest else 0
            major = rest[1] if len(rest) > 1 else "k"
            if not self.major_ok(bname, swizzle, major, bloc) or \
                    not self.mn_shape_ok(bname, tuple(shape), major, bloc, swizzle):
                continue
            if bname in seen:
                self.diags.error(f"pipeline '{name}' declares buffer '{bname}' twice", bloc)
                continue
            seen.add(bname)
            if swizzle and isinstance(elem, T.Scalar) and shape:
                align = self.swizzle_align(bname, elem, tuple(shape), align, swizzle, bloc)
                if align is None:
                    continue
            align = 128 if align is None else align
            if not isinstance(elem, T.Scalar) or elem.is_pred or not shape or \
                    any(d < 1 for d in shape) or align < 16 or align & (align - 1) or align > 1024:
                self.diags.error(f"stage buffer '{bname}' needs a scalar element type, positive "
                                 "dimensions and a power-of-two alignment in [16, 1024]", bloc)
                continue
            d = ir.SharedDecl(name=bname, elem=elem, shape=tuple(shape), align=align, loc=bloc,
                              swizzle=swizzle, major=major)
            if d.nbytes % align:
                self.diags.error(f"stage buffer '{bname}' is {d.nbytes} bytes, not a multiple of "
                                 f"its alignment {align}, so later stages would be misaligned",
                                 bloc)
            decls.append(d)
            self.smem_total += d.nbytes * stages
        decl = ir.PipelineDecl(name=name, stages=stages, buffers=tuple(decls), loc=loc)
        ty = T.PipelineRef(stages)
        if not self._declare(name, Symbol("pipeline", ty, loc, decl)):
            return ir.Const(value=0, type=T.error, loc=loc)
        self.emit(decl)
        return ir.PipelineObj(name=name, type=ty, loc=loc)

    def member(self, base: ir.Expr, attr: str, loc: Span | None = None) -> ir.Expr:
        """`ring.buf` (the current stage of a pipeline buffer) or `ring.stage`."""
        if is_err(base.type):
            return base
        if not isinstance(base, ir.PipelineObj):
            return self.error(f"{describe(base)} of type {base.type} has no member '{attr}'",
                              loc)
        sym = self.lookup(base.name)
        decl: ir.PipelineDecl = sym.decl  # type: ignore[union-attr]
        side = self.region_side(base.name)
        if side is None:
            return self.error(f"'{base.name}.{attr}' names the current stage, which exists only "
                              f"between acquire({base.name}) and commit({base.name}) or "
                              f"wait({base.name}) and release({base.name})", loc)
        if attr == "stage":
            return ir.StageIndex(pipe=base.name, side=side, type=T.u32, loc=loc)
        for d in decl.buffers:
            if d.name == attr:
                return ir.StageBuf(pipe=base.name, buf=attr, side=side, loc=loc,
                                   type=T.SharedRef(d.elem, d.shape))
        names = ", ".join(d.name for d in decl.buffers)
        return self.error(f"pipeline '{base.name}' has no buffer '{attr}' (buffers: {names})",
                          loc)

    def region_side(self, pipe: str) -> str | None:
        for frame in reversed(self.frames):
            if pipe in frame.regions:
                return frame.regions[pipe][0]
        return None

    def pipeline_op(self, cls: type[ir.Op], pipe: ir.Expr, loc: Span | None) -> None:
        """Regions: acquire .. commit and wait .. release, each closed in the block that opens
        it. A consumer may wait again while it holds a stage (its release lags: `release`
        hands back the oldest stage it holds), so every block releases as many stages as it
        waits on and the number held is the same on every path."""
        side, opens = REGION_OPS[cls.syntax]
        name = pipe.name  # type: ignore[attr-defined]
        current = self.region_side(name)
        frame = self.frames[-1]
        if opens:
            if current is not None and (current, side) != ("get", "get"):
                self.diags.error(f"{cls.syntax}({name}) inside an open "
                                 f"{REGION_OPENER[current]}({name}) region", loc)
                return
            frame.regions.setdefault(name, (side, []))[1].append(loc)
        else:
            open_side, locs = frame.regions.get(name, ("", []))
            if open_side != side:
                lag = " (a release may lag behind its wait, but each block releases only " \
                    "the stages it waits on, so that the number held is the same on every " \
                    "path; issue the first step before the loop instead of releasing " \
                    "conditionally)" if side == "get" and current == "get" else ""
                self.diags.error(f"{cls.syntax}({name}) without a matching "
                                 f"{REGION_OPENER[side]}({name}) earlier in the same block{lag}",
                                 loc)
                return
            locs.pop(0)
            if not locs:
                del frame.regions[name]
        self.emit(cls(pipe=pipe, loc=loc))  # type: ignore[call-arg]

    def role_begin(self, name: str, start: int, stop: int, regs: int | None,
                   loc: Span | None = None) -> tuple:
        nwarps = (self.threads[0] * self.threads[1] * self.threads[2] + 31) // 32
        if not self.at_top:
            self.diags.error("roles are declared at the top level of the kernel body", loc)
        elif not 0 <= start < stop <= nwarps:
            self.diags.error(f"role '{name}' covers warps {start} .. {stop}; this CTA has warps "
                             f"0 .. {nwarps}", loc)
        else:
            for r in self.roles:
                if start < r.warp_stop and r.warp_start < stop:
                    self.diags.error(f"role '{name}' overlaps role '{r.name}' (warps "
                                     f"{r.warp_start} .. {r.warp_stop})", loc,
                                     Note(f"role '{r.name}' is declared here", r.loc))
        if regs is not None:
            if not 24 <= regs <= 256 or regs % 8:
                self.diags.error(f"regs must be a multiple of 8 in [24, 256] (setmaxnreg), got "
                                 f"{regs}", loc)
            if start % 4 or stop % 4:
                self.diags.error(f"role '{name}' sets regs, so it must cover whole warpgroups "
                                 f"(warps multiple of 4), got warps {start} .. {stop}", loc)
        self.current_role = (name, start, stop)
        self.push()
        return (name, start, stop, regs, loc)

    def role_end(self, header: tuple, loc: Span | None = None) -> None:
        name, start, stop, regs, name_loc = header
        body = self.pop()
        self.current_role = None
        role = ir.Role(name=name, warp_start=start, warp_stop=stop, regs=regs, body=body,
                       loc=name_loc)
        self.roles.append(role)
        self.emit(role)

    def reg_array_type(self, elem: T.Type | None, shape: tuple[int, ...],
                       loc: Span | None = None) -> T.Type:
        """The type `elem[d0][d1]...` of a register array (a `let` of it declares one)."""
        if not isinstance(elem, T.Scalar) or elem.is_pred:
            self.diags.error(f"a register array needs a scalar element type, got {elem}", loc)
            return T.error
        n = 1
        for d in shape:
            n *= d
        if not shape or any(d < 1 for d in shape) or n > MAX_REG_ARRAY:
            self.diags.error(f"a register array has 1 to {MAX_REG_ARRAY} elements, got shape "
                             f"{list(shape)}", loc)
            return T.error
        return T.RegArray(elem, tuple(shape))

    def let_array(self, name: str, ty: T.RegArray, value: Operand | None,
                  loc: Span | None) -> ir.Expr:
        """`let acc: f32[128];` (registers left as they are) or `= 0.0` (every element set)."""
        init: ir.Expr | None = None
        if value is not None:
            if not isinstance(value, Lit):
                self.diags.error(f"register array '{name}' is initialised from a literal "
                                 "(every element gets it), or not at all", loc)
            else:
                init = self.lit_expr(value, ty.elem)
        self._declare(name, Symbol("local", ty, loc))
        self.emit(ir.Let(name=name, var_type=ty, value=init, loc=loc))
        return ir.Var(name=name, type=ty, loc=loc)

    def let(self, name: str, ty: T.Type | None, value: Operand | None,
            loc: Span | None = None) -> ir.Expr:
        if isinstance(ty, T.RegArray):
            return self.let_array(name, ty, value, loc)
        init: ir.Expr | None = None
        if value is not None:
            init = self.value(value, ty)
            if ty is None:
                ty = init.type
        if ty is None:
            self.diags.error(f"'{name}' needs a type or an initial value", loc)
            ty = T.error
        if isinstance(ty, (T.SharedRef, T.GlobalRef, T.BarrierRef, T.TensorMap, T.Void)):
            self.diags.error(f"a local variable cannot hold a {ty}", loc)
            ty = T.error
        known = let_value(init, self.lookup) \
            if init is not None and isinstance(ty, T.Scalar) else None
        self._declare(name, Symbol("local", ty, loc, known))
        self.emit(ir.Let(name=name, var_type=ty, value=init, loc=loc))
        return ir.Var(name=name, type=ty, loc=loc)
