"""Tile schedules (`schedule work tiles(...) ...;` and `for w in work`): every (tile, K step)
is visited exactly once over any grid, a tile's splits are numbered 0 .. splits - 1, the
Python API builds the same IR, the desugared code prints and parses back, and mistakes get
located messages."""

import textwrap

import numpy as np
import pytest
from conftest import sample_module
from fuzzing import DEEP, examples

import ptxdsl
from ptxdsl import ptr, u32
from ptxdsl.interp import run, run_sample
from ptxdsl.tools.runner import compare

COVER = """\
kernel cover(hits: ptr<u32>, info: ptr<u32>, order: ptr<u32>, tm: u32, tn: u32, kt: u32,
             s: u32) threads(32) {{
    schedule work tiles(tm, tn) {clauses};
    if %tid.x == 0 {{
        for w in work {{
            let t = w.m * tn + w.n;
            for k in w.k0 .. w.k1 {{
                hits[t * kt + k] += 1;
            }}
            info[t * 64 + w.split] = w.splits * 2 + select(w.whole, 1, 0);
            if w.split == 0 {{
                order[t] = w.tile + 1;  // once a tile: its splits run in different CTAs
            }}
        }}
    }}
}}
"""

MODES = {"dense": "ksteps(kt)", "dense-grouped": "group(3) ksteps(kt)",
         "splits": "ksteps(kt) splits(s)", "splits-grouped": "group(2) ksteps(kt) splits(s)",
         "streamk": "ksteps(kt) streamk", "streamk-grouped": "group(2) ksteps(kt) streamk"}


def covered(clauses: str, tm: int, tn: int, kt: int, s: int, grid: int, seed: int = 0) -> None:
    """Run the cover kernel and check what every schedule promises."""
    k = ptxdsl.parse(COVER.format(clauses=clauses), "cover.ptxdsl").kernel()
    tiles = tm * tn
    hits, info = np.zeros(tiles * kt, np.uint32), np.zeros(tiles * 64, np.uint32)
    order = np.zeros(tiles, np.uint32)
    run(k, grid, {"hits": hits, "info": info, "order": order, "tm": tm, "tn": tn, "kt": kt,
                  "s": s}, seed=seed)
    assert (hits == 1).all(), f"(tile, K step) visits:\n{hits.reshape(tiles, kt)}"
    assert sorted(order) == list(range(1, tiles + 1)), "w.tile numbers the tiles once each"
    for t in range(tiles):
        row = info[t * 64:(t + 1) * 64]
        n = int(row[0] // 2)
        assert n >= 1 and list(row[:n] // 2) == [n] * n and not row[n:].any(), \
            f"tile {t}: splits 0 .. {n - 1} each once, all saying splits = {n}: {row[:n + 2]}"
        assert all(r % 2 == (n == 1) for r in row[:n]), "whole is splits == 1"
        if "splits" in clauses:
            assert n == min(s, kt)
        if "splits" not in clauses and "streamk" not in clauses:
            assert n == 1


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tm,tn,kt,s,grid", [
    (5, 3, 7, 3, 4),     # a partial last wave
    (4, 3, 5, 4, 6),     # waves come out even: stream-K is all whole tiles
    (2, 2, 3, 5, 9),     # more workers than tiles, more splits than K steps
    (7, 2, 4, 2, 5),     # group(3) leaves a short last band
])
def test_every_tile_and_k_step_is_visited_once(mode, tm, tn, kt, s, grid):
    covered(MODES[mode], tm, tn, kt, s, grid)


def test_streamk_with_fewer_k_steps_than_workers():
    covered(MODES["streamk"], 2, 1, 3, 1, 16)  # 6 shared K steps over 16 CTAs


@pytest.mark.parametrize("case", range(40 if DEEP else 3))
def test_random_shapes(case):
    rng = np.random.default_rng(case)
    tm, tn, kt = (int(x) for x in rng.integers(1, 8, 3))
    covered(list(MODES.values())[case % len(MODES)], tm, tn, kt, int(rng.integers(1, 9)),
            int(rng.integers(1, 20)), seed=case)


def test_streamk_balances_k_steps():
    """Every CTA gets the same number of K steps, to within one (132 CTAs, 3 x 132 + 1 tiles
    of 4 K steps); split-K of the same shape leaves a CTA four steps over another."""
    steps = {}
    for clauses in ("ksteps(kt) streamk", "ksteps(kt) splits(s)"):
        src = COVER.format(clauses=clauses).replace(
            "hits[t * kt + k] += 1;", "hits[t * kt + k] += 1;\n perf[%ctaid.x] += 1;").replace(
            "order: ptr<u32>,", "order: ptr<u32>, perf: ptr<u32>,")
        k = ptxdsl.parse(src, "cover.ptxdsl").kernel()
        tm, tn, kt, grid = 397, 1, 4, 132
        hits, perf = np.zeros(tm * kt, np.uint32), np.zeros(grid, np.uint32)
        run(k, grid, {"hits": hits, "info": np.zeros(tm * 64, np.uint32), "perf": perf,
                      "order": np.zeros(tm, np.uint32), "tm": tm, "tn": tn, "kt": kt, "s": 1})
        assert (hits == 1).all()
        steps[clauses] = perf
    assert steps["ksteps(kt) streamk"].sum() == 397 * 4
    assert np.ptp(steps["ksteps(kt) streamk"]) <= 1, steps["ksteps(kt) streamk"]
    assert np.ptp(steps["ksteps(kt) splits(s)"]) == 4  # 3 or 4 whole tiles a CTA


def twin(mode: str):
    @ptxdsl.kernel(threads=32, name="cover")
    def cover(k, hits: ptr(u32), info: ptr(u32), order: ptr(u32), tm: u32, tn: u32, kt: u32,
              s: u32):
        work = k.schedule("work", (tm, tn), group=2, ksteps=kt,
                          splits=s if mode == "splits" else None, streamk=mode == "streamk")
        with k.if_(k.tid.x == 0):
            with k.for_("w", work) as w:
                t = k.let("t", w.m * tn + w.n)
                with k.for_("k", w.k0, w.k1) as kk:
                    hits[t * kt + kk] = hits[t * kt + kk] + 1
                info[t * 64 + w.split] = w.splits * 2 + k.select(w.whole, 1, 0)
                with k.if_(w.split == 0):
                    order[t] = w.tile + 1
    return cover


@pytest.mark.parametrize("mode", ["splits", "streamk"])
def test_python_api_builds_the_same_ir_and_it_prints_back(mode):
    text = ptxdsl.parse(COVER.format(clauses=MODES[f"{mode}-grouped"]), "c.ptxdsl").kernel()
    assert twin(mode).ir == text
    printed = ptxdsl.print_kernel(text)
    assert "let w_m: u32" in printed and ("for w in" in printed) == (mode == "splits")
    assert ptxdsl.parse(printed).kernels[0] == text


@pytest.mark.parametrize("clauses", ["tiles(tm, 2) ksteps(4) streamk",
                                     "tiles(2) groups(out, tm, 128)"])
def test_two_walks_of_one_schedule_in_one_block(clauses):
    """Each walk keeps its own state (w_it, then w2_it); the result prints back."""
    m = ptxdsl.parse(f"""kernel k(tm: u32, out: ptr<u32>) threads(32) {{
        schedule work {clauses};
        for w in work {{ out[w.tile] = 1; }}
        for w in work {{ out[w.tile] = 2; }}
    }}""", "two.ptxdsl")
    text = ptxdsl.print_module(m)
    state = "_it" if "streamk" in clauses else "_grp"
    assert f"let w{state}: u32" in text and f"let w2{state}: u32" in text
    assert ptxdsl.parse(text) == m


def test_clusters_walk_by_cluster():
    text = ptxdsl.print_module(ptxdsl.parse("""kernel k(out: ptr<u32>) threads(32) cluster(2) {
        schedule work tiles(4, 2) clusters;
        for w in work { out[w.tile * 2 + %cluster_ctarank] = w.m; }
    }"""))
    assert "for w in %clusterid.x .. work_tiles step %nclusterid.x" in text


def test_stream_k_host_arithmetic_matches_the_schedule():
    """The stream-K arithmetic of ptxdsl.runtime.occupancy (what a launch sizes its workspace
    by: the shared tiles and the most parts a tile is cut into) agrees with the schedule's
    walk run in the interpreter, and gemm_splitk.max_splits is that count."""
    from ptxdsl.runtime.occupancy import streamk_parts, streamk_shared

    mod = sample_module("gemm_splitk")
    k = ptxdsl.parse(COVER.format(clauses="ksteps(kt) streamk"), "cover.ptxdsl").kernel()
    for tm, tn, kt, grid in [(1, 2, 3, 5), (3, 1, 16, 7), (13, 1, 2, 6), (4, 2, 5, 3),
                             (2, 3, 4, 3)]:  # the last: even waves, nothing shared
        tiles = tm * tn
        info = np.zeros(tiles * 64, np.uint32)
        order = np.zeros(tiles, np.uint32)
        run(k, grid, {"hits": np.zeros(tiles * kt, np.uint32), "info": info, "order": order,
                      "tm": tm, "tn": tn, "kt": kt, "s": 1})
        assert int(info.max() // 2) == streamk_parts(tiles, kt, grid)
        assert streamk_parts(tiles, kt, grid) == mod.max_splits(tm * 128, tn * 256, kt * 64,
                                                                 grid)
        cut = [t for t in range(tiles) if info[t * 64] % 2 == 0]  # not whole
        assert all(order[t] - 1 < streamk_shared(tiles, grid) for t in cut), (cut, order)
        assert (tiles % grid == 0) == (streamk_shared(tiles, grid) == 0)


def test_only_the_fields_read_are_computed():
    src = """kernel k(out: ptr<u32>, tm: u32) threads(32) {
        schedule work tiles(tm, 4);
        for w in work { out[w.tile] = w.n; }
    }"""
    printed = ptxdsl.print_module(ptxdsl.parse(src))
    assert "let w_n: u32 = w / tm;" in printed
    assert "w_m" not in printed and "w_k0" not in printed


def errors_of(body: str, params: str = "tm: u32, out: ptr<u32>") -> str:
    with pytest.raises(ptxdsl.CompileError) as e:
        ptxdsl.parse(textwrap.dedent(f"kernel k({params}) threads(32) {{\n{body}\n}}"),
                     "bad.ptxdsl")
    return str(e.value)


@pytest.mark.parametrize("body,message", [
    ("schedule work tiles(tm, 2) split(4);",
     "unknown schedule clause 'split'; did you mean 'splits'?"),
    ("schedule work group(8);", "schedule 'work' needs tiles(TM, TN)"),
    ("schedule work tiles(tm, 2) splits(4);", "so it needs ksteps(KT)"),
    ("schedule work tiles(tm, 2) ksteps(3) splits(2) streamk;", "splits(S) or streamk, not both"),
    ("schedule work tiles(tm, 2) group(0);", "group(G) takes a positive number"),
    ("schedule work tiles(tm, 2) group(tm);", "a schedule's group must be known at compile time"),
    ("schedule work tiles(tm, 2) ksteps(4) splits(0);", "splits(S) takes at least one range"),
    ("schedule work tiles(tm, 2);\nlet x = work;", "'work' is a schedule, not a value"),
    ("schedule work tiles(tm, 2);\nfor w in work { out[0] = w + 1; }",
     "'w' is a work item, not a value: read its fields"),
    ("schedule work tiles(tm, 2);\nfor tm in work { }", "'tm' is already declared"),
    ("schedule work tiles(tm, 2) ksteps(4) streamk;\nfor w in work { w_next = 0; }",
     "cannot assign to 'w_next': 'w_next' is the state of the walk 'for w in work'"),
    ("schedule work tiles(tm, 2) ksteps(4) streamk;\nwork_sk = 4;",
     "cannot assign to 'work_sk': 'work_sk' is derived by schedule 'work'"),
    ("schedule work tiles(tm) ;", "tiles(TM, TN) takes the tile-rows and the tile-columns"),
    ("schedule work tiles(tm, 2) groups(out, 4, 128);", "tiles(TN) takes the tile-columns alone"),
    ("schedule work tiles(2) groups(out, 4, 128) ksteps(4) splits(2);",
     "groups(...) walks whole tiles"),
    ("schedule work tiles(2) groups(tm, 4, 128);", "as a ptr<u32>, got u32"),
    ("schedule work tiles(tm, 2);\nfor w in work { out[0] = w.rows; }",
     "w.rows is a field of a grouped schedule"),
    ("schedule work tiles(tm, 2) streamk(1) ksteps(2);", "'streamk' takes no values"),
    ("schedule work tiles(tm, 2);\nfor w in work { out[0] = w.k1; }",
     "w.k1 is the end of the item's K steps, which schedule 'work' does not know"),
    ("schedule work tiles(tm, 2);\nfor w in work { out[0] = w.spilt; }",
     "a work item has no field 'spilt'; did you mean 'split'?"),
    ("schedule work tiles(tm, 2);\nfor w in work { out[0] = w; }", "work item"),
    ("schedule work tiles(tm, 2);\nfor w in work { let w_m = 1; }", "'w_m' is already declared"),
    ("schedule work tiles(tm, 2);\nfor w in work { out[0] = w_m; }",
     "'w_m' is reserved by the work loop: write w.m"),
    ("let w_n = 0;\nschedule work tiles(tm, 2);\nfor w in work { out[0] = 1; }",
     "'w_n' is already declared; rename it or the loop variable"),
    ("for w in tm { }", "walks a schedule, and X is a value of type u32"),
    ("schedule work tiles(tm, 2);\nout[0] = work.tiles;", "is walked with 'for w in work"),
])
def test_mistakes_are_located(body, message):
    text = errors_of(body)
    assert message in text and "bad.ptxdsl:" in text, text


@pytest.mark.parametrize("ordered", [1, 0] if DEEP else [1])
def test_streamk_gemm_in_the_interpreter(ordered):
    """make_splitk(streamk=True): one tile's 4 K steps shared by 3 CTAs (1, 1 and 2 steps);
    the partials meet in the workspace, the last range finishes, and everything is left at
    zero. Seed 2 starts the CTAs out of order: a deterministic range waits for the ones
    before it. (The unordered sum's counting is the split-K sample's, run in test_interp and
    test_inflight; here under PTXDSL_DEEP.)"""
    mod = sample_module("gemm_splitk")
    ex = mod.example(np.random.default_rng(3), m=128, n=256, k=256, ordered=ordered,
                     streamk=True, grid=3)
    out = run_sample(mod.make_splitk(streamk=True).ir, ex, seed=2 * ordered)
    for name, want in ex["expected"].items():
        r = compare(name, out[name], want, None if name != "c" else ptxdsl.bf16, ex["rtol"],
                    ex["atol"])
        assert r.ok, f"{name}: {r.detail}"


def test_two_kernel_splitk_in_the_interpreter():
    """make_splitk(slots=True) then make_splitk_reduce: one CTA walks a tile's 2 uneven
    ranges (1 and 2 K steps), storing each partial into its slot (a ragged M clipped by the
    3-D tensor map per slot), and the second kernel sums the slots into bf16 C."""
    mod = sample_module("gemm_splitk")
    from ptxdsl.interp import TensorMapModel
    from ptxdsl.runtime.dtypes import bf16_to_f32, f32_to_bf16

    m, n, k = 72, 256, 192
    rng = np.random.default_rng(4)
    a = f32_to_bf16(rng.standard_normal((m, k), np.float32))
    b = f32_to_bf16(rng.standard_normal((n, k), np.float32))
    ws, c = np.zeros((2, m, n), np.float32), np.zeros((m, n), np.uint16)
    sw = {"swizzle": "128B"}
    run(mod.make_splitk(slots=True).ir, 1, {
        "a": TensorMapModel(a, dtype=ptxdsl.bf16, box=(128, 64), **sw),
        "b": TensorMapModel(b, dtype=ptxdsl.bf16, box=(256, 64), **sw),
        "ws": TensorMapModel(ws, dtype=ptxdsl.f32, box=(1, 64, 32), **sw), "wsp": ws, "c": c,
        "sem": np.zeros(4, np.uint32), "m": m, "n": n, "kdim": k, "splits": 2, "ordered": 1})
    run(mod.make_splitk_reduce().ir, -(-m * n // 1024),
        {"ws": ws, "c": c, "total": m * n, "slots": 2})
    ref = bf16_to_f32(a) @ bf16_to_f32(b).T
    r = compare("c", c, ref, ptxdsl.bf16, 2 ** -7, 2 ** -7 * np.sqrt(k) * 4)
    assert r.ok, r.detail


WHILE_PRODUCER = """\
kernel k(src: ptr<f32>, out: ptr<f32>, n: u32) threads(64) {
    pipeline ring stages 2 { buf: f32[32] align 128; }
    role producer warps 0 .. 1 {
        if elect() {
            let item = 0;
            while item < n {
                for i in 0 .. 3 {
                    acquire(ring);
                    bulk_load(ring.buf, src[(item * 3 + i) * 32]);
                    commit(ring);
                }
                item += 1;
            }
        }
    }
    role consumer warps 1 .. 2 {
        for j in 0 .. n * 3 {
            wait(ring);
            out[j * 32 + %laneid] = ring.buf[%laneid];
            release(ring);
        }
    }
}
"""


def test_producer_tail_follows_an_outer_while_loop():
    """The producer tail (wait for every stage's release before exiting) goes after the
    outermost loop that commits, a `while` here (the stream-K walk): after the inner `for`
    it would drain the ring between items and deadlock."""
    k = ptxdsl.parse(WHILE_PRODUCER, "while.ptxdsl").kernel()
    src = np.random.default_rng(0).standard_normal(32 * 12).astype(np.float32)
    out = np.zeros_like(src)
    run(k, 1, {"src": src, "out": out, "n": 4})
    assert np.array_equal(out, src)


def walk(k, sched):
    with k.for_("w", sched):
        pass


def stale(k, out, tm):
    work = k.schedule("work", (tm, 2))
    with k.for_("w", work) as w:
        pass
    out[0] = w.m


def unrolled(k, out, tm):
    work = k.schedule("work", (tm, 2))
    with k.for_("w", work, unroll=True):
        pass


@pytest.mark.parametrize("body, message", [
    (lambda k, out, tm: k.schedule("work", 5), "tiles is (tile-rows, tile-columns)"),
    (lambda k, out, tm: k.schedule("work", (2,), groups=(tm, 4, 128)),
     "as a ptr<u32>, got u32"),
    (lambda k, out, tm: walk(k, tm), "walks a schedule, and X is a value of type u32"),
    (stale, "'w' is not a work item here"),
    (unrolled, "it takes no stop, step or unroll"),
    (lambda k, out, tm: k.schedule("work", (2,), groups=5), "groups is (offsets, count"),
])
def test_python_api_mistakes_are_errors_at_the_users_line(body, message):
    def kernel(k, out: ptr(u32), tm: u32):
        body(k, out, tm)

    with pytest.raises(ptxdsl.CompileError) as e:
        ptxdsl.kernel(threads=32)(kernel)
    assert message in str(e.value) and "test_schedule.py:" in str(e.value), str(e.value)


@pytest.mark.parametrize("clauses", ["tiles(tm, 3) group(1) ksteps(4)",
                                     "tiles(3) groups(out, 2, 64) group(2)",
                                     "tiles(2 * 2, 3) ksteps(kt) splits(2)"])
def test_constant_clauses_fold_and_print_back(clauses):
    """Constants in the clauses fold where they meet (1 * 3 is 3), as the parser folds the
    printed text: the desugared kernel prints back to the same IR (found by fuzzing)."""
    m = ptxdsl.parse(f"""kernel k(out: ptr<u32>, tm: u32, kt: u32) threads(32) {{
        schedule work {clauses};
        for w in work {{ out[w.tile] = w.m + w.n; }}
    }}""")
    assert ptxdsl.parse(ptxdsl.print_module(m)) == m


def random_schedule(rng: np.random.Generator) -> tuple[str, bool]:
    """A random valid schedule and the fields a body may read."""
    grouped = rng.random() < 0.3
    cl = ["tiles(3)" if grouped else "tiles(tm, 3)"]
    if rng.random() < 0.5:
        cl.append(f"group({int(rng.integers(1, 4))})")
    if rng.random() < 0.7:
        cl.append("ksteps(kt)")
    if grouped:
        cl.append(str(rng.choice(["groups(offs, 3, 2)", "groups(offs, 3, 2, 4)"])))
    elif "ksteps(kt)" in cl:
        cl.append(str(rng.choice(["", "splits(s)", "streamk"])))
    return " ".join(cl), grouped


@pytest.mark.parametrize("case", range(examples(6, 200)))
def test_random_schedules_build_print_back_and_cover_every_tile(case):
    """Random clause mixes and field reads: each kernel builds, prints back to the same IR,
    and its walk visits every tile (every K step with ksteps) exactly once."""
    rng = np.random.default_rng(case)
    clauses, grouped = random_schedule(rng)
    fields = ["m", "n", "split", "splits"] + (["row0", "rows", "group"] if grouped else [])
    extra = " + ".join(f"w.{f}" for f in rng.choice(fields, 2, replace=False))
    ks = "ksteps" in clauses
    src = f"""kernel k(hits: ptr<u32>, junk: ptr<u32>, offs: ptr<u32>, tm: u32, kt: u32,
                        s: u32) threads(32) {{
        schedule work {clauses};
        if %tid.x == 0 {{
            for w in work {{
                for q in {"w.k0 .. w.k1" if ks else "0 .. 1"} {{
                    hits[w.tile * 8 + q] += 1;
                }}
                junk[%ctaid.x] = {extra};  // a sink of its own per CTA
            }}
        }}
    }}"""
    m = ptxdsl.parse(src, "random.ptxdsl")
    assert ptxdsl.parse(ptxdsl.print_module(m)) == m
    rows = [int(r) for r in rng.integers(0, 6, 3)]
    cap = "4)" in clauses
    offs = np.array(rows if cap else [0, *np.cumsum(rows)], np.uint32)
    tm, kt = int(rng.integers(1, 5)), int(rng.integers(1, 6))
    ntiles = (sum(-(-min(r, 4 if cap else r) // 2) for r in rows) if grouped else tm) * 3
    hits = np.zeros(64 * 8, np.uint32)
    run(m.kernels[0], int(rng.integers(1, 7)), {"hits": hits, "junk": np.zeros(8, np.uint32),
                                               "offs": offs, "tm": tm, "kt": kt,
                                               "s": int(rng.integers(1, 5))})
    want = np.zeros((64, 8), np.uint32)
    want[:ntiles, :kt if ks else 1] = 1
    assert np.array_equal(hits.reshape(64, 8), want), clauses


def test_splitk_launch_grid_counts_cluster_pairs_and_guards_the_striped_sum():
    twin = sample_module("gemm_splitk")
    assert twin.launch_grid(512, 512, 65536, 16) == 128  # 8 tiles x 16 splits
    assert twin.launch_grid(333, 520, 4104, 5, cluster=2) == 60  # 2 pairs x 3 x 5, in CTAs
    assert twin.launch_grid(1024, 1024, 8192, 8) == 132  # 256 items walked by 132 CTAs
    assert twin.launch_grid(512, 512, 65536, 16, stripes=True) == 128
    with pytest.raises(ValueError, match="every range in flight at once: 256 CTAs, more "
                                         "than 132"):
        twin.launch_grid(1024, 1024, 8192, 8, stripes=True)
    with pytest.raises(ValueError, match="136 CTAs, more than 132"):
        twin.launch_grid(130, 4104, 2056, 4, cluster=2, stripes=True)


def test_make_splitk_refuses_forms_it_does_not_have():
    twin = sample_module("gemm_splitk")
    with pytest.raises(ValueError, match="cluster is 1, or 2 without streamk; not 4"):
        twin.make_splitk(cluster=4)
    with pytest.raises(ValueError, match="not 2"):
        twin.make_splitk(cluster=2, streamk=True)
    with pytest.raises(ValueError, match="stripes sums the slots of a split-K walk"):
        twin.make_splitk(stripes=True)
    with pytest.raises(ValueError, match="stripes sums the slots of a split-K walk"):
        twin.make_splitk(slots=True, streamk=True, stripes=True)
