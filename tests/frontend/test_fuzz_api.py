"""Fuzzing the Python API: random sequences of KernelContext calls and Value operations, with
arguments of every Python type, values of another kernel and of a finished kernel. Each
build ends in a kernel whose PTX ptxas assembles, or in located diagnostics; never another
exception (see fuzzing.py for the property, test_fuzz.py for the text frontend)."""

import math
import operator
import traceback

import numpy as np
from conftest import assemble
from fuzzing import SETTINGS, STATS, Escape, check_located, examples, stage, time_limit
from hypothesis import given, settings
from hypothesis import strategies as st

import ptxdsl
from ptxdsl import ir
from ptxdsl import types as T
from ptxdsl.builder import VALUE_FUNCTIONS
from ptxdsl.compiler import compile_module
from ptxdsl.errors import CompileError
from ptxdsl.opdef import BY_SYNTAX

SCALARS = [T.u32, T.s32, T.u64, T.f32, T.f16, T.bf16, T.pred, T.b32, T.u8, T.f64]
JUNK = [None, "x", "", "1bad", "a b", 0, 1, 2, 3, 4, 8, 16, 32, 128, 1024, -1, 2**32, 2**64,
        2**70, -(2**70), 0.5, -0.0, 1e300, math.inf, -math.inf, math.nan, True, False,
        np.int64(4), np.uint8(255), np.float32(1.5), [0, 1], (), {}, object(), T.f32,
        T.Ptr(T.f32), T.TensorMap(T.f32, 2), T.parse_type_name("u32x4"), "gpu", "acq_rel",
        "relaxed", "cta", "sys"]
NAMES = ["a", "b", "tile", "ring", "bar", "x", "i", "acc", "k", "p", "", "9x", "a-b", "if",
         "mbarrier", "min", "reg", "%r1"]
OPS = sorted(BY_SYNTAX)
FUNCS = sorted(VALUE_FUNCTIONS) + ["u32x4", "f32x2", "bf16x2"]
BINOPS = [operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
          operator.mod, operator.and_, operator.or_, operator.xor, operator.lshift,
          operator.rshift, operator.eq, operator.ne, operator.lt, operator.le, operator.gt,
          operator.ge]


class Build:
    """One random kernel body: a pool of values the steps draw arguments from and add to."""

    def __init__(self, data, pool: list):
        self.data, self.pool = data, pool

    def draw(self, strategy):
        return self.data.draw(strategy)

    def arg(self):
        choices = [st.sampled_from(JUNK)]
        if self.pool:
            choices = [st.sampled_from(self.pool)] * 3 + choices
        v = self.draw(st.one_of(*choices))
        if self.draw(st.integers(0, 9)) == 0 and self.pool:  # a list of values
            return [self.draw(st.sampled_from(self.pool)) for _ in range(self.draw(
                st.integers(0, 3)))]
        return v

    def name(self):
        if self.draw(st.integers(0, 7)) == 0:
            return self.draw(st.sampled_from(JUNK))
        return self.draw(st.sampled_from(NAMES))

    def keep(self, v):
        if isinstance(v, ptxdsl.Value):
            self.pool.append(v)

    def body(self, k, depth: int) -> None:
        for _ in range(self.draw(st.integers(0, 6 if depth == 0 else 3))):
            step = self.draw(st.sampled_from(STEPS))
            step(self, k, depth)


def _shared(b, k, depth):
    shape = b.draw(st.sampled_from([[32], [4, 8], 16, [0], [-1], [2**40], ["x"], [1.5], []]))
    b.keep(k.shared(b.name(), b.draw(st.sampled_from(SCALARS + JUNK[:6])), shape,
                    b.draw(st.sampled_from([None, 16, 128, 3, "x"])),
                    b.draw(st.sampled_from([0, 0, 32, 64, 128, 5, None])),
                    b.draw(st.sampled_from(["k", "mn", 3]))))


def _mbarrier(b, k, depth):
    b.keep(k.mbarrier(b.name(), b.arg(), b.draw(st.sampled_from([0, 0, 2, -1, "x", 2**30]))))


def _pipeline(b, k, depth):
    bufs = {n: b.draw(st.sampled_from([(T.f32, [256]), (T.bf16, [8, 64], 128, 128),
                                       (T.f32,), "x", (T.f32, [16], None, 0, "mn"), None]))
            for n in b.draw(st.lists(st.sampled_from(["x", "y", "tile"]), max_size=2,
                                     unique=True))}
    b.keep(k.pipeline(b.name(), b.arg(), **bufs))


def _let(b, k, depth):
    ty = b.draw(st.sampled_from([None, None, *SCALARS, ptxdsl.array(T.f32, 4), "f32"]))
    b.keep(k.let(b.name(), b.arg(), ty))


def _binary(b, k, depth):
    if b.pool:
        x = b.draw(st.sampled_from(b.pool))
        y = b.arg()
        op = b.draw(st.sampled_from(BINOPS))
        b.keep(op(y, x) if b.draw(st.booleans()) else op(x, y))


def _unary(b, k, depth):
    if b.pool:
        x = b.draw(st.sampled_from(b.pool))
        f = b.draw(st.sampled_from([operator.neg, operator.invert, lambda v: v.to(
            b.draw(st.sampled_from(SCALARS + ["f32", None])))]))
        b.keep(f(x))


def _index(b, k, depth):
    if b.pool:
        x = b.draw(st.sampled_from(b.pool))
        idx = b.arg() if b.draw(st.booleans()) else (b.arg(), b.arg())
        if b.draw(st.booleans()):
            b.keep(x[idx])
        else:
            x[idx] = b.arg()


def _member(b, k, depth):
    if b.pool:
        x = b.draw(st.sampled_from(b.pool))
        b.keep(getattr(x, b.draw(st.sampled_from(["x", "tile", "full", "empty", "stage",
                                                   "phase", "nope"]))))


def _op(b, k, depth):
    args = [b.arg() for _ in range(b.draw(st.integers(0, 4)))]
    getattr(k, b.draw(st.sampled_from(OPS)))(*args)


def _func(b, k, depth):
    args = [b.arg() for _ in range(b.draw(st.integers(0, 3)))]
    b.keep(getattr(k, b.draw(st.sampled_from(FUNCS)))(*args))


def _assign(b, k, depth):
    target = b.draw(st.sampled_from(b.pool)) if b.pool and b.draw(st.booleans()) else b.name()
    k.assign(target, b.arg())


def _asm(b, k, depth):
    template = b.draw(st.sampled_from(["mov.u32 {0}, {1};", "{5}", "", 7, "// {0}"]))
    outs = [b.arg() for _ in range(b.draw(st.integers(0, 2)))]
    ins = [b.arg() for _ in range(b.draw(st.integers(0, 2)))]
    k.asm(template, outs, ins)


def _sreg(b, k, depth):
    b.keep(b.draw(st.sampled_from([lambda: k.tid.x, lambda: k.laneid, lambda: k.sreg("ctaid.x"),
                                   lambda: k.sreg(b.name())]))())


def _block(b, k, depth):
    if depth >= 2:
        return
    kind = b.draw(st.sampled_from(["if", "else", "for", "while", "role", "async"]))
    if kind == "if":
        cm = k.if_(b.arg())
    elif kind == "else":
        cm = k.else_()
    elif kind == "for":
        cm = k.for_(b.name(), b.arg(), b.arg(), b.draw(st.sampled_from([None, 1, 2, 0])),
                    unroll=b.draw(st.booleans()))
    elif kind == "while":
        cm = k.while_(b.arg())
    elif kind == "role":
        cm = k.role(b.name(), b.draw(st.sampled_from([0, 1, 2, "x"])),
                    b.draw(st.sampled_from([1, 2, 4, 99])), b.draw(st.sampled_from([None, 240])))
    else:
        cm = k.async_(b.name())
    with cm as v:
        b.keep(v)
        b.body(k, depth + 1)


def _truth(b, k, depth):
    if b.pool:
        bool(b.draw(st.sampled_from(b.pool)))


def _return(b, k, depth):
    k.return_()


STEPS = [_shared, _mbarrier, _pipeline, _let, _let, _binary, _binary, _unary, _index, _index,
         _member, _op, _op, _func, _func, _assign, _asm, _sreg, _block, _block, _block, _return]
STEPS += STEPS[:-1] + [_truth]  # a rare truth test: it ends the build


def checked(what: str, f):
    """f() or None after a located CompileError; anything else is an Escape."""
    try:
        with time_limit(20, what):
            result = f()
    except CompileError as e:
        check_located(e, what)
        STATS[f"api: {what.split()[0]}: error ({stage(e)})"] += 1
        return None
    except Escape:
        raise
    except BaseException:
        raise Escape(f"{what}: internal error\n{traceback.format_exc()}") from None
    STATS[f"api: {what.split()[0]}: ok"] += 1
    return result


@settings(max_examples=examples(60, deep=200), **SETTINGS)
@given(data=st.data())
def test_api_call_sequences_build_or_fail_located(data, tmp_path_factory):
    carried: list = []  # values of the previous kernel, offered to the next one

    def make(name: str):
        def body(k, a: ptxdsl.u32, f: ptxdsl.f32, p: ptxdsl.ptr(ptxdsl.f32),
                 t: ptxdsl.tmap(ptxdsl.f32, 2)):
            b = Build(data, [a, f, p, t, *carried])
            b.body(k, 0)
            carried[:] = b.pool

        threads = data.draw(st.sampled_from([128] * 12 + [(32, 4), 0, 2000, "x", 1.5,
                                                            [1, 2, 3, 4]]))
        return lambda: ptxdsl.api.build_kernel(body, name=name, threads=threads)

    for name in ("first", "second"):
        kernel = checked(f"building kernel {name}", make(name))
        if kernel is not None:
            module = ir.Module(kernels=(kernel,), loc=kernel.loc)
            ptx = checked(f"compiling kernel {name}", lambda m=module: compile_module(m).ptx)
            if ptx is not None and not any(isinstance(s, ir.Asm) for s in ir.walk(kernel.body)):
                assemble(ptx, tmp_path_factory.mktemp("ptx"))
    if carried:  # a value of a finished kernel, used outside any kernel
        stale = data.draw(st.sampled_from(carried))
        assert checked("using a value of a finished kernel", lambda: stale + 1) is None
