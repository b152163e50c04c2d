"""The operation families. Importing this package registers every `OpDef` with
`ptxdsl.opdef.REGISTRY`; `import ptxdsl` does so.

Adding an operation (docs/adding-an-operation.md): its IR node in a module of `ptxdsl/ir/`
(data only) and its definition — operands, checks, PTX, interpreter semantics, and the
effects and flags the verifier and the lowering passes read — in one module here. No other
module needs a change.
"""

from . import (
    atomic,
    bulk,
    cluster,
    mbarrier,
    oneshot,
    pipeline,
    reduce,
    sm80,
    sync,
    tensor,
    wgmma,
)

__all__ = ["atomic", "bulk", "cluster", "mbarrier", "oneshot", "pipeline", "reduce", "sm80",
           "sync", "tensor", "wgmma"]
