"""What the interpreter reports: `InterpError` for bugs it finds in a kernel, `InterpWarning`
for suspicious but defined behaviour, and the phrases that name groups of threads."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NoReturn

from ..errors import Diagnostic, Note, PtxdslError, Span


class InterpError(PtxdslError):
    """A bug the interpreter found while running a kernel, with located diagnostics.

    `kind` names the class of problem: "deadlock", "race", "proxy-fence", "unwaited-store",
    "mbarrier", "barrier", "warp", "bounds", "alignment", "arithmetic", "step-limit",
    "copy" or "unsupported"."""

    def __init__(self, kind: str, diagnostics: list[Diagnostic] | Diagnostic | str):
        self.kind = kind
        super().__init__(diagnostics)


class InterpWarning(UserWarning):
    """Suspicious but defined behaviour, such as reading shared memory that nothing wrote."""


def loc_of(node: object) -> Span | None:
    return getattr(node, "loc", None)


def note(message: str, node: object) -> Note:
    return Note(message, loc_of(node))


def fail(kind: str, message: str, node: object = None, *notes: Note) -> NoReturn:
    raise InterpError(kind, Diagnostic(message, loc_of(node), tuple(notes)))


def id_ranges(ids: Iterable[int]) -> str:
    """Integers as compact ranges: `0..31, 64, 66..67`."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(set(ids)):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(_span_text(run))
        run = [i]
    if run:
        out.append(_span_text(run))
    return ", ".join(out)


def _span_text(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}..{run[-1]}"


def threads_phrase(tids: list[int], verb: str = "") -> str:
    """`thread 5 (warp 0)` or `threads 128..255 (warps 4..7)`, then `verb` agreeing with
    the number (`waits` / `wait`)."""
    if verb:
        return f"{threads_phrase(tids)} {verb + 's' if len(tids) == 1 else verb}"
    warps = sorted({t >> 5 for t in tids})
    w = f"warp {warps[0]}" if len(warps) == 1 else f"warps {id_ranges(warps)}"
    if len(tids) == 1:
        return f"thread {tids[0]} ({w})"
    return f"threads {id_ranges(tids)} ({w})"
