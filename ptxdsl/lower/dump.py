"""PTXDSL_DUMP=DIR: every stage of every compile written to DIR, one file per kernel per stage,
named so they sort in pass order:

    DIR/<kernel>.<target>.00-source.ptxdsl     the IR as the frontend built it
    DIR/<kernel>.<target>.01-turns.ptxdsl      after each pass of the target's list (printed
    ...                                        with `ptxdsl.printer`)
    DIR/<kernel>.<target>.04-emit.ptx          the PTX: the module's header and this kernel

A compile that names no target picks sm_90 or sm_90a after lowering (`ptxdsl.target`), so the
stages are kept and written once the target is known, or when a pass fails.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .. import ir
from ..kernelinfo import PtxModule
from ..printer import print_kernel
from ..target import Target

ENV = "PTXDSL_DUMP"
_ENTRY = re.compile(r"^(?=\.visible \.entry )", re.M)
_ENTRY_NAME = re.compile(r"\.visible \.entry (\w+)\(")


class StageDump:
    """The stages of one compile, written to `directory`."""

    def __init__(self, directory: Path, source: ir.Module):
        self.directory = directory
        self.stages: list[tuple[int, str, ir.Module]] = [(0, "source", source)]

    @classmethod
    def from_env(cls, source: ir.Module) -> StageDump | None:
        """A dump of the compile of `source` when PTXDSL_DUMP names a directory, else None."""
        directory = os.environ.get(ENV)
        return cls(Path(directory), source) if directory else None

    def stage(self, index: int, name: str, module: ir.Module) -> None:
        """Keep the module after step `index` of the pass list (`ptxdsl.lower.lower`'s watch)."""
        self.stages.append((index, name, module))

    def write_stages(self, t: Target) -> None:
        """Write every kept stage, as compiled for `t`."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for index, name, module in self.stages:
            for k in module.kernels:
                self._file(k.name, t, index, name, "ptxdsl").write_text(print_kernel(k))

    def write_ptx(self, t: Target, ptx: PtxModule) -> None:
        """Write each kernel's PTX: the module's header and declarations, then its entry."""
        head, *entries = _ENTRY.split(ptx.ptx)
        for entry in entries:
            name = _ENTRY_NAME.match(entry)
            assert name is not None, entry[:80]
            path = self._file(name.group(1), t, len(t.passes), t.passes[-1], "ptx")
            path.write_text(head + entry)

    def _file(self, kernel: str, t: Target, index: int, step: str, ext: str) -> Path:
        return self.directory / f"{kernel}.{t.name}.{index:02d}-{step}.{ext}"
