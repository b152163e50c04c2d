"""A twin's mistakes, as `ptxdsl interp` reports them (whole messages): each names the twin
file (its `def example` line), the key and the form expected; a box that does not fill the
stage buffer is reported as that, not as the deadlock it would cause; an integer output that
differs says where; the step limit names --max-steps and SMALL. The docs page's own example
(docs/twins.md) runs as written."""

import re
from pathlib import Path

import pytest

from ptxdsl.tools.cli import main

DOCS = Path(__file__).parents[2] / "docs" / "twins.md"

KERNEL = """\
kernel scale_rows(x: tmap<f32, 2>, out: ptr<f32>, s: f32) threads(64) {
    shared tile: f32[16][64] align 128;
    role loader warps 0 .. 1 {
        if elect() {
            async rows {
                tma_load(tile, x, [0, (%ctaid.x * 16) as s32]);
            }
        }
    }
    role idle warps 1 .. 2 { }
    await(rows);
    for i in 0 .. 16 {
        out[(%ctaid.x * 16 + i) * 64 + %tid.x] = tile[i][%tid.x] * s;
    }
}
"""

TWIN = """\
import numpy as np


def example(rng, blocks=2):
    x = rng.standard_normal((blocks * 16, 64)).astype(np.float32)
    return {"grid": blocks, "inputs": {"x": x, "s": 0.5}, "outputs": {"out": np.empty_like(x)},
            "tensor_maps": {"x": @MAPS@}, "expected": {"out": x * 0.5}, "rtol": 1e-6}
"""

DEF_LINE = ("def example(rng, blocks=2):\n"
            "^" + "~" * 26)


def interp(tmp_path, monkeypatch, capsys, kernel: str, twin: str, *flags: str) -> tuple[int, str]:
    """(exit status, stdout + stderr) of `ptxdsl interp k.ptxdsl` beside twin `k.py`."""
    (tmp_path / "k.ptxdsl").write_text(kernel)
    (tmp_path / "k.py").write_text(twin)
    monkeypatch.chdir(tmp_path)  # paths print relative: the messages do not name tmp_path
    rc = main(["interp", "k.ptxdsl", *flags])
    out = capsys.readouterr()
    return rc, out.out + out.err


def scale_rows(tmp_path, monkeypatch, capsys, maps: str) -> tuple[int, str]:
    twin = TWIN.replace('"tensor_maps": {"x": @MAPS@}', maps) if maps.startswith('"') \
        else TWIN.replace("@MAPS@", maps)
    return interp(tmp_path, monkeypatch, capsys, KERNEL, twin)


def test_a_good_twin_passes(tmp_path, monkeypatch, capsys):
    assert scale_rows(tmp_path, monkeypatch, capsys, '{"box": (16, 64)}') == \
        (0, "PASS scale_rows: out max |err| 0, relative 0\n")


def test_a_missing_tensor_maps_entry_names_the_parameter_and_the_form(tmp_path, monkeypatch,
                                                                       capsys):
    rc, out = scale_rows(tmp_path, monkeypatch, capsys, '"tensor_maps": {}')
    assert rc == 1
    assert out == (
        "k.py:4:1: error: tensor map parameter 'x' of kernel 'scale_rows' has no entry in this "
        "twin's tensor_maps; expected \"tensor_maps\": {\"x\": {\"box\": (rows, cols), "
        "\"swizzle\": \"none\"}}, the box outermost first\n" + DEF_LINE + "\n")


def test_a_box_the_encoder_refuses_names_the_map(tmp_path, monkeypatch, capsys):
    rc, out = scale_rows(tmp_path, monkeypatch, capsys, '{"box": (16, 300)}')
    assert rc == 1
    assert out == (
        "k.py:4:1: error: tensor_maps['x'] (box (16, 300), outermost first, for a (32, 64) "
        "array): box[1] must be in [1, 256], got 300\n" + DEF_LINE + "\n")


def test_an_entry_without_a_box_and_a_map_of_no_parameter(tmp_path, monkeypatch, capsys):
    rc, out = scale_rows(tmp_path, monkeypatch, capsys,
                         '"tensor_maps": {"x": (16, 64), "y": {"box": (1,)}}')
    assert rc == 1
    assert out == (
        "k.py:4:1: error: tensor_maps['x'] is (16, 64); expected {\"box\": (rows, cols), "
        "\"swizzle\": \"none\"}, the box outermost first\n" + DEF_LINE + "\n"
        "k.py:4:1: error: tensor_maps['y'] names no tensor map parameter of kernel "
        "'scale_rows' (its tensor maps: x)\n" + DEF_LINE + "\n2 errors generated.\n")


def test_a_box_smaller_than_its_buffer_is_reported_before_it_deadlocks(tmp_path, monkeypatch,
                                                                        capsys):
    rc, out = scale_rows(tmp_path, monkeypatch, capsys, '{"box": (8, 64)}')
    assert rc == 1
    assert out == (
        "k.py:4:1: error: tensor_maps['x'] has box (8, 64), 2048 bytes, but a tma_load of it "
        "fills a buffer of 4096 bytes (shared f32[16][64]); the expect_tx the compiler derives "
        "counts the buffer's bytes, so the stage would never complete: expected box (16, 64) "
        "or another of 4096 bytes\n" + DEF_LINE + "\n"
        "k.ptxdsl:6:17: note: the tma_load filling the 4096-byte buffer\n"
        "                tma_load(tile, x, [0, (%ctaid.x * 16) as s32]);\n"
        "                ^~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~\n")


def test_a_wrong_integer_output_says_how_many_and_the_first(tmp_path, monkeypatch, capsys):
    kernel = "kernel iota(out: ptr<u32>) threads(32) {\n    out[%tid.x] = %tid.x * 2;\n}\n"
    twin = ("import numpy as np\n\n\ndef example(rng):\n"
            "    want = np.arange(32, dtype=np.uint32) * 2\n"
            "    want[5] = 7\n    want[9] = 0\n"
            "    return {'grid': 1, 'outputs': {'out': np.empty(32, np.uint32)},\n"
            "            'expected': {'out': want}}\n")
    assert interp(tmp_path, monkeypatch, capsys, kernel, twin) == \
        (1, "FAIL iota: out: 2 of 32 elements differ; the first at index [5]: got 10, want 7\n")


SPIN = """\
kernel spin(out: ptr<u32>) threads(32) {
    let i: u32 = 0;
    while i < 1000 {
        i = i + 1;
    }
    out[%tid.x] = i;
}
"""

SPIN_TWIN = """\
import numpy as np


def example(rng):
    return {"grid": 1, "outputs": {"out": np.empty(32, np.uint32)},
            "expected": {"out": np.full(32, 1000, np.uint32)}}
"""


def test_the_step_limit_names_max_steps_and_small(tmp_path, monkeypatch, capsys):
    rc, out = interp(tmp_path, monkeypatch, capsys, SPIN, SPIN_TWIN, "--max-steps", "100")
    assert rc == 1
    assert re.sub(r"thread \d+", "thread T", out) == (
        "k.ptxdsl:3:5: error: step limit reached: CTA 0 ran 100 steps without finishing; "
        "thread T is still running this loop (an infinite loop? If not, allow more with "
        "`ptxdsl interp --max-steps N` (max_steps= in Python), or give the twin a SMALL dict "
        "of smaller example() sizes)\n"
        "    while i < 1000 {\n"
        "    ^~~~~~~~~~~~~~~~\n")
    # the same kernel passes once it is allowed the steps it needs
    assert interp(tmp_path, monkeypatch, capsys, SPIN, SPIN_TWIN, "--max-steps", "100000") == \
        (0, "PASS spin: out max |err| 0, relative 0\n")


def test_max_steps_must_be_positive(tmp_path, monkeypatch, capsys):
    assert interp(tmp_path, monkeypatch, capsys, SPIN, SPIN_TWIN, "--max-steps", "0") == \
        (1, "error: --max-steps 0: expected a positive number of steps, e.g. "
            "--max-steps 5000000\n")


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOCS.read_text(), re.S)


@pytest.mark.parametrize("box, ok", [("(16, 64)", True), ("(8, 64)", False)])
def test_the_docs_example_runs_as_written(tmp_path, monkeypatch, capsys, box, ok):
    kernel = next(b for b in blocks("ptxdsl") if "kernel scale_rows" in b)
    twin = next(b for b in blocks("python") if "def example" in b)
    assert '"box": (16, 64)' in twin
    rc, out = interp(tmp_path, monkeypatch, capsys, kernel, twin.replace("(16, 64)", box))
    assert (rc, out.startswith("PASS scale_rows: out")) == ((0, True) if ok else (1, False))


def test_a_parameter_without_a_value_a_stray_reference_and_an_unknown_option(tmp_path,
                                                                            monkeypatch,
                                                                            capsys):
    twin = TWIN.replace('"outputs": {"out": np.empty_like(x)}', '"outputs": {}') \
        .replace('"expected": {"out": x * 0.5}', '"expected": {"y": x}') \
        .replace("@MAPS@", '{"box": (16, 64), "swizle": "128B"}')
    rc, out = interp(tmp_path, monkeypatch, capsys, KERNEL, twin)
    assert rc == 1
    assert out == (
        "k.py:4:1: error: parameter 'out' (ptr<f32>) of kernel 'scale_rows' has no value; "
        "expected an array in \"inputs\" (or \"outputs\", where the kernel writes it)\n"
        + DEF_LINE + "\n"
        "k.py:4:1: error: expected['y'] names no array of \"inputs\" or \"outputs\": a reference "
        "is compared with the array of its name after the run\n" + DEF_LINE + "\n"
        "k.py:4:1: error: tensor_maps['x'] has option 'swizle'; the options are box, swizzle, "
        "oob_fill, l2_promotion, interleave\n" + DEF_LINE + "\n3 errors generated.\n")


def test_a_grid_that_is_no_grid(tmp_path, monkeypatch, capsys):
    rc, out = interp(tmp_path, monkeypatch, capsys, KERNEL,
                     TWIN.replace('"grid": blocks', '"grid": (blocks, 0)')
                     .replace("@MAPS@", '{"box": (16, 64)}'))
    assert (rc, out) == (1, "k.py:4:1: error: \"grid\" is (2, 0); expected n or (x, y, z), 1 to 3 "
                            "positive integers\n" + DEF_LINE + "\n")
