"""TMA reductions: every operation/type pair PTX accepts assembles, the rest is a located error;
the interpreter's element-wise semantics; the colsum sample on the CPU (its GPU run is in
test_gpu.py) and reductions from many CTAs into one place on the GPU."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assemble

import ptxdsl
from ptxdsl import ir
from ptxdsl import types as T
from ptxdsl.ops.reduce import CLUSTER_TYPES, GLOBAL_TYPES, combine

_ALL = ("f16", "bf16", "f32", "f64", "u32", "s32", "b32", "u64", "s64", "b64")


def _kernel(stmts: str, elem: str, name: str = "k") -> str:
    return f"""
kernel {name}(g: ptr<{elem}>, m: tmap<{elem}, 2>) threads(32) {{
    shared t: {elem}[16][64] align 128;
    shared c: {elem}[64] align 128;
    mbarrier bar count 1;
    if %tid.x == 0 {{
        mbarrier_init(bar);
        fence_mbarrier_init();
    }}
    cluster_sync();
    if %tid.x == 0 {{
{stmts}
        bulk_commit();
        bulk_wait(0);
    }}
    cluster_sync();
}}
"""


def _every_form(elem: str) -> str:
    lines = []
    for op, types in GLOBAL_TYPES.items():
        if elem in types:
            lines.append(f"        bulk_reduce_{op}(g[0], t);")
            lines.append(f"        tma_reduce_{op}(m, [0, 0], t);")
        if elem in CLUSTER_TYPES[op]:
            lines.append(f"        cluster_reduce_{op}(peer(c, 0), t, peer(bar, 0), 256);")
    return "\n".join(lines)


def test_every_accepted_operation_and_type_assembles(tmp_path):
    kernels = [_kernel(_every_form(e), e, f"k_{e}") for e in _ALL]
    prog = ptxdsl.compile("\n".join(kernels))
    ptx = prog.ptx
    assert ptx.count("cp.reduce.async.bulk.global") == sum(
        e in types for types in GLOBAL_TYPES.values() for e in _ALL)
    assert "bulk_group.add.noftz.bf16" in ptx and "bulk_group.add.noftz.f16" in ptx
    assert "mbarrier::complete_tx::bytes.xor.b32" in ptx
    assemble(ptx, tmp_path)


def test_a_pair_ptx_rejects_is_a_located_error():
    src = _kernel("        bulk_reduce_max(g[0], t);\n"
                  "        cluster_reduce_add(peer(c, 0), t, peer(bar, 0), 256);",
                  "f32")
    with pytest.raises(ptxdsl.CompileError) as e:
        ptxdsl.parse(src, "r.ptxdsl")
    assert e.value.render() == """\
r.ptxdsl:12:31: error: bulk_reduce_max cannot reduce f32 elements; max takes f16, bf16, u32, \
s32, u64, s64
        bulk_reduce_max(g[0], t);
                              ^
r.ptxdsl:13:40: error: cluster_reduce_add cannot reduce f32 elements; add takes u32, s32, u64
        cluster_reduce_add(peer(c, 0), t, peer(bar, 0), 256);
                                       ^
2 errors generated."""


def test_element_types_must_match():
    src = _kernel("        bulk_reduce_add(g[0], t);", "f32").replace("g: ptr<f32>",
                                                                        "g: ptr<u32>")
    with pytest.raises(ptxdsl.CompileError) as e:
        ptxdsl.parse(src, "r.ptxdsl")
    assert "bulk_reduce_add reduces f32 elements into u32 memory; the types must match" in \
        e.value.render()


def test_printer_round_trips_every_form():
    src = _kernel(_every_form("u32"), "u32")
    m = ptxdsl.parse(src)
    assert ptxdsl.parse(ptxdsl.print_module(m)) == m
    kinds = {type(s).__name__ for s in ir.walk(m.kernels[0].body) if isinstance(
        s, (ir.BulkReduce, ir.TensorReduce, ir.ClusterReduce))}
    assert {"BulkReduceInc", "TensorReduceXor", "ClusterReduceMin"} <= kinds


@pytest.mark.parametrize("op", ["add", "min", "max", "inc", "dec", "and", "or", "xor"])
def test_combine_matches_the_ptx_definition(op):
    rng = np.random.default_rng(7)
    a = rng.integers(0, 50, 64, dtype=np.uint32)
    b = rng.integers(0, 50, 64, dtype=np.uint32)
    got = combine(op, T.u32, a.view(np.uint8), b.view(np.uint8)).view(np.uint32)
    want = {
        "add": a + b, "min": np.minimum(a, b), "max": np.maximum(a, b),
        "inc": np.array([0 if x >= y else x + 1 for x, y in zip(a, b, strict=True)]),
        "dec": np.array([y if x == 0 or x > y else x - 1 for x, y in zip(a, b, strict=True)]),
        "and": a & b, "or": a | b, "xor": a ^ b,
    }[op]
    assert (got == want).all()


def test_bf16_add_rounds_to_nearest_even():
    from ptxdsl.runtime.dtypes import bf16_bits_to_f32, f32_to_bf16_bits

    a = f32_to_bf16_bits(np.array([1.0, 3.0, -2.5], np.float32))
    b = f32_to_bf16_bits(np.array([2.0 ** -8, 0.5, 0.25], np.float32))
    got = bf16_bits_to_f32(combine("add", T.bf16, a.view(np.uint8), b.view(np.uint8)
                                   ).view(np.uint16))
    assert got.tolist() == [1.0, 3.5, -2.25]  # 1 + 2^-8 is a tie: rounds to even (1.0)


_MANY = """
kernel many(src: ptr<{t}>, dst: ptr<{t}>) threads(32) {{
    shared part: {t}[64] align 128;
    mbarrier bar count 1;
    if %tid.x == 0 {{
        mbarrier_init(bar);
        fence_mbarrier_init();
    }}
    bar_sync(0);
    if %tid.x == 0 {{
        mbarrier_arrive_expect_tx(bar, sizeof(part));
        bulk_load(part, src[%ctaid.x * 64], bar);
    }}
    mbarrier_wait(bar, 0);
    if %tid.x == 0 {{
        bulk_reduce_{op}(dst[0], part);
        bulk_commit();
        bulk_wait(0);
    }}
}}
"""

_REF = {"add": np.add, "min": np.minimum, "max": np.maximum, "and": np.bitwise_and,
        "or": np.bitwise_or, "xor": np.bitwise_xor}


def _many(op: str, t: str, nctas: int, rng: np.random.Generator):
    src = rng.integers(-1000, 1000, (nctas, 64)).astype(t.replace("s", "int").replace(
        "u", "uint").replace("f", "float"))
    dst = rng.integers(-1000, 1000, 64).astype(src.dtype)
    want = dst.copy()
    for row in src:
        want = _REF[op](want, row)
    return src.reshape(-1), dst, want


@pytest.mark.parametrize("op,t", [("add", "s32"), ("min", "s32"), ("max", "u64"),
                                  ("xor", "u32"), ("add", "f32")])
def test_interpreter_applies_every_ctas_reduction(op, t):
    from ptxdsl.interp import run

    rng = np.random.default_rng(3)
    src, dst, want = _many(op, t, 6, rng)
    k = ptxdsl.parse(_MANY.format(t=t, op=op)).kernels[0]
    run(k, 6, {"src": src, "dst": dst}, seed=5)
    assert np.allclose(dst, want) if t == "f32" else (dst == want).all()


@pytest.mark.gpu
@pytest.mark.parametrize("op,t", [("add", "s32"), ("min", "s32"), ("max", "u64"),
                                  ("xor", "u32"), ("and", "u64"), ("add", "f32")])
def test_gpu_reductions_from_many_ctas_into_one_place(op, t):
    from ptxdsl.runtime import synchronize, to_device

    rng = np.random.default_rng()
    src, dst, want = _many(op, t, 264, rng)
    prog = ptxdsl.compile(_MANY.format(t=t, op=op))
    d_src, d_dst = to_device(src), to_device(dst)
    prog[264](d_src, d_dst)
    synchronize()
    got = d_dst.copy_to_host()
    if t == "f32":
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-2)
    else:
        np.testing.assert_array_equal(got, want)


_CLUSTER_SUM = """
kernel csum(src: ptr<u32>, out: ptr<u32>) threads(64) cluster(4) {
    shared acc: u32[64] align 128;
    shared part: u32[64] align 128;
    mbarrier bar count 1;
    let tid = %tid.x;
    let rank = %cluster_ctarank;
    acc[tid] = 0;
    part[tid] = src[%ctaid.x * 64 + tid];
    fence_proxy_async();
    if tid == 0 {
        mbarrier_init(bar);
        fence_mbarrier_init();
    }
    cluster_sync();
    if rank == 0 && tid == 0 {
        mbarrier_arrive_expect_tx(bar, 4 * sizeof(part));
    }
    if tid == 0 {
        cluster_reduce_add(peer(acc, 0), part, peer(bar, 0));
    }
    if rank == 0 {
        mbarrier_wait(bar, 0);
        out[%clusterid.x * 64 + tid] = acc[tid];
    }
    cluster_sync();
}
"""


def _cluster_sum_data(rng: np.random.Generator):
    src = rng.integers(0, 1 << 32, 8 * 64, dtype=np.uint64).astype(np.uint32)
    want = src.reshape(2, 4, 64).sum(axis=1, dtype=np.uint64).astype(np.uint32)  # wraps
    return src, want.reshape(-1)


def test_cluster_reduce_sums_every_ctas_part_in_the_interpreter():
    from ptxdsl.interp import run

    src, want = _cluster_sum_data(np.random.default_rng(1))
    out = np.zeros(128, np.uint32)
    run(ptxdsl.parse(_CLUSTER_SUM).kernels[0], 8, {"src": src, "out": out}, seed=2)
    assert (out == want).all()


@pytest.mark.gpu
def test_cluster_reduce_sums_every_ctas_part_on_the_gpu():
    from ptxdsl.runtime import synchronize, to_device, zeros

    src, want = _cluster_sum_data(np.random.default_rng())
    d_out = zeros(128, "u32")
    ptxdsl.compile(_CLUSTER_SUM)[8](to_device(src), d_out)
    synchronize()
    np.testing.assert_array_equal(d_out.copy_to_host(), want)
