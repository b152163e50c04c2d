"""The .ptxdsl text frontend: `parser` reads source through the lark grammar
(grammar/ptxdsl.lark) and walks the tree into the KernelBuilder in source order; `generics`
gives compile-time parameters their values and stands type parameters for their types."""

from .parser import parse, parse_file, parse_tree, read_source

__all__ = ["parse", "parse_file", "parse_tree", "read_source"]
