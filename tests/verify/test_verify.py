"""The static verifier: every broken kernel of tests/broken/ is reported at the line its header
names; every sample and every correct variant below verifies clean.

A corpus file starts with `// expect: <part of the message>` and `// caught-by: verify` (or
`interp`, for bugs a run shows), and marks the reported line with `// <- here` (or gives it as
`// line: N`). An interpreter case that the verifier also decides adds what the verifier says
and where: `// verify: <part of the message>` and `// verify-line: N`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import sample_kernel_defs, sample_names, sample_path

import ptxdsl
from ptxdsl.lower import lower
from ptxdsl.verify import verify_module

BROKEN = Path(__file__).parents[1] / "broken"


@dataclass(frozen=True)
class Case:
    path: Path
    expect: str
    caught_by: str
    line: int
    verify: str = ""  # an interpreter case the verifier also catches: part of its message
    verify_line: int = 0


def read_case(path: Path) -> Case:
    lines = path.read_text().split("\n")
    header: dict[str, str] = {}
    for line in lines:
        m = re.match(r"//\s*([a-z-]+):\s*(.*\S)", line)
        if not line.startswith("//"):
            break
        if m:
            header[m.group(1)] = m.group(2)
    marked = [i + 1 for i, line in enumerate(lines) if line.rstrip().endswith("// <- here")]
    line = int(header["line"]) if "line" in header else (marked[0] if len(marked) == 1 else 0)
    return Case(path, header.get("expect", ""), header.get("caught-by", ""), line,
                header.get("verify", ""), int(header.get("verify-line", "0")))


CASES = [read_case(p) for p in sorted(BROKEN.glob("*.ptxdsl"))]


def verify_text(text: str, name: str = "k.ptxdsl") -> list:
    """Warnings of a kernel that verifies; raises CompileError otherwise."""
    return verify_module(lower(ptxdsl.parse(text, name), checks=False))


def errors_of(text: str, name: str) -> list:
    with pytest.raises(ptxdsl.CompileError) as e:
        verify_text(text, name)
    return [d for d in e.value.diagnostics if d.severity == "error"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.path.stem)
def test_corpus_file_has_a_complete_header(case):
    assert case.expect, f"{case.path.name}: no '// expect:' line"
    assert case.caught_by in ("verify", "interp"), f"{case.path.name}: bad '// caught-by:'"
    assert case.line > 0, f"{case.path.name}: mark one line with '// <- here' or '// line: N'"
    ptxdsl.parse(case.path.read_text(), case.path.name)  # builds: the bug is not a typo


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.caught_by == "verify" or c.verify], ids=lambda c: c.path.stem
)
def test_verifier_catches_broken_kernel(case):
    errors = errors_of(case.path.read_text(), case.path.name)
    found = [(d.span.line if d.span else None, d.message) for d in errors]
    expect, at = (case.verify, case.verify_line) if case.verify else (case.expect, case.line)
    assert any(expect in msg and line == at for line, msg in found), (
        f"expected '{expect}' at line {at}, got {found}"
    )


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.caught_by == "interp" and not c.verify],
    ids=lambda c: c.path.stem
)
def test_interp_only_cases_pass_the_verifier(case):
    # If the verifier learns to catch one of these, its header should say so.
    assert not [
        d for d in verify_text(case.path.read_text(), case.path.name) if d.severity == "error"
    ]


def test_corpus_covers_every_check():
    verified = " ".join(c.expect for c in CASES if c.caught_by == "verify")
    for part in (
        "expects",
        "arrive on",
        "no thread arrives",
        "for parity 0 can never return",
        "before fence_mbarrier_init",
        "before a bar_sync(0)",
        "no fence_proxy_async",
        "comes after the barrier",
        "is rewritten here",
        "when its thread exits",
        "not a multiple of 16",
        "a multiple of 16 bytes",
        "128-byte aligned",
        "at most 256",
        "a CTA has at most",
        "is issued by",
        "always completes on",
        "always fills stage",
        "in every iteration",
        "is written after the last wgmma_fence()",
        "is read here while a wgmma that writes it may still be in flight",
        "hands the stage back to the producer while a wgmma",
        "wgmma_wait(1) before release",
        "while this role holds all 2 stage(s)",
        "thread(s) of warpgroup",
        "which declares no swizzle",
        "a descriptor addresses groups of 8 rows",
        "brings this thread's register arrays to",
        "releases a semaphore before the",
        "without .noftz",
    ):
        assert part in verified, part


@pytest.mark.parametrize("name", sample_names())
def test_sample_verifies_clean(name):
    """No error and no warning: a sample is what a user copies."""
    path = sample_path(name)
    verify_text(path.read_text(), path.name)
    # unlowered, as `ptxdsl check`
    assert verify_module(ptxdsl.parse(path.read_text(), path.name)) == []
    # and the Python twin, whose spans point into Python
    for kd in sample_kernel_defs(name):
        assert verify_module(lower(ptxdsl.ir.Module(kernels=(kd.ir,)), checks=False)) == [], \
            kd.name


# ----------------------------------------------------------------------------- correct code

_RING = """
kernel ring(src: ptr<f32>, out: ptr<f32>, ntiles: u32) threads(384) {
    shared stage: f32[4][512] align 128;
    mbarrier full[4] count 1;
    mbarrier empty[4] count 256;
    let tid = %tid.x;
    if tid == 0 {
        for s in 0 .. 4 {
            mbarrier_init(full[s]);
            mbarrier_init(empty[s]);
        }
        fence_mbarrier_init();
    }
    bar_sync(0);
    if %warp == 0 {
        if %laneid == 0 {
            let phase: u32 = 0;
            for t in 0 .. ntiles {
                let s = t % 4;
                mbarrier_wait(empty[s], phase ^ 1);
                mbarrier_arrive_expect_tx(full[s], sizeof(stage[s]));
                bulk_load(stage[s], src[(%ctaid.x * ntiles + t) * 512], full[s]);
                if s == 3 {
                    phase = phase ^ 1;
                }
            }
        }
    } else if tid >= 128 && tid < 256 {
        let c = (tid - 128) * 4;
        let acc: f32x4 = f32x4(0.0, 0.0, 0.0, 0.0);
        let phase: u32 = 0;
        for t in 0 .. ntiles {
            let s = t % 4;
            mbarrier_wait(full[s], phase);
            let v: f32x4 = vload(stage[s, c], 4);
            acc = f32x4(acc[0] + v[0], acc[1] + v[1], acc[2] + v[2], acc[3] + v[3]);
            mbarrier_arrive(empty[s]);
            if s == 3 {
                phase ^= 1;
            }
        }
        bar_sync(1, 128);
        out[%ctaid.x * 1024 + c] = acc;
    } else if tid >= 256 {
        let c = (tid - 256) * 4;
        let acc: f32x4 = f32x4(0.0, 0.0, 0.0, 0.0);
        for t in 0 .. ntiles {
            let s = t % 4;
            mbarrier_wait(full[s], (t / 4) & 1);
            let v: f32x4 = vload(stage[s, c], 4);
            acc = f32x4(acc[0] * v[0], acc[1] * v[1], acc[2] * v[2], acc[3] * v[3]);
            mbarrier_arrive(empty[s]);
        }
        out[%ctaid.x * 1024 + 512 + c] = acc;
    }
}
"""

_LAGGED_RELEASE = """
kernel lagged(src: ptr<f32>, out: ptr<f32>, ntiles: u32) threads(64) {
    shared stage: f32[2][256] align 128;
    mbarrier full[2] count 1;
    mbarrier empty[2] count 1;
    if %tid.x == 0 {
        mbarrier_init(full[0]);
        mbarrier_init(full[1]);
        mbarrier_init(empty[0]);
        mbarrier_init(empty[1]);
        fence_mbarrier_init();
    }
    bar_sync(0);
    if %warp == 0 {
        if elect() {
            for t in 0 .. ntiles {
                mbarrier_wait(empty[t & 1], ((t >> 1) & 1) ^ 1);
                mbarrier_arrive_expect_tx(full[t & 1], 1024);
                bulk_load(stage[t & 1], src[t * 256], full[t & 1]);
            }
        }
    } else {
        let acc: f32 = 0.0;
        for t in 0 .. ntiles {
            mbarrier_wait(full[t & 1], (t >> 1) & 1);
            acc = acc + stage[t & 1, %laneid];
            if t > 0 && %laneid == 0 {
                mbarrier_arrive(empty[(t - 1) & 1]);
            }
        }
        if ntiles > 0 && %laneid == 0 {
            mbarrier_arrive(empty[(ntiles - 1) & 1]);
        }
        out[%ctaid.x * 32 + %laneid] = acc;
    }
}
"""

_TMA_COPY = """
kernel tma_copy(a: tmap<bf16, 2>, b: tmap<bf16, 2>) threads(128) {
    shared tile: bf16[64][64] align 1024;
    shared second: bf16[64][64] align 1024;
    mbarrier bar count 1;
    let tid = %tid.x;
    let x = (%ctaid.x * 64) as s32;
    let y = (%ctaid.y * 128) as s32;
    if tid == 0 {
        tma_prefetch_desc(a);
        mbarrier_init(bar);
        fence_mbarrier_init();
    }
    bar_sync(0);
    if tid == 0 {
        mbarrier_arrive_expect_tx(bar, sizeof(tile) + sizeof(second));
        tma_load(tile, a, [x, y], bar);
        tma_load(second, a, [x, y + 64], bar);
    }
    mbarrier_wait(bar, 0);
    for i in 0 .. 32 {
        let r = i * 2 + tid / 64;
        tile[r, tid % 64] = tile[r, tid % 64] + second[r, tid % 64];
    }
    fence_proxy_async();
    bar_sync(0);
    if tid == 0 {
        tma_store(b, [x, y], tile);
        bulk_commit();
        bulk_wait_read(0);
        mbarrier_inval(bar);
    }
}
"""

_DOUBLE_BUFFERED_STORES = """
kernel epilogue(dst: ptr<f32>, ntiles: u32) threads(128) {
    shared out: f32[2][512] align 128;
    let tid = %tid.x;
    for t in 0 .. ntiles {
        let b = t & 1;
        if tid == 0 {
            bulk_wait_read(1);
        }
        bar_sync(0);
        out[b, tid * 4] = f32x4(1.0, 2.0, 3.0, 4.0);
        fence_proxy_async();
        bar_sync(0);
        if tid == 0 {
            bulk_store(dst[(%ctaid.x * ntiles + t) * 512], out[b]);
            bulk_commit();
        }
    }
    if tid == 0 {
        bulk_wait_read(0);
    }
}
"""

_EARLY_RETURN_2D = """
kernel early(src: ptr<f32>, dst: ptr<f32>) threads(32, 2) {
    shared tile: f32[256] align 128;
    mbarrier bar count 4;
    let leader = %tid.x == 0 && %tid.y == 0;
    if leader {
        mbarrier_init(bar);
        fence_mbarrier_init();
    }
    bar_sync(0);
    if %tid.y == 1 {
        return;
    }
    if elect() {
        mbarrier_arrive_expect_tx(bar, sizeof(tile));
        bulk_load(tile, src[%ctaid.x * 256], bar);
        mbarrier_arrive(bar, 3);
    }
    mbarrier_wait(bar, 0);
    dst[%ctaid.x * 32 + %laneid] = tile[%laneid * 8];
}
"""

_WHILE_LOOP = """
kernel chunks(src: ptr<f32>, dst: ptr<f32>, n: u32) threads(128) {
    shared tile: f32[4096] align 128;
    mbarrier bar count 1;
    let tid = %tid.x;
    if tid == 0 {
        mbarrier_init(bar);
        fence_mbarrier_init();
    }
    bar_sync(0);
    let k: u32 = 0;
    let phase: u32 = 0;
    while k < n {
        if tid == 0 {
            mbarrier_arrive_expect_tx(bar, (n - n + 1) * 16384);
            bulk_load(tile, src[k * 4096], bar, 16384);
        }
        mbarrier_wait(bar, phase);
        phase = phase ^ 1;
        for i in 0 .. 32 {
            dst[k * 4096 + i * 128 + tid] = tile[i * 128 + tid];
        }
        bar_sync(0);
        k = k + 1;
    }
}
"""

CORRECT = {
    "ring": _RING,
    "lagged_release": _LAGGED_RELEASE,
    "tma_copy": _TMA_COPY,
    "double_buffered_stores": _DOUBLE_BUFFERED_STORES,
    "early_return_2d": _EARLY_RETURN_2D,
    "while_loop": _WHILE_LOOP,
}


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_correct_variant_verifies_without_diagnostics(name):
    assert verify_text(CORRECT[name], f"{name}.ptxdsl") == []


# ----------------------------------------------------------------------------- warnings


def test_unprovable_alignment_is_a_warning_not_an_error():
    src = """
kernel k(src: ptr<f32>, off: u32) threads(32) {
    shared tile: f32[1024] align 128;
    mbarrier bar count 1;
    if %laneid == 0 {
        mbarrier_init(bar);
        fence_mbarrier_init();
    }
    bar_sync(0);
    if %laneid == 0 {
        mbarrier_arrive_expect_tx(bar, 4096);
        bulk_load(tile, src[off], bar);
    }
    mbarrier_wait(bar, 0);
}
"""
    warnings = verify_text(src, "k.ptxdsl")
    assert [d.message for d in warnings] == [
        "cannot prove 16-byte alignment of bulk_load's global address 'src[off]' (its offset "
        "from 'src' is a multiple of 4 bytes)"
    ]
    assert warnings[0].span.line == 12


# The CUDA guide's 2D tile kernel: a 128-byte aligned tile, a tensor map without swizzle.
TILE_2D = """
kernel tile_2d(map: tmap<s32, 2>, x: s32, y: s32) threads(64) {
    shared smem: s32[64][64] align 128;
    mbarrier bar count 64;
    let tid = %tid.x;
    if tid == 0 {
        mbarrier_init(bar);
        fence_mbarrier_init();
    }
    bar_sync(0);
    if tid == 0 {
        tma_load(smem, map, [x, y], bar);
        mbarrier_arrive_expect_tx(bar, sizeof(smem));
    } else {
        mbarrier_arrive(bar);
    }
    mbarrier_wait(bar, 0);
    smem[0, tid] = smem[0, tid] + tid as s32;
    fence_proxy_async();
    bar_sync(0);
    if tid == 0 {
        tma_store(map, [x, y], smem);
        bulk_commit();
        bulk_wait_read(0);
        mbarrier_inval(bar);
    }
}
"""


def test_unswizzled_tma_tile_aligned_to_128_has_no_swizzle_warning():
    """Which swizzle a tensor map has is known only at launch, which checks it (test_runtime_
    cpu.py); nothing is said here about a tile that declares none."""
    assert verify_text(TILE_2D, "tile_2d.ptxdsl") == []


def test_swizzle_alignment_is_a_warning_once_per_buffer():
    """A declared swizzle needs its tiles aligned to the pattern (1024 bytes for 128B): a view
    that may start 512 bytes in is warned about once."""
    src = """
kernel k(a: tmap<bf16, 2>, q: u32) threads(32) {
    shared tile: bf16[64][64] align 1024 swizzle 128;
    mbarrier bar count 1;
    if %laneid == 0 {
        mbarrier_init(bar);
        fence_mbarrier_init();
    }
    bar_sync(0);
    if %laneid == 0 {
        mbarrier_arrive_expect_tx(bar, 256);
        tma_load(tile[q * 4], a, [0, 0], bar);
        tma_load(tile[q * 4 + 8], a, [0, 8], bar);
    }
    mbarrier_wait(bar, 0);
}
"""
    warnings = verify_text(src, "k.ptxdsl")
    assert [d.message for d in warnings] == [
        "tma_load's shared operand 'tile[q * 4]' is 512-byte aligned; 'tile' declares swizzle "
        "128, whose tensor map needs 1024-byte aligned tiles"]
    assert warnings[0].severity == "warning" and warnings[0].span.line == 12


# ----------------------------------------------------------------------------- all at once


def test_every_problem_of_a_kernel_is_reported_together():
    src = """
kernel k(src: ptr<f32>, dst: ptr<f32>) threads(128) {
    shared tile: f32[1024] align 128;
    mbarrier bar count 2;
    mbarrier never count 1;
    if %tid.x == 0 {
        mbarrier_init(bar);
        mbarrier_init(never);
        fence_mbarrier_init();
    }
    bar_sync(0);
    if %tid.x == 0 {
        mbarrier_arrive_expect_tx(bar, 1024);
        bulk_load(tile, src[0], bar);
    }
    mbarrier_wait(bar, 0);
    mbarrier_wait(never, 0);
    tile[%tid.x] = 1.0;
    bulk_store(dst[0], tile);
}
"""
    errors = errors_of(src, "k.ptxdsl")
    messages = "\n".join(d.message for d in errors)
    for part in (
        "expects 1024 bytes",
        "arrive on 'bar' here in each phase, but its arrival count is 2",
        "'never' can never return",
        "issued by 128 threads",
        "no fence_proxy_async",
        "thread exits",
    ):
        assert part in messages, part


def test_init_with_neither_fence_nor_barrier_names_both():
    src = """
kernel k(src: ptr<f32>) threads(64) {
    shared tile: f32[256] align 128;
    mbarrier bar count 1;
    if %tid.x == 0 {
        mbarrier_init(bar);
        mbarrier_arrive_expect_tx(bar, 1024);
        bulk_load(tile, src[0], bar);
    }
    mbarrier_wait(bar, 0);
}
"""
    copy, wait = errors_of(src, "k.ptxdsl")
    assert (copy.span.line, copy.message) == (
        8,
        "mbarrier 'bar' is used here before fence_mbarrier_init() publishes its initialisation",
    )
    assert (wait.span.line, wait.message) == (
        10,
        "mbarrier 'bar' is used here by other threads before fence_mbarrier_init() and a "
        "bar_sync(0) publish its initialisation",
    )
    assert wait.notes[0].span.line == 6


# ----------------------------------------------------------------------------- goldens


def _render(name: str) -> str:
    path = BROKEN / f"{name}.ptxdsl"
    with pytest.raises(ptxdsl.CompileError) as e:
        verify_text(path.read_text(), path.name)
    return e.value.render()


def test_golden_deadlock_on_fresh_barrier():
    assert (
        _render("producer_wrong_parity")
        == """\
producer_wrong_parity.ptxdsl:26:17: error: mbarrier_wait on 'empty[0]' for parity 0 can never \
return: every arrival on 'empty' comes after this wait; a fresh mbarrier passes a parity-1 \
wait at once, so a producer waiting for free stages starts at parity 1 ('^ 1')
                mbarrier_wait(empty[s], (t >> 1) & 1);  // <- here
                ^~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
producer_wrong_parity.ptxdsl:39:13: note: mbarrier_arrive arrives on 'empty' here, but only \
after that wait returns
            mbarrier_arrive(empty[s]);
            ^~~~~~~~~~~~~~~~~~~~~~~~~"""
    )


def test_golden_arrival_count():
    assert (
        _render("arrival_count_mismatch")
        == """\
arrival_count_mismatch.ptxdsl:39:17: error: 4 thread(s) arrive on 'empty[s]' here in each \
phase, but its arrival count is 128
                mbarrier_arrive(empty[s]);  // <- here
                ^~~~~~~~~~~~~~~~~~~~~~~~~
arrival_count_mismatch.ptxdsl:8:5: note: 'empty' is declared here with count 128
    mbarrier empty[2] count 128;
    ^~~~~~~~~~~~~~~~~~~~~~~~~~~~"""
    )


def test_golden_fence_after_barrier():
    assert (
        _render("fence_after_barrier")
        == """\
fence_after_barrier.ptxdsl:30:9: error: bulk_store reads 'tile', but the writers' \
fence_proxy_async() comes after the barrier that orders them with this store
        bulk_store(dst[chunk], tile);  // <- here
        ^~~~~~~~~~~~~~~~~~~~~~~~~~~~
fence_after_barrier.ptxdsl:25:9: note: 'tile[j]' is written here
        tile[j] = f32x4(v[0] * 2.0, v[1] * 2.0, v[2] * 2.0, v[3] * 2.0);
        ^~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
fence_after_barrier.ptxdsl:28:5: note: fenced here: move the fence before the barrier
    fence_proxy_async();
    ^~~~~~~~~~~~~~~~~~~"""
    )


BUDGET = """
kernel budget(out: ptr<f32>) threads(128) {
    let s: f32[64];
    let p: bf16[64];
    let pn: bf16[64];
    let acc: f32[ACC];
    for x in 0 .. 64 unroll {
        s[x] = 1.0;
        p[x] = s[x] as bf16;
        pn[x] = p[x];
    }
    for x in 0 .. ACC unroll {
        acc[x] = pn[x % 64] as f32;
    }
    out[%tid.x] = acc[0] + s[1];
}
"""


@pytest.mark.parametrize("acc, fits", [(50, True), (70, False)])
def test_register_budget_counts_bf16_arrays_a_register_per_element(acc, fits):
    """Arrays no wgmma reads as A fragments keep a 16-bit register per element: s (64) + two
    bf16[64] (64 each) + acc + 8 reserved against 255: 50 fits (250), 70 does not (270)."""
    text = BUDGET.replace("ACC", str(acc))
    if fits:
        assert verify_text(text) == []
    else:
        (err,) = errors_of(text, "budget.ptxdsl")
        assert "brings this thread's register arrays to 262 registers" in err.message, err


def test_register_budget_counts_fragment_arrays_two_to_a_register(tmp_path):
    """Attention on three warpgroups has 160 registers a consumer: s (64) + p (bf16[64], the
    A fragments, packed: 32) + acc (32) + 6 + 8 reserved = 142 fits (a register per element
    of p would make 174 and reject it), and ptxas (a whole-program build, as the driver JIT
    makes) spills nothing."""
    from conftest import assemble, assert_no_spills, sample_module

    kd = sample_module("attention").make_attention(64, nwg=3)
    assert ptxdsl.ir.fragment_arrays(kd.ir.body) == {"p"}
    assert_no_spills(assemble(kd.ptx(), tmp_path))


def test_register_element_index_past_the_array_in_an_unrolled_iteration():
    """An element index of unrolled loop variables is decided for every iteration (codegen
    would refuse it in the one it emits; the interpreter reports it where it runs)."""
    text = """kernel k(out: ptr<f32>) threads(32) {
    let acc: f32[8] = 1.0;
    for j in 0 .. 4 unroll {
        for i in 0 .. 2 unroll {
            acc[4 * j + i] = 2.0;
        }
    }
    out[%tid.x] = acc[0];
}
"""
    [err] = errors_of(text, "k.ptxdsl")
    assert err.span.line == 5 and err.message == (
        "element index 4 * j + i of 'acc' (f32[8]) is 8 in the unrolled iteration j = 2, "
        "i = 0, out of range [0, 8)"), err.message
    assert verify_text(text.replace("0 .. 4 unroll", "0 .. 2 unroll")) == []
    with pytest.raises(ptxdsl.interp.InterpError) as e:
        ptxdsl.interp.run(ptxdsl.parse(text, "k.ptxdsl").kernels[0], 1,
                          {"out": np.zeros(32, np.float32)})
    assert "k.ptxdsl:5:" in str(e.value) and "element index 8 is out of range [0, 8)" in \
        str(e.value), str(e.value)


def test_release_by_some_threads_of_another_release_is_located():
    """Releases by other threads add up on a stage's empty barrier, by the same threads they
    arrive once; one whose threads are part of another's has no derivable count."""
    text = (Path(__file__).parents[1] / "decided" / "valid" /
            "pipeline_shared_by_two_roles.ptxdsl").read_text()
    text = text.replace("""            acc += ring.tile[c];
            release(ring);
""", """            acc += ring.tile[c];
            release(ring);
            if %warp == 1 {
                wait(ring);
                release(ring);
            }
""")
    errors = errors_of(text, "k.ptxdsl")
    assert [(e.span.line, e.message) for e in errors] == [(26, (
        "this release(ring) is run by some threads of another release(ring) and not by "
        "others, so the arrivals on a stage cannot be derived; release with the same threads, "
        "or with threads of their own"))]
    assert errors[0].notes[0].span.line == 23


@pytest.mark.parametrize("guard, verdict", [
    ("%warp == first", "error"),  # holds in one warp at most
    ("elect()", "error"),  # one thread a warp
    ("%tid.x < first", "warning"),  # whole warpgroups only if first is a multiple of 128
    ("src[%tid.x] > 0.0", "warning"),  # data
    ("%warp / 4 == first % 2", None),  # the warpgroup
    ("first > 2", None),  # the same in every thread
])
def test_wgmma_guard_is_decided_warpgroup_uniform(guard, verdict):
    text = (Path(__file__).parents[1] / "decided" / "valid" /
            "wgmma_per_warpgroup_guard.ptxdsl").read_text()
    text = text.replace("if %warp / 4 == first % 2 {", f"if {guard} {{")
    try:
        found = verify_text(text)
    except ptxdsl.CompileError as e:
        found = e.diagnostics
    wgmma = [d for d in found if d.message.startswith("wgmma is ")]
    assert [d.severity for d in wgmma] == ([verdict] if verdict else []), \
        [d.render() for d in found]


def test_fp8_conversion_for_sm80_is_reported_by_check_as_compile_would():
    """Issue 44: `check --arch sm_80` accepted an fp8 conversion that `compile` refused."""
    text = ("kernel to_fp8(src: ptr<f32>, dst: ptr<e4m3>) threads(32) {\n"
            "    dst[%tid.x] = src[%tid.x] as e4m3;\n}\n")
    message = ("converting f32 to e4m3 needs sm_89 or later (cvt of fp8 pairs); the module is "
               "compiled for sm_80")
    for run in (lambda m: lower(m, "sm_80"), lambda m: ptxdsl.compile_module(m, "sm_80")):
        with pytest.raises(ptxdsl.CompileError) as e:
            run(ptxdsl.parse(text, "k.ptxdsl"))
        assert [(d.span.line, d.message) for d in e.value.diagnostics] == [(2, message)]
    assert lower(ptxdsl.parse(text, "k.ptxdsl")) is not None  # sm_90 converts
