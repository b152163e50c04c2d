"""The operation families. Importing this package registers every `OpDef` with
`ptxdsl.opdef.REGISTRY`; `import ptxdsl` does so.

Adding an operation: its IR node in a module of `ptxdsl/ir/` (data only) and its
definition — operands, checks, PTX and interpreter semantics — in one module here. The
frontend, builder, printer, emitter and interpreter need no change; the verifier and lowering
only where the operation takes part in a whole-kernel rule (a barrier it completes on, a
buffer it reads).
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
