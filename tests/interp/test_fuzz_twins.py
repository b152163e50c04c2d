"""Fuzzing the twins (issue 44, deliver 8): a sample's example() dict, mutated (keys dropped
or added at random, arrays of other shapes and dtypes, other grids, tensor-map boxes and
options, kernel names, values of the wrong kind), goes through `ptxdsl interp` as a user's
twin would. Every run must end in PASS/FAIL lines or located errors (exit 0 or 1), never an
internal error, a traceback or a hang."""

from __future__ import annotations

import pickle
import shutil

import numpy as np
from conftest import ROOT, cli
from fuzzing import SECONDS_PER_INPUT, SETTINGS, STATS, Escape, examples, time_limit
from hypothesis import given, settings
from hypothesis import strategies as st

from ptxdsl.tools.runner import import_twin

SAMPLES = ("add_one", "stream_copy", "vector_copy")
TOP_KEYS = ("grid", "inputs", "outputs", "expected", "tensor_maps", "kernel", "rtol", "atol")
DTYPES = ("uint8", "uint16", "int32", "uint32", "float32", "float64", "bool")

arrays = st.builds(
    lambda shape, dtype, fill: np.full(shape, fill, dtype),
    st.lists(st.integers(0, 40), min_size=0, max_size=3).map(tuple),
    st.sampled_from(DTYPES), st.integers(0, 1))
junk = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 70_000), st.floats(allow_nan=True),
              st.text(max_size=6), arrays),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.lists(inner, max_size=3).map(tuple),
                            st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6)
grids = st.one_of(st.integers(-1, 4), st.lists(st.integers(-1, 3), max_size=4).map(tuple),
                  st.text(max_size=3), st.none())
boxes = st.one_of(st.lists(st.integers(-1, 300), max_size=4).map(tuple), junk)
OPTIONS = ("box", "swizzle", "interleave", "l2_promotion", "oob_fill", "elem_strides", "bogus")


@st.composite
def mutations(draw):
    """(kind, path, value) edits of an example dict."""
    kind = draw(st.sampled_from(("drop", "set", "grid", "box", "option", "kernel")))
    if kind == "drop":
        paths = TOP_KEYS + ("inputs.*", "outputs.*", "tensor_maps.*")
        return kind, draw(st.sampled_from(paths)), None
    if kind == "set":
        where = draw(st.sampled_from(("", "inputs", "outputs", "expected", "tensor_maps")))
        key = draw(st.one_of(st.sampled_from(("*", "src", "dst", "ntiles", "n")),
                             st.text(max_size=6)))
        return kind, f"{where}.{key}" if where else key, draw(junk)
    if kind == "grid":
        return kind, "grid", draw(grids)
    if kind == "box":
        return kind, "tensor_maps.*.box", draw(boxes)
    if kind == "option":
        return kind, f"tensor_maps.*.{draw(st.sampled_from(OPTIONS))}", draw(junk)
    return kind, "kernel", draw(st.one_of(st.text(max_size=8), st.integers(), st.none()))


def apply(ex: dict, edits, rng: np.random.Generator) -> dict:
    for _kind, path, value in edits:
        parts = path.split(".")
        node = ex
        for p in parts[:-1]:
            if not isinstance(node, dict) or not node:
                break
            key = p if p != "*" else sorted(node, key=str)[rng.integers(len(node))]
            node = node.get(key)
        else:
            if isinstance(node, dict):
                last = parts[-1]
                if last == "*":
                    if not node:
                        continue
                    last = sorted(node, key=str)[rng.integers(len(node))]
                if _kind == "drop":
                    node.pop(last, None)
                else:
                    node[last] = value
    return ex


@settings(max_examples=examples(10, deep=120), **SETTINGS)
@given(sample=st.sampled_from(SAMPLES), edits=st.lists(mutations(), min_size=1, max_size=3),
       seed=st.integers(0, 3))
def test_mutated_twins_pass_fail_or_are_located(sample, edits, seed, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("twin")
    rng = np.random.default_rng(seed)
    twin = import_twin(ROOT / "samples" / f"{sample}.py")
    ex = apply(twin.example(rng, **getattr(twin, "SMALL", {})), edits, rng)
    (tmp / "example.pickle").write_bytes(pickle.dumps(ex))
    shutil.copy(ROOT / "samples" / f"{sample}.ptxdsl", tmp / "fuzz.ptxdsl")
    (tmp / "fuzz.py").write_text(
        "import pickle\nfrom pathlib import Path\n\n\ndef example(rng):\n"
        f"    return pickle.loads(Path({str(tmp / 'example.pickle')!r}).read_bytes())\n")
    with time_limit(SECONDS_PER_INPUT, f"{sample} with {edits}"):
        r = cli("interp", str(tmp / "fuzz.ptxdsl"), "--seed", str(seed), "--max-steps", "20000")
    STATS[f"twin:{r.returncode}"] += 1
    if r.returncode not in (0, 1) or "internal error" in r.stderr or "Traceback" in r.stderr:
        raise Escape(f"{sample} with edits {edits}: exit {r.returncode}\n{r.stderr[-3000:]}")
