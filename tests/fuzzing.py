"""The fuzz suite's machinery: run an input through the command line's own pipeline and
classify the outcome, mutate sample sources, and generate programs from the grammar.

The property every input must have: it ends in PTX (which ptxas assembles) or in located
diagnostics (file:line:col, exit status 1); never another exception, an unlocated
diagnostic, a hang or a timeout. `outcome` raises `Escape` for anything else, with the
input and the traceback, so a failing example says what to fix.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import io
import json
import os
import re
import signal
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path

from conftest import sample_names, sample_path
from hypothesis import HealthCheck

from ptxdsl.errors import CompileError, PtxdslError

# Examples per fuzz test: small in the default suite, larger on demand
# (PTXDSL_FUZZ_EXAMPLES=2000 pytest tests/frontend/test_fuzz.py).
EXAMPLES = int(os.environ.get("PTXDSL_FUZZ_EXAMPLES", "0")) or None
SECONDS_PER_INPUT = 20  # a hang or an unbounded compile is a failure, not a slow test


# Outcome classes of this run, by where an error was reported; written as JSON at exit to
# the file PTXDSL_FUZZ_REPORT names (BENCHMARKS.md's fuzzing section comes from it).
STATS: collections.Counter[str] = collections.Counter()


def _write_report() -> None:
    path = os.environ.get("PTXDSL_FUZZ_REPORT")
    if path and STATS:
        Path(path).write_text(json.dumps(dict(sorted(STATS.items())), indent=1) + "\n")


atexit.register(_write_report)


def stage(e: BaseException) -> str:
    """The part of ptxdsl that reported `e`: the innermost ptxdsl module on its traceback
    that is not the diagnostics module itself."""
    where = "?"
    tb = e.__traceback__
    while tb is not None:
        path = Path(tb.tb_frame.f_code.co_filename)
        if "ptxdsl" in path.parts and path.name != "errors.py":
            where = path.parent.name if path.parent.name != "ptxdsl" else path.stem
        tb = tb.tb_next
    if where == "frontend":  # the walker raises what the builder collected
        syntax = any(d.message.startswith(("unexpected", "not a text file", "not UTF-8"))
                     for d in getattr(e, "diagnostics", ()))
        return "syntax" if syntax else "builder"
    return where


class Escape(AssertionError):
    """An input escaped every check: an internal error, an unlocated diagnostic, a hang."""


DEEP = bool(os.environ.get("PTXDSL_DEEP"))


def examples(default: int, deep: int) -> int:
    """Examples of a fuzz test: PTXDSL_FUZZ_EXAMPLES if set, else `deep` under PTXDSL_DEEP=1
    (what CI runs) and `default` in the inner loop."""
    return EXAMPLES or (deep if DEEP else default)


# The default budget replays the same examples every run (a CI failure is reproducible); a
# larger budget draws fresh ones. No deadline: `outcome` bounds each input itself.
SETTINGS = {"derandomize": EXAMPLES is None, "deadline": None, "database": None,
            "suppress_health_check": list(HealthCheck)}


@dataclass
class Outcome:
    kind: str  # "ptx" or "error"
    text: str  # the PTX, or the rendered diagnostics
    arch: str | None = None


@contextlib.contextmanager
def time_limit(seconds: int, what: str):
    """Raise Escape if the block runs longer than `seconds` (a hang)."""
    def on_alarm(signum, frame):
        raise Escape(f"{what}: no result after {seconds} s (a hang or an unbounded compile)")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def check_located(e: PtxdslError, what: str) -> str:
    """The rendering of a diagnostic-carrying error, after checking every error is located."""
    text = e.render()
    errors = [d for d in e.diagnostics if d.severity == "error"]
    if not errors:
        raise Escape(f"{what}: a {type(e).__name__} without an error diagnostic:\n{text}")
    for d in errors:
        if d.span is None:
            raise Escape(f"{what}: an unlocated diagnostic:\n{text}")
    if not isinstance(e, CompileError):
        raise Escape(f"{what}: compiling raised {type(e).__name__}, not CompileError:\n{text}")
    return text


def outcome(data: bytes | str, arch: str | None = None, name: str = "fuzz.ptxdsl"
            ) -> Outcome:
    """Compile `data` as `ptxdsl compile FILE [--arch ARCH]` does, in this process."""
    from ptxdsl.tools import cli

    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / name, Path(tmp) / "out.ptx"
        src.write_bytes(raw)
        argv = ["compile", str(src), "-o", str(out)] + (["--arch", arch] if arch else [])
        what = f"ptxdsl {' '.join(argv[:2])} on {_show(raw)}"
        try:
            with time_limit(SECONDS_PER_INPUT, what), contextlib.redirect_stdout(io.StringIO()):
                rc = cli.run(argv)
        except PtxdslError as e:
            if out.exists():
                raise Escape(f"{what}: an error, and an output file was written") from None
            text = check_located(e, what)
            STATS[f"text: error ({stage(e)})"] += 1
            return Outcome("error", text, arch)
        except Escape:
            raise
        except RecursionError:
            raise Escape(f"{what}: RecursionError") from None
        except BaseException:
            raise Escape(f"{what}: internal error\n{traceback.format_exc()}") from None
        if rc != 0 or not out.exists():
            raise Escape(f"{what}: exit status {rc} without a diagnostic")
        STATS[f"text: PTX ({arch or 'sm_90'})"] += 1
        return Outcome("ptx", out.read_text(), arch)


def _show(raw: bytes) -> str:
    text = raw.decode("utf-8", "backslashreplace")
    return repr(text) if len(text) < 4000 else repr(text[:4000]) + f"... ({len(text)} chars)"


# ----------------------------------------------------------------------------- samples

def sample_sources() -> dict[str, str]:
    return {name: sample_path(name).read_text() for name in sample_names()}


_TOKEN = re.compile(r"\s+|//[^\n]*|/\*.*?\*/|\"(?:[^\"\\\n]|\\.)*\"|%?[A-Za-z_][\w.]*"
                    r"|[0-9][\w.]*(?:[eE][+-]?\d+)?|<<=|>>=|[-+*/%&|^<>=!]=|&&|\|\||<<|>>|\.\."
                    r"|.", re.S)


def tokens(text: str) -> list[str]:
    """`text` cut into tokens and whitespace, so that ''.join(tokens(t)) == t."""
    return _TOKEN.findall(text)


def is_space(tok: str) -> bool:
    return tok.isspace() or tok.startswith("//") or tok.startswith("/*")


# Numbers a mutation puts where a number was: the edges of every integer type, forms the
# grammar accepts or nearly accepts, and values too large for anything.
EXTREME_NUMBERS = [
    "0", "1", "00", "032", "0009", "08", "0x", "0x0", "0xFFFFFFFF", "0XfFfF", "0x100000000",
    "0xFFFFFFFFFFFFFFFF", "0x10000000000000000", "0b101", "0o17", "1_000", "127", "128",
    "255", "256", "32767", "32768", "65535", "65536", "2147483647", "2147483648",
    "4294967295", "4294967296", "9223372036854775807", "9223372036854775808",
    "18446744073709551615", "18446744073709551616", "1" + "0" * 40, "9" * 400,
    "0.0", "1.5", "3.4028235e38", "3.5e38", "1e39", "1e308", "1e309", "1e-400", "1e999999",
    "6.1e-5", "65504.0", "65520.0", "1.0e", "1.", ".5", "2e", "1e+", "0e0", "00.5",
]
EXTREME_TEXT = ["\0", "\u00e9", "\u4e2d", "\U0001f600", "\u202e", "\ufeff", "\u00a0", "\ud800",
                "\x7f", "\r", "\t", "\\", "\"", "'", "`", "$", "@", "#", "?", "{", "}", "(",
                ")", "[", "]", ";", ",", ":", "..", "<", ">", "%tid.x", "%bogus.q", "as",
                "unroll"]

# Functions a mutant or a generated kernel may call, well formed, at the start of its file;
# and pieces of the newer syntax a mutation splices in anywhere: definitions, calls with right
# and wrong arguments, named compile-time indices, a recursion, returns.
FUNCTIONS = ("fn f(x: u32) -> u32 { return x + 1; } "
             "fn g(tv: f32[4], const i: u32) { tv[i] = tv[3 - i] * 2.0; } "
             "fn h(const n: u32, tv: f32[n]) -> f32 { let s = tv[0]; return s + tv[n - 1]; } ")
SNIPPETS = [
    "let q = f(1);", "g(tv, 1);", "let e = h(4, tv);", "f();", "f(1, 2);", "g(tv, %tid.x);",
    "h(3, tv);", "let tv: f32[4] = 0.0;", "let tw: f32[2];", "g(tw, 0);", "let z = g(tv, 0);",
    "for u in 0 .. 4 unroll { let a = u * 3 % 4; const B = a ^ 1; tv[a] = tv[B]; g(tv, a); }",
    "fn r(x: u32) -> u32 { return r(x); }", "fn d(x: u32) { return; }", "fn", "->", "const",
    "return 1;", "fn k(x: f32) -> f32 { return x; }", "fn s(t: u32) { shared b: u32[4]; }",
]
