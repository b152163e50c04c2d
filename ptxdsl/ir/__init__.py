"""The one IR that the .ptxdsl frontend and the Python API both build (see `core`).

`core` holds expressions, statements, the kernel and the operations of the foundation. A new
operation family puts its nodes in a module of its own here and is re-exported below, so
every pass spells a node `ir.Name`. `walk` holds the one walker over statements and their
blocks (`ir.walk`, `ir.sites`, `ir.blocks`, `ir.with_blocks`).
"""

from .atomic import *  # noqa: F403
from .cluster import *  # noqa: F403
from .core import *  # noqa: F403
from .core import Node, Unknown  # noqa: F401  (named for readers)
from .griddep import *  # noqa: F403
from .oneshot import *  # noqa: F403
from .pipeline import *  # noqa: F403
from .reduce import *  # noqa: F403
from .sm80 import *  # noqa: F403
from .walk import (  # noqa: F401
    Path,
    block_fields,
    blocks,
    exprs_of,
    free_names,
    has_expr,
    node_fields,
    sites,
    walk,
    with_blocks,
)
from .wgmma import *  # noqa: F403
