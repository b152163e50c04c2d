"""The math functions (exp exp2 log log2 sigmoid silu gelu rsqrt tanh; builder/fastmath.py) in
the text language and the Python API: each against numpy in the CPU interpreter on fresh
random inputs, the PTX they lower to (and ptxas accepting it), f16/bf16 through f32, and the
errors for erf and a wrong type.

The interpreter computes each `.approx` instruction exactly and rounds it to f32, so these
tolerances bound the composition (the f32 roundings between the instructions), not the
hardware's approximation error, which docs/language.md states."""

import math
import textwrap

import numpy as np
import pytest
from conftest import assemble

import ptxdsl
from ptxdsl import f32, ptr
from ptxdsl.interp import run

N = 256
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


# name -> (numpy reference in f64, input range, relative tolerance, absolute tolerance)
REFERENCE = {
    "exp": (np.exp, (-20.0, 20.0), 2e-6, 0.0),
    "exp2": (np.exp2, (-30.0, 30.0), 1e-6, 0.0),
    "log": (np.log, (1e-3, 1e3), 2e-6, 1e-7),
    "log2": (np.log2, (1e-3, 1e3), 1e-6, 1e-7),
    "sigmoid": (_sigmoid, (-30.0, 30.0), 2e-6, 1e-7),
    "silu": (lambda x: x * _sigmoid(x), (-30.0, 30.0), 2e-6, 1e-6),
    "gelu": (lambda x: 0.5 * x * (1 + np.tanh(SQRT_2_OVER_PI * (x + 0.044715 * x**3))),
             (-8.0, 8.0), 2e-6, 1e-6),
    "rsqrt": (lambda x: 1 / np.sqrt(x), (1e-3, 1e3), 1e-6, 0.0),
    "tanh": (np.tanh, (-8.0, 8.0), 1e-6, 1e-7),
}


def text_source(fn: str, ty: str = "f32") -> str:
    return textwrap.dedent(f"""
    kernel apply(x: ptr<{ty}>, y: ptr<{ty}>) threads({N}) {{
        let i = %tid.x;
        y[i] = {fn}(x[i]);
    }}
    """)


def text_kernel(fn: str, ty: str = "f32"):
    return ptxdsl.parse(text_source(fn, ty), "fastmath.ptxdsl")


def api_kernel(fn: str):
    @ptxdsl.kernel(threads=N)
    def apply(k, x: ptr(f32), y: ptr(f32)):
        i = k.let("i", k.tid.x)
        y[i] = getattr(k, fn)(x[i])
    return apply


def inputs(fn: str) -> np.ndarray:
    lo, hi = REFERENCE[fn][1]
    rng = np.random.default_rng()  # fresh inputs every run: a failure lists them
    return rng.uniform(lo, hi, N).astype(np.float32)


def check(kernel, fn: str) -> None:
    ref, _, rtol, atol = REFERENCE[fn]
    x = inputs(fn)
    y = np.zeros(N, np.float32)
    run(kernel, 1, {"x": x, "y": y})
    want = ref(x.astype(np.float64))
    np.testing.assert_allclose(y, want, rtol=rtol, atol=atol, err_msg=f"{fn} on {x.tolist()}")


@pytest.mark.parametrize("fn", sorted(REFERENCE))
def test_text_matches_numpy(fn):
    check(text_kernel(fn).kernel(), fn)


@pytest.mark.parametrize("fn", sorted(REFERENCE))
def test_python_matches_numpy_and_the_text(fn):
    kd = api_kernel(fn)
    check(kd, fn)
    assert kd.ir == text_kernel(fn).kernel()  # one IR from both frontends


def test_limits():
    """sigmoid saturates to 0 and 1 (ex2 overflows to inf, rcp of inf is 0); exp underflows
    to 0 below 2^-126 (ex2.approx.ftz); log of 0 is -inf."""
    x = np.array([-200.0, -100.0, 100.0, 200.0], np.float32)
    for fn, want in [("sigmoid", [0.0, 0.0, 1.0, 1.0]), ("exp", [0.0, 0.0, math.inf, math.inf]),
                     ("silu", [-0.0, -0.0, 100.0, 200.0])]:
        y = np.zeros(N, np.float32)
        run(text_kernel(fn).kernel(), 1, {"x": np.resize(x, N), "y": y})
        assert y[:4].tolist() == want, fn
    y = np.zeros(N, np.float32)
    run(text_kernel("log").kernel(), 1, {"x": np.zeros(N, np.float32), "y": y})
    assert np.all(y == -np.inf)


@pytest.mark.parametrize("ty", ["f16", "bf16"])
def test_half_types_compute_in_f32(ty):
    """The argument widens to f32, the result narrows back to the argument's type."""
    ptx = ptxdsl.compile(text_source("sigmoid", ty)).ptx
    assert f"cvt.f32.{ty}" in ptx and f"cvt.rn.{ty}.f32" in ptx, ptx
    assert "ex2.approx.ftz.f32" in ptx and "rcp.approx.f32" in ptx


LOWERED = {  # the fast PTX each function is (in order)
    "exp": ["mul.f32", "ex2.approx.ftz.f32"],
    "exp2": ["ex2.approx.ftz.f32"],
    "log": ["lg2.approx.f32", "mul.f32"],
    "log2": ["lg2.approx.f32"],
    "sigmoid": ["mul.f32", "ex2.approx.ftz.f32", "add.f32", "rcp.approx.f32"],
    "silu": ["ex2.approx.ftz.f32", "rcp.approx.f32", "mul.f32"],
    "gelu": ["tanh.approx.f32", "add.f32", "mul.f32"],
    "rsqrt": ["rsqrt.approx.f32"],
    "tanh": ["tanh.approx.f32"],
}


@pytest.mark.ptxas
def test_ptx_is_the_fast_form_and_assembles(tmp_path):
    src = "\n".join(f"""
    kernel k_{fn}(x: ptr<f32>, y: ptr<f32>) threads(32) {{
        let i = %tid.x;
        y[i] = {fn}(x[i]);
    }}""" for fn in LOWERED)
    ptx = ptxdsl.compile(textwrap.dedent(src)).ptx
    for fn, instrs in LOWERED.items():
        body = ptx.split(f".entry k_{fn}(")[1].split(".entry")[0]
        ops = [line.split()[0] for line in body.splitlines() if line.strip()
               and not line.strip().startswith(("//", ".", "{", "}", "$", "ret", "ld.", "st.",
                                                "mov.", "cvta", "mul.wide", "add.s64", "cvt"))]
        pos = 0
        for want in instrs:
            assert want in ops[pos:], f"{fn}: {want} not after {ops[:pos]} in {ops}"
            pos = ops.index(want, pos) + 1
        assert not any(o.startswith(("div", "sqrt.rn", "ex2.approx.f32")) for o in ops), ops
    assemble(ptx, tmp_path)


def errors(src: str) -> str:
    with pytest.raises(ptxdsl.CompileError) as e:
        ptxdsl.parse(textwrap.dedent(src), "bad.ptxdsl").kernel()
    return "\n".join(d.message for d in e.value.diagnostics)


def test_erf_says_what_to_write_instead():
    msg = errors("""
    kernel k(x: ptr<f32>) threads(32) {
        x[0] = erf(x[1]);
    }
    """)
    assert msg == ("erf() has no fast PTX form; for GELU write gelu(x) (the tanh form, one "
                   "tanh.approx), or write an erf polynomial with fma()")


def test_wrong_type_and_arity():
    msg = errors("""
    kernel k(x: ptr<f64>, n: u32) threads(32) {
        x[0] = exp(x[1]);
        let a = silu(n);
        let b = gelu(1.0, 2.0);
    }
    """)
    assert msg.splitlines() == [
        "exp() takes f32, f16 or bf16 (the last two compute in f32), got f64",
        "silu() takes f32, f16 or bf16 (the last two compute in f32), got u32",
        "gelu() takes 1 argument(s), got 2",
    ]


def test_a_repeated_argument_with_an_atomic_is_refused():
    """silu and gelu use their argument more than once: an atomic in it would run as often."""
    msg = errors("""
    kernel k(x: ptr<f32>, c: ptr<u32>) threads(32) {
        x[0] = silu(atomic_add(x[1], 1.0));
        x[2] = exp(atomic_add(x[3], 1.0));
    }
    """)
    assert msg == ("silu() evaluates its argument more than once, and this one holds an atomic "
                   "access, which would run as often: bind it first (let v = ...; silu(v))")


def test_math_names_stay_free_for_variables():
    """`log` is a common buffer name: declaring it does not hide the function `log(...)`."""
    k = ptxdsl.parse(textwrap.dedent(f"""
    kernel k(x: ptr<f32>, y: ptr<f32>) threads({N}) {{
        shared log: f32[{N}];
        let exp = %tid.x;
        log[exp] = log(x[exp]);
        y[exp] = log[exp];
    }}
    """), "names.ptxdsl").kernel()
    x = inputs("log")
    y = np.zeros(N, np.float32)
    run(k, 1, {"x": x, "y": y})
    np.testing.assert_allclose(y, np.log(x.astype(np.float64)), rtol=2e-6, atol=1e-7)


def test_constant_arguments_fold_their_scaling():
    """`exp(2.0)` folds 2 log2(e) at compile time and still computes e^2 (f32-rounded)."""
    k = ptxdsl.parse(textwrap.dedent("""
    kernel k(y: ptr<f32>) threads(1) {
        y[0] = exp(2.0);
        y[1] = log(10.0);
        y[2] = gelu(1.0);
        y[3] = silu(-3.0);
    }
    """), "consts.ptxdsl").kernel()
    y = np.zeros(4, np.float32)
    run(k, 1, {"y": y})
    want = [math.exp(2.0), math.log(10.0),
            0.5 * (1 + math.tanh(SQRT_2_OVER_PI * 1.044715)), -3.0 / (1 + math.exp(3.0))]
    np.testing.assert_allclose(y, want, rtol=2e-6)


# the hardware's bounds (docs/language.md's table, with margin): (relative, absolute)
GPU_TOLERANCE = {
    "exp": (1e-5, 0.0), "exp2": (1e-6, 0.0), "log": (1e-6, 1e-6), "log2": (1e-6, 1e-6),
    "sigmoid": (1e-5, 1e-7), "silu": (1e-5, 1e-6), "gelu": (0.0, 2.5e-3),
    "rsqrt": (1e-6, 0.0), "tanh": (1e-3, 1e-6),
}


@pytest.mark.gpu
@pytest.mark.parametrize("fn", sorted(REFERENCE))
def test_on_the_gpu_within_the_stated_accuracy(fn):
    """The approx instructions on the device: each function within the accuracy the docs
    state for it, against numpy in f64 on fresh inputs."""
    from ptxdsl import runtime as rt

    x = inputs(fn)
    prog = ptxdsl.compile(text_source(fn))
    dx, dy = rt.to_device(x), rt.empty(N, "f32")
    try:
        prog[1](dx, dy)
        rt.synchronize()
        y = dy.copy_to_host()
    finally:
        dx.free()
        dy.free()
    rtol, atol = GPU_TOLERANCE[fn]
    want = REFERENCE[fn][0](x.astype(np.float64))
    np.testing.assert_allclose(y, want, rtol=rtol, atol=atol, err_msg=f"{fn} on {x.tolist()}")
