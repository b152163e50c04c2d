"""Closures written as Python source: the compiled kernel's hot code, one Python function for
a whole kernel body or expression tree instead of one closure per IR node.

A `Source` collects the values a function needs (bound as closure variables named `_k0`,
`_k1`, ...) and hands out temporaries; `Source.function` compiles the text once per distinct
text, so kernels of the same shape share their code objects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_MAKERS: dict[str, Callable[..., Any]] = {}
_MAX_MAKERS = 4096


class Source:
    """The names that the text of one generated function refers to."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.names: dict[int, str] = {}  # id(value) -> its name
        self.temps = 0
        self.nesting = 0  # of the expression being written (see exprs.render)
        self.regs = "th.regs"  # how the text names the thread's registers

    def bind(self, value: Any) -> str:
        """A name under which the function sees `value` (one name per object)."""
        name = self.names.get(id(value))
        if name is None:
            name = self.names[id(value)] = f"_k{len(self.values)}"
            self.values[name] = value
        return name

    def literal(self, value: Any) -> str:
        """`value` as source: ints and bools written out, anything else bound."""
        if isinstance(value, bool) or value is None:
            return repr(value)
        if type(value) is int:
            return f"({value})" if value < 0 else str(value)
        return self.bind(value)

    def temp(self) -> str:
        """A fresh local name (for `:=` inside an expression)."""
        self.temps += 1
        return f"_t{self.temps}"

    def function(self, lines: list[str]) -> Callable[..., Any]:
        """`def fn(th):` with `lines` (indented by block depth with 4 spaces) as its body,
        closing over the bound values."""
        names = ", ".join(self.values)
        body = "\n".join("        " + line for line in lines)
        text = f"def _make({names}):\n    def fn(th):\n{body}\n    return fn\n"
        maker = _MAKERS.get(text)
        if maker is None:
            if len(_MAKERS) > _MAX_MAKERS:
                _MAKERS.clear()
            scope: dict[str, Any] = {}
            exec(compile(text, "<ptxdsl interpreter>", "exec"), scope)
            maker = _MAKERS[text] = scope["_make"]
        return maker(*self.values.values())
