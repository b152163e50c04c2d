"""samples/generate.py: without a GPU, its options and their errors, the message where torch
sees no GPU, and how it tells a tie from a failure where the two models' tokens part; on the
GPU, `--quick` generates the same tokens on ptxdsl's ops as on PyTorch's (or parts only at
ties), eager and from a CUDA graph, and prints both models' tokens per second."""

import subprocess
import sys

import pytest
from conftest import ROOT

from bench.common import twin

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")
SAMPLE = str(ROOT / "samples" / "generate.py")


@pytest.fixture(scope="module")
def gen(torch):
    return twin("generate")


def sample(*args):
    return subprocess.run([sys.executable, SAMPLE, *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def test_help_runs_without_a_gpu(torch):
    r = sample("--help")
    assert r.returncode == 0, r.stderr
    assert "Greedy generation of a small Llama-shaped model" in r.stdout
    for option in ("--layers", "--batch", "--steps", "--quick", "--page-size"):
        assert option in r.stdout


@pytest.mark.parametrize("args, message", [
    (["--page-size", "24"], "--page-size must be a power of two from 16, got 24"),
    (["--steps", "0"], "--steps must be at least 1, got 0"),
    (["--layers", "x"], "argument --layers: invalid int value: 'x'"),
])
def test_bad_options_are_named(gen, args, message, capsys):
    with pytest.raises(SystemExit) as e:
        gen.parse(args)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_quick_sets_a_small_run(gen):
    a = gen.parse(["--quick", "--steps", "100"])
    assert (a.layers, a.batch, a.steps, a.prompt) == (2, 4, 8, 40)


def test_without_a_gpu_it_says_so(gen, torch, capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert gen.main(["--quick"]) == 2
    assert "runs the models on a CUDA GPU; torch sees none here" in capsys.readouterr().err


def test_partings_tell_a_tie_from_a_failure(gen, torch):
    """Sequence 0 agrees; sequence 1 parts at step 1 where the logits agree within TIE of
    their scale and the margin is small (a tie); sequence 2 at step 2 where they do not (a
    failure)."""
    ours = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]])  # (steps, B)
    theirs = torch.tensor([[1, 2, 3], [4, 0, 6], [7, 8, 0]])
    zero = torch.zeros(3, 10)
    mine = [zero.clone() for _ in range(3)]
    ref = [zero.clone() for _ in range(3)]
    mine[1][1, 3] = ref[1][1, 3] = 10.0  # the logits' scale: TIE x 10 = 0.31
    mine[1][1, 5], ref[1][1, 0], ref[1][1, 5] = 0.5, 0.3, 0.25  # diff 0.3, margin 0.05
    mine[2][2, 9], ref[2][2, 0], ref[2][2, 9] = 0.1, 2.0, -0.5  # diff 2.0 of 2.0, margin 2.5
    parted = gen.partings(ours, theirs, mine, ref)
    assert [(p.sequence, p.step, p.ours, p.theirs) for p in parted] == [(1, 1, 5, 0),
                                                                          (2, 2, 9, 0)]
    assert parted[0].tie and parted[0].margin == pytest.approx(0.05)
    assert parted[0].diff == pytest.approx(0.3)
    assert not parted[1].tie and parted[1].margin == pytest.approx(2.5)
    assert parted[1].diff == pytest.approx(2.0)


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:TensorFloat32 tensor cores")
def test_quick_generates_the_same_tokens(gen, torch, cuda, gpu_cache, capsys):
    assert gen.main(["--quick"]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert out.count("tokens/s in a CUDA graph") == 2 and out.rstrip().endswith("PASS"), out
