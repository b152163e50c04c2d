"""`check` on tensor stores whose boxes overlap between CTAs (issue 44, class 9;
verify/overlap.py): a stride below the box is an error when it is a constant, a warning when
it depends on a parameter; a stride of a whole box, a map that clips each CTA's part, a store
only one CTA runs, and coordinates the verifier cannot evaluate say nothing."""

from __future__ import annotations

import pytest

import ptxdsl
from ptxdsl.lower import lower
from ptxdsl.verify import verify_module

# one CTA per head stores a 64-row box at COORDS (a rank-RANK map) when GUARD holds
STORE = """
kernel heads(src: ptr<f32>, out: tmap<f32, RANK>, rows: u32) threads(128) {
    shared tile: f32[64][32] align 128;
    let h = %ctaid.x;
    for i in 0 .. 16 {
        tile[i * 4 + %tid.x / 32, %tid.x % 32] = src[(h * 64 + i * 4) * 32 + %tid.x];
    }
    fence_proxy_async();
    bar_sync(0);
    if %tid.x == 0 && GUARD {
        tma_store(out, [COORDS], tile);
        bulk_commit();
        bulk_wait(0);
    }
}
"""


def diagnostics(coords: str, rank: int = 2, guard: str = "true") -> list[ptxdsl.errors.Diagnostic]:
    text = STORE.replace("COORDS", coords).replace("RANK", str(rank)).replace("GUARD", guard)
    module = lower(ptxdsl.parse(text, "heads.ptxdsl"), checks=False)
    try:
        return verify_module(module)
    except ptxdsl.CompileError as e:
        return e.diagnostics


def test_a_constant_stride_below_the_box_is_an_error():
    [d] = diagnostics("0, (h * 48) as s32")
    assert d.severity == "error"
    assert "the boxes of the CTAs with %ctaid.x = 0 and 1 overlap (at [0, 0] and [0, 48])" \
        in d.message
    assert "stores a box of 64 x 32 elements" in d.message
    assert d.span is not None and d.span.line == 11


def test_a_stride_by_a_parameter_is_a_warning_naming_it():
    [d] = diagnostics("0, (h * rows) as s32")
    assert d.severity == "warning"
    assert "overlap when rows = 7, for one" in d.message


def test_the_y_axis_is_checked_too():
    [d] = diagnostics("0, (%ctaid.y * 32) as s32")
    assert "%ctaid.y = 0 and 1 overlap" in d.message


@pytest.mark.parametrize("coords,rank,guard", [
    ("0, (h * 64) as s32", 2, "true"),  # whole boxes
    ("0, 0, h as s32", 3, "true"),  # a map per head: its bound clips the box
    ("0, (h * 48) as s32", 2, "h == 0"),  # only one CTA stores
    ("0, (h * 48 + %tid.x) as s32", 2, "true"),  # per thread: left to the interpreter
])
def test_nothing_to_say(coords, rank, guard):
    assert diagnostics(coords, rank, guard) == []
