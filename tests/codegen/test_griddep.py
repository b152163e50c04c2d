"""Programmatic dependent launch: `griddep_wait()` and `griddep_launch_dependents()` emit
griddepcontrol, a kernel that waits is launched with programmatic stream serialization
(derived into KernelInfo.pdl, and from there into the launch), sm_80 builds drop both, and
the interpreter runs them as the no-ops they are between launches that run in turn."""

import numpy as np

import ptxdsl
from ptxdsl import f32, ptr
from ptxdsl.interp import run

SRC = """kernel k(x: ptr<f32>) threads(32) {
    griddep_wait();
    x[%tid.x] = x[%tid.x] + 1.0;
    griddep_launch_dependents();
}"""


def test_wait_makes_a_programmatic_launch():
    prog = ptxdsl.compile_module(ptxdsl.parse(SRC))
    assert "griddepcontrol.wait;" in prog.ptx and "griddepcontrol.launch_dependents;" in prog.ptx
    assert prog.kernels[0].pdl
    no_wait = ptxdsl.compile_module(ptxdsl.parse(SRC.replace("griddep_wait();", "")))
    assert not no_wait.kernels[0].pdl  # launch_dependents alone: an ordinary launch


def test_launch_plan_carries_it():
    from ptxdsl.runtime.launch import plan_launch

    info = ptxdsl.compile_module(ptxdsl.parse(SRC)).kernels[0]
    assert plan_launch(info, 4).pdl


def test_sm80_drops_both_and_the_interpreter_runs_through():
    m = ptxdsl.parse(SRC)
    ptx = ptxdsl.compile_module(m, arch="sm_80")
    assert "griddepcontrol" not in ptx.ptx and not ptx.kernels[0].pdl
    x = np.arange(32, dtype=np.float32)
    run(m.kernels[0], 1, {"x": x})
    assert np.array_equal(x, np.arange(32, dtype=np.float32) + 1)


def test_python_api_and_printer():
    @ptxdsl.kernel(threads=32, name="k")
    def k(k, x: ptr(f32)):
        k.griddep_wait()
        x[k.tid.x] = x[k.tid.x] + 1.0
        k.griddep_launch_dependents()

    assert k.ir == ptxdsl.parse(SRC).kernels[0]
    assert ptxdsl.parse(ptxdsl.print_kernel(k.ir)).kernels[0] == k.ir
