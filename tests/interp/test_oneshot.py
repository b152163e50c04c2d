"""One-shot asynchronous loads: `async name { copies }` and `await(name)` derive the barrier,
its arrival count, the bytes, the init and fence, and the parity; the verifier and the
interpreter check the result like any other barrier."""

import textwrap
import warnings

import numpy as np
import pytest

import ptxdsl
from ptxdsl import ir
from ptxdsl.interp import InterpError, InterpWarning, run
from ptxdsl.lower import lower
from ptxdsl.verify import verify_module

BROADCAST = """
kernel broadcast(w: ptr<f32>, b: ptr<f32>, out: ptr<f32>) threads(64) {
    shared wsh: f32[64] align 128;
    shared bsh: f32[32] align 128;
    role loader warps 0 .. 1 {
        if elect() {
            async params {
                bulk_load(wsh, w[0]);
                bulk_load(bsh, b[0]);
            }
        }
    }
    role idle warps 1 .. 2 { }
    await(params);
    out[%tid.x] = wsh[%tid.x] + bsh[%tid.x % 32];
}
"""


def lowered(text: str) -> ir.Kernel:
    m = lower(ptxdsl.parse(textwrap.dedent(text), "a.ptxdsl"), checks=False)
    verify_module(m)
    return m.kernels[0]


def test_lowering_derives_barrier_count_bytes_init_and_parity():
    k = lowered(BROADCAST)
    stmts = list(ir.walk(k.body))
    decl = next(s for s in stmts if isinstance(s, ir.BarrierDecl))
    assert (decl.name, decl.n, decl.count) == ("params.bar", 0, 1)  # one elected thread
    inits = [s for s in stmts if isinstance(s, ir.MBarrierInit)]
    assert [i.bar.name for i in inits] == ["params.bar"]
    assert sum(isinstance(s, ir.FenceMBarrierInit) for s in stmts) == 1
    arm = next(s for s in stmts if isinstance(s, ir.MBarrierArriveExpectTx))
    assert arm.nbytes.value == 64 * 4 + 32 * 4
    wait = next(s for s in stmts if isinstance(s, ir.MBarrierWait))
    assert wait.parity.value == 0 and wait.bar.name == "params.bar"
    copies = [s for s in stmts if isinstance(s, ir.BulkLoad)]
    assert len(copies) == 2 and all(c.bar.name == "params.bar" for c in copies)
    # armed before the copies are issued
    then = next(s for s in stmts if isinstance(s, ir.If) and s.then and
                isinstance(s.then[0], ir.MBarrierArriveExpectTx)).then
    assert [type(s) for s in then] == [ir.MBarrierArriveExpectTx, ir.BulkLoad, ir.BulkLoad]


def test_arrival_count_follows_the_threads_that_run_the_block():
    text = BROADCAST.replace("if elect() {", "if %laneid < 4 {")
    k = lower(ptxdsl.parse(text), checks=False).kernels[0]
    decl = next(s for s in ir.walk(k.body) if isinstance(s, ir.BarrierDecl))
    assert decl.count == 4
    # and the verifier still checks what the block does: four threads copying the same bytes
    assert "bulk_load is issued by 4 threads" in compile_error(text)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_interpreter_runs_the_derived_protocol(seed):
    w = np.arange(64, dtype=np.float32)
    b = np.arange(32, dtype=np.float32) * 100
    out = np.zeros(64, np.float32)
    run(ptxdsl.parse(BROADCAST).kernel(), 1, {"w": w, "b": b, "out": out}, seed=seed)
    assert (out == w + np.tile(b, 2)).all()


def test_ptx_arms_once_and_inits_once():
    ptx = ptxdsl.compile(BROADCAST).ptx
    assert "mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [" in ptx
    assert ptx.count("mbarrier.init.shared::cta.b64") == 1


def test_the_python_api_builds_the_same_kernel():
    f32 = ptxdsl.f32

    @ptxdsl.kernel(threads=64)
    def broadcast(k, w: ptxdsl.ptr(f32), b: ptxdsl.ptr(f32), out: ptxdsl.ptr(f32)):
        wsh = k.shared("wsh", f32, [64], align=128)
        bsh = k.shared("bsh", f32, [32], align=128)
        with k.role("loader", 0, 1):
            with k.if_(k.elect()):
                with k.async_("params") as params:
                    k.bulk_load(wsh, w[0])
                    k.bulk_load(bsh, b[0])
        with k.role("idle", 1, 2):
            pass
        k.await_(params)
        out[k.tid.x] = wsh[k.tid.x] + bsh[k.tid.x % 32]

    assert broadcast.ir == ptxdsl.parse(BROADCAST).kernel()
    assert ptxdsl.parse(ptxdsl.print_kernel(broadcast.ir)).kernel() == broadcast.ir


def compile_error(text: str) -> str:
    with pytest.raises(ptxdsl.CompileError) as e:
        ptxdsl.compile(textwrap.dedent(text))
    return e.value.render()


def test_async_in_a_loop_is_rejected():
    msg = compile_error(BROADCAST.replace("if elect() {", "for i in 0 .. 2 {"))
    assert "async 'params' is a one-shot load, but it is inside a loop" in msg
    assert "note: the loop" in msg


def test_a_copy_naming_a_barrier_inside_async_is_rejected():
    text = BROADCAST.replace("    shared bsh", "    mbarrier other count 1;\n    shared bsh")
    msg = compile_error(text.replace("bulk_load(bsh, b[0]);", "bulk_load(bsh, b[0], other);"))
    assert "inside async 'params', bulk_load completes on the load's own barrier; leave out " \
           "the barrier argument" in msg


def test_a_copy_nested_in_an_if_of_the_block_is_rejected():
    msg = compile_error(BROADCAST.replace("bulk_load(bsh, b[0]);",
                                          "if %laneid == 0 { bulk_load(bsh, b[0]); }"))
    assert "must be a statement of the block itself" in msg


def test_awaiting_something_else_and_declaring_twice():
    assert "argument 'load' of await must be a one-shot load (async name { ... }), got " \
           "shared f32[64]" in compile_error(BROADCAST.replace("await(params)", "await(wsh)"))
    assert "'wsh' is already declared" in compile_error(
        BROADCAST.replace("async params", "async wsh").replace("await(params)", "await(wsh)"))


def test_no_thread_runs_the_block():
    msg = compile_error(BROADCAST.replace("if elect() {", "if %tid.x == 40 {"))
    assert "no thread runs async 'params', so await(params) would wait forever" in msg


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_missing_await_is_caught_by_the_interpreter(seed):
    """Reading before the copy lands is a race with the copy in flight, or a read of memory
    nothing has written yet (when the copy was not issued): either way, reported."""
    text = BROADCAST.replace("await(params);", "")
    w, b, out = np.ones(64, np.float32), np.ones(32, np.float32), np.zeros(64, np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InterpWarning)
        with pytest.raises((InterpError, InterpWarning)):
            run(ptxdsl.parse(text).kernel(), 1, {"w": w, "b": b, "out": out}, seed=seed)


@pytest.mark.ptxas
def test_lowered_async_load_assembles(tmp_path):
    from test_ptxas import assemble

    assemble(ptxdsl.compile(BROADCAST, arch="sm_90a").ptx, tmp_path)
