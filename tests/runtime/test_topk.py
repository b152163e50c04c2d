"""samples/topk.ptxdsl, the warp-level bitonic top-8: in the interpreter on data with many
ties (the values exact, each index pointing at its value, no column twice), and on the GPU
against torch.topk on fresh random data, the same checks."""

import numpy as np
import pytest
from conftest import SAMPLES

import ptxdsl
from ptxdsl.interp import run

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


@pytest.mark.parametrize("data", ["ties", "normal"])
def test_topk_in_the_interpreter(data):
    rows, n = 8, 512
    rng = np.random.default_rng(7)
    x = (rng.integers(0, 6, (rows, n)).astype(np.float32) if data == "ties"
         else rng.standard_normal((rows, n)).astype(np.float32))
    values, indices = np.zeros((rows, K), np.float32), np.zeros((rows, K), np.int32)
    kernel = ptxdsl.parse_file(SAMPLES / "topk.ptxdsl", {"N": n}).kernels[0]
    run(kernel, (rows + 3) // 4, {"x": x, "values": values, "indices": indices, "rows": rows})
    check_topk(x, values, indices)


@pytest.mark.gpu
@pytest.mark.parametrize("rows, n, data", [(4096, 8192, "normal"), (1001, 8192, "normal"),
                                           (512, 8192, "ties"), (300, 2048, "normal")])
def test_topk_on_the_gpu_against_torch(rows, n, data):
    torch = pytest.importorskip("torch")
    kernel = ptxdsl.compile(SAMPLES / "topk.ptxdsl", defines={"N": n}).kernel("topk")
    g = torch.Generator(device="cuda").manual_seed(rows + n)
    x = torch.randn(rows, n, device="cuda", generator=g) if data == "normal" else \
        torch.randint(0, 6, (rows, n), device="cuda", generator=g).float()
    values = torch.full((rows, K), float("nan"), device="cuda")
    indices = torch.full((rows, K), -1, dtype=torch.int32, device="cuda")
    kernel[(rows + 3) // 4](x, values, indices, rows)
    torch.cuda.synchronize()
    want = torch.topk(x, K, dim=1)
    assert torch.equal(values, want.values)
    check_topk(x.cpu().numpy(), values.cpu().numpy(), indices.cpu().numpy())


@pytest.mark.gpu
def test_topk_twin_runs_on_the_gpu():
    """`ptxdsl run samples/topk.ptxdsl`: the twin's example at its default sizes."""
    from ptxdsl.tools.runner import run_sample

    [(_, results)] = run_sample(SAMPLES / "topk.ptxdsl")
    assert [r.name for r in results] == ["values", "indices"]
    assert all(r.ok for r in results), [r.detail for r in results]
