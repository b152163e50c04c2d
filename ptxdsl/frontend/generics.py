"""Compile-time parameters in the text frontend: a kernel's `<N: u32 = 8192, T: type = bf16>`
given values from outside (`-D N=4096`, `defines={"N": 4096}`) or their defaults, type
parameters standing for scalar types (`ptr<T>`, `T[N]`, `vec<T, W>`, `x as T`, `sizeof(T)`),
and constant operands of declarations. A mixin of the frontend's tree walker."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import lark

from .. import types as T
from ..builder.hints import type_hint
from ..errors import Span

if TYPE_CHECKING:
    from ..builder import KernelBuilder
    from ..errors import DiagnosticBag, Source


class CompileTimeWalker:
    """The compile-time part of the walker; `_Walker` provides `b`, `consts`, `expr`..."""

    source: Source
    diags: DiagnosticBag
    _builder: KernelBuilder | None
    consts: KernelBuilder
    defines: dict[str, object]
    used_defines: set[str]
    type_params: dict[str, T.Scalar]

    def span(self, node: lark.Tree | lark.Token) -> Span | None:  # provided by the walker
        raise NotImplementedError

    @property
    def b(self) -> KernelBuilder:  # provided by the walker
        raise NotImplementedError

    def expr(self, t: lark.Tree):  # provided by the walker
        raise NotImplementedError

    def type(self, tree: lark.Tree) -> T.Type | None:  # provided by the walker
        raise NotImplementedError

    def named_type(self, name: str) -> T.Type | None:
        """A type by name: a compile-time type parameter, a scalar or a vector."""
        return self.type_params.get(name) or T.parse_type_name(name)

    def vec_type(self, elem: T.Scalar | None, elem_tok: Any, width: lark.Tree
                 ) -> T.Type | None:
        """`vec<T, W>`: the vector type `Tx W` spelled with a type parameter or a constant."""
        if elem is None or elem.is_pred:
            self.diags.error(f"unknown element type '{elem_tok}'{type_hint(str(elem_tok))}",
                             self.span(elem_tok))
            return None
        n = self.const_int(width, "a vector width")
        if n is None:
            return None
        vt = T.vector_type(elem, n)
        if vt is None:
            self.diags.error(f"no {n}-wide vector of {elem}: a vector is 4, 8 or 16 bytes",
                             self.span(width))
        return vt

    def const_int(self, t: lark.Tree, what: str) -> int | None:
        return self.b.const_int(self.expr(t), what, self.span(t))

    def generics(self, kernel: str, tree: lark.Tree) -> None:
        """Declare a kernel's compile-time parameters with their values: given from outside
        (-D / defines), else the default, else an error that says how to give one."""
        for g in tree.children:
            name_tok, ty_tree, default = g.children
            name = str(name_tok)
            loc = self.span(g)
            if ty_tree.data == "type_name" and str(ty_tree.children[0]) == "type":
                self.type_param(kernel, name, default, loc)
                continue
            ty = self.type(ty_tree)
            if ty is None:
                continue
            if not isinstance(ty, T.Scalar):
                self.diags.error(f"compile-time parameter '{name}' has type {ty}; compile-time "
                                 "parameters are scalars (u32, f32, pred, ...)", loc)
                continue
            if name in self.defines:
                self.used_defines.add(name)
                lit = self.consts.generic_value(name, ty, self.defines[name], loc)
                if lit is None or self.consts.const(name, ty, lit, loc) is None:
                    self.consts.poison(name, loc)
            elif default is not None:
                if self.consts.const(name, ty, self.expr(default), loc) is None:
                    self.consts.poison(name, loc)
            else:
                self.consts.poison(name, loc)
                self.diags.error(f"kernel '{kernel}' needs a value for its compile-time "
                                 f"parameter '{name}': pass -D {name}=... (defines={{'{name}': "
                                 f"...}} from Python) or give a default ({name}: {ty} = ...)",
                                 loc)

    def sizeof_type(self, args: lark.Tree | None) -> int | None:
        """`sizeof(T)` of a type parameter or a type name (not shadowed by a variable)."""
        if args is None or len(args.children) != 1 or args.children[0].data != "name":
            return None
        name = str(args.children[0].children[0])
        if name not in self.type_params and (self._builder is None or
                                          self._builder.lookup(name) is not None):
            return None
        ty = self.named_type(name)
        return ty.nbytes if isinstance(ty, (T.Scalar, T.Vector)) else None

    def type_param(self, kernel: str, name: str, default: lark.Tree | None, loc: Span | None
                   ) -> None:
        """`T: type [= bf16]`: a scalar type given by -D T=f32, defines={'T': ptxdsl.f32}, or
        the default."""
        given = self.defines.get(name, default)
        if name in self.defines:
            self.used_defines.add(name)
        if given is None:
            self.diags.error(f"kernel '{kernel}' needs a type for its compile-time parameter "
                             f"'{name}': pass "
                             f"-D {name}=bf16 (defines={{'{name}': ptxdsl.bf16}} from Python) or "
                             f"give a default ({name}: type = bf16)", loc)
            return
        if isinstance(given, lark.Tree):
            text = str(given.children[0]) if given.data == "name" else None
            ty = self.named_type(text) if text else None
        else:
            text = str(given)
            ty = given if isinstance(given, T.Scalar) else T.SCALARS.get(text)
        if not isinstance(ty, T.Scalar):
            self.diags.error(f"compile-time parameter '{name}: type' takes a scalar type (bf16, "
                             f"f32, u32, ...), got {text!r}{type_hint(text or '')}", loc)
            return
        if name in self.type_params or self.consts.lookup(name) is not None:
            self.diags.error(f"'{name}' is already declared", loc)
            return
        self.type_params[name] = ty

    def check_defines(self, tree: lark.Tree) -> None:
        for name in self.defines:
            if name not in self.used_defines:
                self.diags.error(f"-D {name}: no kernel in this file has a compile-time "
                                 f"parameter '{name}' (write kernel k<{name}: u32>(...))",
                                 Span(self.source, 0, 0))
