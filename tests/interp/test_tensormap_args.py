"""Tensor-map arguments of `interp.run` that cannot work, refused at launch with the cause:
a numpy array where a map is wanted, and a box whose bytes differ from the buffer a derived
expect_tx counts (which would deadlock, the barrier waiting for bytes that never land)."""

import numpy as np
import pytest

import ptxdsl
from ptxdsl.interp import TensorMapModel, run

KERNEL = """\
kernel scale_rows(x: tmap<f32, 2>, out: ptr<f32>) threads(64) {
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
        out[(%ctaid.x * 16 + i) * 64 + %tid.x] = tile[i][%tid.x];
    }
}
"""


def launch(x) -> str:
    k = ptxdsl.parse(KERNEL, "k.ptxdsl").kernels[0]
    with pytest.raises(ptxdsl.LaunchError) as e:
        run(k, 2, {"x": x, "out": np.zeros((32, 64), np.float32)})
    return e.value.render()


def test_a_numpy_array_for_a_map_says_how_to_wrap_it():
    assert launch(np.zeros((32, 64), np.float32)) == (
        "error: argument 'x' (tmap<f32, 2>) is a numpy array; a tensor map wraps one: "
        "TensorMapModel(array, box=...), or the entry \"x\": {\"box\": (...)} of a twin's "
        "tensor_maps")


def test_a_box_short_of_its_buffer_is_refused_at_the_load():
    assert launch(TensorMapModel(np.zeros((32, 64), np.float32), box=(8, 64))) == (
        "k.ptxdsl:6:17: error: tensor map 'x' has box (8, 64), 2048 bytes, but a tma_load of "
        "it fills a buffer of 4096 bytes (shared f32[16][64]); the expect_tx the compiler "
        "derives counts the buffer's bytes, so the stage would never complete: expected box "
        "(16, 64) or another of 4096 bytes\n"
        "                tma_load(tile, x, [0, (%ctaid.x * 16) as s32]);\n"
        "                ^~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~")
    # the box that fills the buffer runs
    x = np.arange(32 * 64, dtype=np.float32).reshape(32, 64)
    out = np.zeros_like(x)
    run(ptxdsl.parse(KERNEL, "k.ptxdsl").kernels[0], 2,
        {"x": TensorMapModel(x, box=(16, 64)), "out": out})
    assert np.array_equal(out, x)


def test_run_sample_takes_the_gpu_only_options_it_can_ignore_and_refuses_interleave():
    k = ptxdsl.parse(KERNEL, "k.ptxdsl").kernels[0]
    x = np.arange(32 * 64, dtype=np.float32).reshape(32, 64)
    ex = {"grid": 2, "inputs": {"x": x}, "outputs": {"out": np.empty_like(x)},
          "tensor_maps": {"x": {"box": (16, 64), "l2_promotion": "256B", "interleave": "none"}}}
    assert np.array_equal(ptxdsl.interp.run_sample(k, ex)["out"], x)
    ex["tensor_maps"]["x"]["interleave"] = "32B"
    with pytest.raises(ptxdsl.LaunchError) as e:
        ptxdsl.interp.run_sample(k, ex)
    assert e.value.render() == ("error: tensor map 'x': the interpreter models no interleaved "
                                "layout (interleave='32B'); ptxdsl run does")
