"""Fuzzing: no input reaches an internal error.

Three sources of inputs, each a hypothesis strategy: programs generated from the grammar
itself (grammar/ptxdsl.lark), mutations of the samples (tokens deleted, duplicated, swapped,
numbers replaced by extreme values, text cut short, unicode and NUL bytes), and random
sequences of Python-API calls (including values of another kernel, or of a finished one).
Each input must end in PTX that ptxas assembles or in located diagnostics (see fuzzing.py).

The default budget keeps the suite fast; PTXDSL_FUZZ_EXAMPLES=N runs N examples per test
(BENCHMARKS.md records a large run).
"""

from __future__ import annotations

import re

import pytest
from conftest import assemble
from fuzzing import (
    EXTREME_NUMBERS,
    EXTREME_TEXT,
    FUNCTIONS,
    SETTINGS,
    SNIPPETS,
    Escape,
    examples,
    is_space,
    outcome,
    sample_sources,
    tokens,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from ptxdsl.frontend.parser import _parser


def fuzz(default: int, deep: int) -> settings:
    """Settings of a fuzz test: `default` examples (`deep` under PTXDSL_DEEP=1, as CI runs),
    or PTXDSL_FUZZ_EXAMPLES; no deadline (fuzzing.outcome bounds each input), no example
    database (nothing written here)."""
    return settings(max_examples=examples(default, deep), **SETTINGS)
SOURCES = sample_sources()


def assembled(o, tmp_path) -> None:
    """PTX out of the compiler goes through ptxas (raw `asm` text is the user's own)."""
    if o.kind != "ptx":
        return
    target = re.search(r"^\.target (\S+)", o.text, re.M)
    assemble(o.text, tmp_path, target.group(1) if target else "sm_90a")


# ----------------------------------------------------------------------------- mutations

MUTATIONS = ("delete", "duplicate", "swap", "number", "text", "truncate", "splice")


@st.composite
def mutants(draw) -> tuple[str, str]:
    """A sample with one to three mutations: (sample name, mutated text). A splice puts a
    piece of function or named-index syntax before a token, and the file's functions first."""
    name = draw(st.sampled_from(sorted(SOURCES)))
    toks = tokens(SOURCES[name])
    real = [i for i, t in enumerate(toks) if not is_space(t)]
    numbers = [i for i in real if toks[i][:1].isdigit()]
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(MUTATIONS))
        i = real[draw(st.integers(0, len(real) - 1))]
        if kind == "delete":
            toks[i] = ""
        elif kind == "duplicate":
            toks[i] = f"{toks[i]} {toks[i]}"
        elif kind == "swap":
            j = real[draw(st.integers(0, len(real) - 1))]
            toks[i], toks[j] = toks[j], toks[i]
        elif kind == "number" and numbers:
            toks[draw(st.sampled_from(numbers))] = draw(st.sampled_from(EXTREME_NUMBERS))
        elif kind == "text":
            junk = draw(st.sampled_from(EXTREME_TEXT) | st.text(min_size=1, max_size=3))
            toks[i] = draw(st.sampled_from([junk, toks[i] + junk, junk + toks[i]]))
        elif kind == "splice":
            toks[i] = f"{draw(st.sampled_from(SNIPPETS))} {toks[i]}"
            toks[0] = FUNCTIONS + toks[0] if not toks[0].startswith(FUNCTIONS) else toks[0]
        elif kind == "truncate":
            text = "".join(toks)
            return name, text[: draw(st.integers(0, len(text)))]
    return name, "".join(toks)


@fuzz(60, deep=300)
@given(m=mutants(), arch=st.sampled_from([None, None, "sm_80"]))
def test_sample_mutants_compile_or_fail_located(m, arch, tmp_path_factory):
    _, text = m
    o = outcome(text, arch)
    if "asm" not in text:
        assembled(o, tmp_path_factory.mktemp("ptx"))


# ----------------------------------------------------------------------------- grammar


# Names that mean something somewhere: operations, value functions, types, special members,
# and a few that a generated program declares and uses.
def _vocabulary() -> list[str]:
    from ptxdsl import types as T
    from ptxdsl.builder import VALUE_FUNCTIONS
    from ptxdsl.builder.atomic import WORDS
    from ptxdsl.opdef import BY_SYNTAX

    return sorted(set(BY_SYNTAX) | VALUE_FUNCTIONS | set(T.SCALARS) | set(WORDS) |
                  {"u32x4", "f32x2", "bf16x2", "threads", "cluster", "maxnreg", "minctas",
                   "nonportable", "type", "tile", "ring", "a", "b", "i", "n", "x", "N",
                   "full", "empty", "mn", "reg", "param", "global", "entry", "f", "g", "h",
                   "tv"})


def grammar_programs(start: str = "start") -> st.SearchStrategy[str]:
    from hypothesis.extra.lark import from_lark

    names = st.sampled_from(_vocabulary())
    sregs = st.sampled_from(["%tid.x", "%ctaid.x", "%laneid", "%warp", "%cluster_ctarank",
                             "%clock64", "%nope", "%tid.w"])
    ints = st.sampled_from(EXTREME_NUMBERS[:34] + ["1", "2", "4", "8", "16", "32", "128"] * 4)
    floats = st.sampled_from(["0.5", "1.0", "1e-05", "3.5e38", "1e309", "65504.0", "2.0"])
    strings = st.sampled_from(['""', '"mov.u32 {0}, {1};"', '"{7}"', '"add.f32 {0}, {0}, 1.0;"',
                               '"x\\n.entry y"', '"\\u00e9"', '"ok"'])
    space = " "
    explicit = {
        "NAME": names.map(lambda s: s + space), "SREG": sregs.map(lambda s: s + space),
        "INT": ints.map(lambda s: s + space), "FLOAT": floats.map(lambda s: s + space),
        "STRING": strings.map(lambda s: s + space),
    }
    # comments and white space in a few plain forms (mutations bring the odd characters)
    explicit |= {"WS": st.sampled_from([" ", "\n", "\t"]), "COMMENT": st.just("// c\n"),
                 "BLOCK_COMMENT": st.just("/* c */")}
    # keywords and punctuation get a space after them, so adjacent tokens do not merge
    for t in _parser().terminals:
        if t.name not in explicit and t.pattern.type == "str":
            explicit[t.name] = st.just(t.pattern.value + space)
    terminals, rules, _ = _parser().grammar.compile([start], ())
    used = {t.name for t in terminals} | {t.name for r in rules for t in r.expansion}
    explicit = {k: v for k, v in explicit.items() if k in used}
    return from_lark(_parser(), start=start, explicit=explicit)


# A kernel header with parameters of each kind, around a generated body (which may call the
# functions before it).
HEADER = (FUNCTIONS +
          "kernel k(a: u32, f: f32, p: ptr<f32>, q: ptr<u32>, t: tmap<f32, 2>) threads(128) "
          "{ shared tile: f32[16][32]; mbarrier full count 1; pipeline ring stages 2 "
          "{ x: f32[256]; } let n: u32 = a; let x: f32 = f; let tv: f32[4] = 0.0; ")


def kernel_bodies() -> st.SearchStrategy[str]:
    """One to four generated statements in a kernel that declares one of everything."""
    return st.lists(grammar_programs("stmt"), min_size=1, max_size=4).map(
        lambda body: HEADER + " ".join(body) + " }")


@fuzz(15, deep=50)
@given(text=kernel_bodies(), arch=st.sampled_from([None, None, "sm_80"]))
def test_generated_statements_compile_or_fail_located(text, arch, tmp_path_factory):
    o = outcome(text, arch)
    if "asm" not in text:
        assembled(o, tmp_path_factory.mktemp("ptx"))


@fuzz(6, deep=12)
@given(text=grammar_programs())
def test_generated_files_compile_or_fail_located(text, tmp_path_factory):
    o = outcome(text)
    if "asm" not in text:
        assembled(o, tmp_path_factory.mktemp("ptx"))


# ----------------------------------------------------------------------------- regressions


@pytest.mark.parametrize("text,message,where", [
    # issue 15: a leading zero was an internal ValueError (exit 2)
    ("kernel k(p: ptr<u32>) threads(032) { p[0] = 1; }",
     "integer literal 032 has a leading zero; write 32", ":1:31:"),
])
def test_found_inputs_are_located_errors(text, message, where):
    o = outcome(text)
    assert o.kind == "error" and message in o.text and where in o.text, o.text


def test_escape_is_reported():
    """The property can fail: an exception out of the pipeline is an Escape."""
    from unittest import mock

    with mock.patch("ptxdsl.compiler.compile_module", side_effect=KeyError("x")):
        with pytest.raises(Escape, match="internal error"):
            outcome("kernel k() threads(32) { }")
