"""Chained launches: a twin's example() returning "launches" runs them in order over its
shared arrays in `ptxdsl interp` (and `ptxdsl run` on the GPU), so a two-kernel algorithm
(partial sums, then their combination) is checked end to end; a launch that does not fit its
kernel is a located error naming the launch."""

import textwrap

import pytest

from ptxdsl.errors import LaunchError
from ptxdsl.tools import cli
from ptxdsl.tools.runner import interp_sample

SOURCE = """
// each CTA sums 32 elements into part[ctaid]; then one thread adds the partial sums
kernel partials(x: ptr<f32>, part: ptr<f32>) threads(32) {
    let v = x[%ctaid.x * 32 + %tid.x];
    for d in 0 .. 5 unroll { v += shfl_xor(v, 16 >> d); }
    if %tid.x == 0 { part[%ctaid.x] = v; }
}
kernel combine(part: ptr<f32>, total: ptr<f32>, n: u32) threads(1) {
    let s: f32 = 0.0;
    for i in 0 .. n { s += part[i]; }
    total[0] = s;
}
"""

TWIN = '''
import numpy as np

def example(rng, blocks=4):
    x = rng.standard_normal(blocks * 32).astype(np.float32)
    return {{
        "launches": [{{"kernel": "partials", "grid": blocks}},
                     {{"kernel": "combine", "grid": 1{args}}}],
        "inputs": {{"x": x, "n": {n}}},
        "outputs": {{"part": np.zeros(blocks, np.float32), "total": np.zeros(1, np.float32)}},
        "expected": {{"total": np.array([x.astype(np.float64).sum()], np.float32)}},
        "rtol": 1e-5, "atol": 1e-5,
    }}
'''


def sample(tmp_path, args="", n="blocks"):
    (tmp_path / "sum2.ptxdsl").write_text(SOURCE)
    (tmp_path / "sum2.py").write_text(textwrap.dedent(TWIN.format(args=args, n=n)))
    return tmp_path / "sum2.ptxdsl"


def test_two_kernels_chained_pass(tmp_path, capsys):
    [(name, [result])] = interp_sample(sample(tmp_path))
    assert name == "partials -> combine" and result.name == "total" and result.ok
    assert cli.run(["interp", str(tmp_path / "sum2.ptxdsl")]) == 0
    assert capsys.readouterr().out.startswith("PASS partials -> combine: total max |err|")


def test_the_second_launch_reads_what_the_first_wrote(tmp_path):
    """Combining only 3 of 4 partial sums fails: the check sees the chain's real result."""
    [(_, [result])] = interp_sample(sample(tmp_path, args=', "args": {"n": 3}'))
    assert not result.ok


def test_a_launch_that_does_not_fit_is_named(tmp_path):
    with pytest.raises(LaunchError) as e:
        interp_sample(sample(tmp_path, args=', "args": {"n": "count"}'))
    [d] = e.value.diagnostics
    assert d.message == ("launches[1]: parameter 'n' (u32) of kernel 'combine' has no value; "
                         "expected an array 'count' in \"inputs\" or \"outputs\", or \"args\": "
                         "{'n': the name of one, or a value}")
    assert d.span is not None and d.span.source.name.endswith("sum2.py")


@pytest.mark.gpu
def test_two_kernels_chained_on_the_gpu(tmp_path):
    from ptxdsl.tools.runner import run_sample

    (tmp_path / "all").mkdir()
    (tmp_path / "short").mkdir()
    [(name, [result])] = run_sample(sample(tmp_path / "all"))
    assert name == "partials -> combine" and result.ok
    [(_, [short])] = run_sample(sample(tmp_path / "short", args=', "args": {"n": 3}'))
    assert not short.ok
