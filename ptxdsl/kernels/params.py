"""A kernel whose parameter list depends on its build (attention's window, varlen and softcap
builds): the body takes its parameters by name, and a signature made from the list tells
ptxdsl.kernel their names, order and types."""

import inspect
from collections.abc import Callable
from typing import Any

import ptxdsl


def kernel_of(body: Callable[[Any, dict], None], params: list[tuple[str, Any]], threads: int,
              name: str) -> ptxdsl.KernelDef:
    """The kernel `name` of `threads` threads whose parameters are `params` ((name, type)
    in order); `body(k, args)` receives the context and the arguments by name."""

    def kernel(ctx, *args) -> None:
        body(ctx, {n: arg for (n, _), arg in zip(params, args, strict=True)})

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    kernel.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("ctx", kind)] + [inspect.Parameter(n, kind, annotation=t)
                                            for n, t in params])
    return ptxdsl.kernel(threads=threads, name=name)(kernel)
