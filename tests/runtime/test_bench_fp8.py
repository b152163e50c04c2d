"""The fp8 workload's grouped GEMM and attention rows without a GPU or torch: their options
parse and bad ones are refused by name, the experts' ragged token counts, the rows' TFLOP/s
(counting only the rows an expert owns), targets and commands."""

from __future__ import annotations

import pytest

from bench import fp8_more
from bench.__main__ import parser
from bench.common import BenchError, split_page
from bench.fp8_more import GroupedCase, attention_row, grouped_cases, grouped_row


def test_the_default_cases_cover_the_issues_shapes():
    a = parser().parse_args(["fp8"])
    grouped, attn = fp8_more.chosen(a)
    assert [(c.e, c.k, c.n, c.masked) for c in grouped] == [
        (8, 7168, 4096, False), (32, 2048, 7168, False), (32, 7168, 4096, True)]
    assert grouped[2].tokens == 64
    assert {(128, 8192, False), (128, 8192, True), (128, 2048, False), (128, 2048, True),
            (64, 8192, False)} == set(attn)


def test_options_pick_cases_and_empty_ones_leave_a_kind_out():
    a = parser().parse_args(["fp8", "--grouped-case", "4:256:512:1024:masked,2:100:256:128",
                             "--attention-case", ""])
    grouped, attn = fp8_more.chosen(a)
    assert grouped == [GroupedCase(4, 256, 512, 1024, True), GroupedCase(2, 100, 256, 128, False)]
    assert [c.spec for c in grouped] == ["4:256:512:1024:masked", "2:100:256:128"]
    assert attn == []
    a = parser().parse_args(["fp8", "--grouped-case", "", "--attention-case", ""])
    assert fp8_more.run(a, *fp8_more.chosen(a)) == []  # no section, no torch needed


@pytest.mark.parametrize("bad, words", [
    ("8:4096:7168", "E:TOKENS:K:N"),
    ("8:4096:7168:x", "integers"),
    ("8:4096:7168:4096:masks", r"E:TOKENS:K:N\[:masked\], got '8:4096:7168:4096:masks'"),
    ("0:4096:7168:4096", "positive"),
])
def test_bad_grouped_cases_are_refused_by_name(bad, words):
    with pytest.raises(BenchError, match="^--grouped-case: .*" + words):
        grouped_cases(bad)


def test_contiguous_experts_are_ragged_about_the_mean_and_the_same_every_run():
    case = GroupedCase(8, 4096, 7168, 4096, False)
    rows = case.rows()
    assert sum(rows) == 8 * 4096 and len(rows) == 8
    assert min(rows) >= 4096 // 7 and max(rows) <= 7 * 4096  # 1/4 .. 7/4 of the weights' mean
    assert max(rows) - min(rows) > 4096 // 4  # ragged
    assert rows == case.rows() != GroupedCase(8, 4095, 7168, 4096, False).rows()
    assert case.label(rows).startswith("grouped fp8 8 experts x 32768 tokens, ragged ")


def test_masked_counts_lie_within_the_capacity():
    case = GroupedCase(32, 64, 7168, 4096, True)
    rows = case.rows()
    assert len(rows) == 32 and all(1 <= r <= 64 for r in rows) and len(set(rows)) > 4
    assert f"cap 64 tokens, masked, {sum(rows)} used" in case.label(rows)


def test_grouped_rows_count_only_owned_rows():
    case = GroupedCase(2, 64, 256, 512, True)
    ms = {"grouped_mm_fp8_masked": 0.01, "torch._scaled_grouped_mm, row-wise": 0.02}
    row = grouped_row(case, [10, 64], ms, "torch._scaled_grouped_mm, row-wise")
    assert row.ours_value == pytest.approx(2 * 74 * 256 * 512 / 0.01 / 1e9)
    assert row.ratio == pytest.approx(2.0) and row.target == 1.0 and not row.missed
    assert row.ours == "torch.ops.ptxdsl.grouped_mm_fp8_masked"
    assert "python -m bench fp8 " in row.command and "--grouped-case 2:64:256:512:masked" in \
        row.command
    case = GroupedCase(2, 50, 256, 512, False)
    ms = {"grouped_mm_fp8": 0.04, "F.scaled_grouped_mm, block-wise": 0.02}
    row = grouped_row(case, [30, 70], ms, "F.scaled_grouped_mm, block-wise")
    assert row.ref_value == pytest.approx(2 * 100 * 256 * 512 / 0.02 / 1e9)
    assert row.missed and row.ours == "torch.ops.ptxdsl.grouped_mm_fp8"


def test_attention_rows_hold_the_target_at_d128_s8192_only():
    tf = {"fp8": 800.0, "bf16": 640.0}
    for d, s, causal, target in ((128, 8192, False, 1.3), (128, 8192, True, 1.3),
                                 (128, 2048, True, None), (64, 8192, False, None)):
        row = attention_row(d, s, causal, tf)
        assert row.target == target and row.ratio == pytest.approx(1.25)
        assert row.case == f"fp8 attention {32768 // s} x 16 x {s} x {d}" + ", causal" * causal
        assert row.command.endswith(f"--attention-case {d}:{s}{':causal' * causal}")
    assert attention_row(128, 8192, False, tf).missed


def test_the_second_section_renders_and_shares_the_workload_key():
    s = fp8_more.Section("fp8", "fp8 grouped GEMM and fp8 attention", fp8_more.ABOUT,
                         rows=[attention_row(128, 8192, False, {"fp8": 1.0, "bf16": 1.0})])
    first = fp8_more.Section("fp8", "fp8 GEMM", "about").render()
    _, sections = split_page("# page\n\n" + first + "\n" + s.render())
    assert list(sections) == ["fp8"]
    assert "## fp8 grouped GEMM and fp8 attention (`python -m bench fp8`)" in sections["fp8"]
