"""samples/topk.ptxdsl, the warp-level bitonic top-8: in the interpreter on data with many
ties (the values exact, each index pointing at its value, no column twice), and on the GPU
against torch.topk on fresh random data, the same checks, in f32 and bf16."""

import numpy as np
import pytest
from conftest import SAMPLES
from fuzzing import DEEP

import ptxdsl
from ptxdsl.interp import run
from ptxdsl.runtime.dtypes import bf16_to_f32, f32_to_bf16

K = 8


def check_topk(x: np.ndarray, values: np.ndarray, indices: np.ndarray) -> None:
    """The values exactly torch.topk's (sorted, largest first); indices, where values tie,
    any columns holding them, each once."""
    want = -np.sort(-x, axis=1)[:, :K]
    np.testing.assert_array_equal(values, want)
    cols = indices.astype(np.int64)
    assert ((cols >= 0) & (cols < x.shape[1])).all()
    np.testing.assert_array_equal(np.take_along_axis(x, cols, axis=1), values)
    assert (np.diff(np.sort(cols, axis=1), axis=1) > 0).all(), "a column is taken twice"


# (test_interp runs the twin's example: distinct f32 values)
@pytest.mark.parametrize("data, dtype", [("ties", "f32")] + ([("ties", "bf16"), ("normal", "bf16")]
                                                                if DEEP else []))
def test_topk_in_the_interpreter(data, dtype):
    rows, n = 6, 512
    rng = np.random.default_rng(7)
    x = (rng.integers(0, 6, (rows, n)).astype(np.float32) if data == "ties"
         else rng.standard_normal((rows, n)).astype(np.float32))
    if dtype == "bf16":
        x = bf16_to_f32(f32_to_bf16(x))  # the values bf16 holds
    given = f32_to_bf16(x) if dtype == "bf16" else x
    values, indices = np.zeros((rows, K), given.dtype), np.zeros((rows, K), np.int32)
    kernel = ptxdsl.parse_file(SAMPLES / "topk.ptxdsl", {"N": n, "T": dtype}).kernels[0]
    run(kernel, (rows + 3) // 4, {"x": given, "values": values, "indices": indices,
                                  "rows": rows})
    check_topk(x, bf16_to_f32(values) if dtype == "bf16" else values, indices)


@pytest.mark.gpu
@pytest.mark.parametrize("rows, n, data, dtype", [
    (4096, 8192, "normal", "f32"), (1001, 8192, "normal", "f32"), (512, 8192, "ties", "f32"),
    (300, 2048, "normal", "f32"), (4096, 8192, "normal", "bf16"), (999, 8192, "ties", "bf16")])
def test_topk_on_the_gpu_against_torch(rows, n, data, dtype):
    torch = pytest.importorskip("torch")
    kernel = ptxdsl.compile(SAMPLES / "topk.ptxdsl", defines={"N": n, "T": dtype}).kernel()
    g = torch.Generator(device="cuda").manual_seed(rows + n)
    x = torch.randn(rows, n, device="cuda", generator=g) if data == "normal" else \
        torch.randint(0, 6, (rows, n), device="cuda", generator=g).float()
    x = x.to(torch.bfloat16 if dtype == "bf16" else torch.float32)
    values = torch.full((rows, K), float("nan"), device="cuda", dtype=x.dtype)
    indices = torch.full((rows, K), -1, dtype=torch.int32, device="cuda")
    kernel[(rows + 3) // 4](x, values, indices, rows)
    torch.cuda.synchronize()
    want = torch.topk(x, K, dim=1)
    assert torch.equal(values, want.values)
    check_topk(x.float().cpu().numpy(), values.float().cpu().numpy(), indices.cpu().numpy())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_topk_twin_runs_on_the_gpu(dtype):
    """`ptxdsl run samples/topk.ptxdsl [-D T=bf16]`: the twin's example at its default
    sizes."""
    from ptxdsl.tools.runner import run_sample

    [(_, results)] = run_sample(SAMPLES / "topk.ptxdsl", defines={"T": dtype})
    assert [r.name for r in results] == ["values", "indices"]
    assert all(r.ok for r in results), [r.detail for r in results]
