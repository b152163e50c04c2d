"""`python -m bench plots` without a GPU: the figures drawn from results files as the
workloads' `--json` writes them (fake numbers here), each line holding the file's values;
bad or missing files are clear errors. Skipped where matplotlib (the `bench` extra) is
absent."""

from __future__ import annotations

import json

import pytest

from bench import plots
from bench.__main__ import main
from bench.common import BenchError, save_json

pytest.importorskip("matplotlib")

SEQ = (512, 2048, 8192)


def attention_points(dims: tuple[int, ...], fa4: bool = True) -> list[dict]:
    out = []
    for d in dims:
        for causal in (False, True):
            for s in SEQ:
                tf = {"ptxdsl": d + s / 100 + causal, "cuDNN": d + s / 200, "flash": d / 2}
                if fa4:
                    tf["FA4"] = d + s / 150
                out.append({"d": d, "s": s, "causal": causal, "tflops": tf})
    return out


DECODE = [{"m": m, "n": n, "k": 4096, "gbps": {"ptxdsl": n / 10 + m, "cuBLAS": n / 11 + m}}
          for n in (4096, 28672) for m in (1, 8, 256)]


@pytest.fixture
def drawn(monkeypatch):
    """The figures as drawn (their PNGs are still written)."""
    figs = {}
    real = plots.save

    def save(plt, fig, path):
        figs[path.name] = fig
        return real(plt, fig, path)

    monkeypatch.setattr(plots, "save", save)
    return figs


def lines(ax) -> dict[str, list[tuple[float, float]]]:
    return {ln.get_label(): list(zip(ln.get_xdata(), ln.get_ydata(), strict=True))
            for ln in ax.get_lines()}


def test_plots_draw_every_point_of_the_results(tmp_path, drawn, monkeypatch, capsys):
    monkeypatch.setattr("bench.common.machine", lambda: "fake machine")
    monkeypatch.setattr("bench.common.gpu_name", lambda: "H200")
    # a sweep run one head dim per process: two files, merged (FA4 absent from one)
    save_json(tmp_path / "a64.json", "attention", "TFLOP/s", attention_points((64,)))
    save_json(tmp_path / "a128.json", "attention", "TFLOP/s", attention_points((128,), False))
    save_json(tmp_path / "decode.json", "decode-gemm", "GB/s", DECODE)
    assert main(["plots", "--attention", str(tmp_path / "a64.json"), str(tmp_path / "a128.json"),
                 "--decode-gemm", str(tmp_path / "decode.json"), "-o", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for name in ("attention.png", "decode_gemm.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"wrote {tmp_path / name}" in out
    axes = drawn["attention.png"].axes
    assert [ax.get_title() for ax in axes] == [
        "head dim 64, not causal", "head dim 64, causal", "head dim 128, not causal",
        "head dim 128, causal"]
    causal64 = lines(axes[1])
    assert set(causal64) == {"ptxdsl", "FlashAttention 4", "cuDNN (SDPA)",
                             "FlashAttention 2 (SDPA)"}
    assert causal64["ptxdsl"] == [(s, 64 + s / 100 + 1) for s in SEQ]
    assert causal64["FlashAttention 4"] == [(s, 64 + s / 150) for s in SEQ]
    assert "FlashAttention 4" not in lines(axes[2])
    assert "H200" in drawn["attention.png"]._suptitle.get_text()
    dec = drawn["decode_gemm.png"].axes
    assert [ax.get_title() for ax in dec] == ["N x K = 4096 x 4096", "N x K = 28672 x 4096"]
    wide = lines(dec[1])
    assert wide["torch.ops.ptxdsl.gemm"] == [(m, 28672 / 10 + m) for m in (1, 8, 256)]
    assert wide["cuBLAS (torch.mm)"] == [(m, 28672 / 11 + m) for m in (1, 8, 256)]


def test_missing_and_wrong_results_are_clear_errors(tmp_path, capsys):
    nothing = ["plots", "--attention", str(tmp_path / "a.json"), "--decode-gemm",
               str(tmp_path / "d.json"), "-o", str(tmp_path)]
    assert main(nothing) == 1
    assert "no results to draw" in capsys.readouterr().err
    (tmp_path / "d.json").write_text(json.dumps({"workload": "attention", "points": [{}]}))
    assert main(nothing) == 1
    assert "not the results of `python -m bench decode-gemm --json`" in capsys.readouterr().err
    (tmp_path / "d.json").write_text("{")
    with pytest.raises(BenchError, match="not JSON"):
        plots.load(tmp_path / "d.json", "decode-gemm")
    assert list(tmp_path.glob("*.png")) == []

