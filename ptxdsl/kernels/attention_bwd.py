"""The FlashAttention-3-style backward pass of attention.py's forward, with the Python API.

Given bf16 Q, O, dO (B x H x S x D), K, V (B x KVH x S_kv x D) and the forward's f32
log-sum-exp (B x H x S, natural units), three kernels compute dQ, dK, dV:

1. `make_preprocess(d)`: per query row, dPsum = rowsum(dO * O) and the LSE in log2 units (the
   main kernel's exp2 wants it so), both f32 in rows padded to whole 64-row blocks
   (`seq_pad`; padded rows hold 0), and zeros in the f32 dQ accumulator.
2. `make_attention_bwd(d, causal, gqa, deterministic)`: a CTA owns a block of 128 keys of
   one query head (K and V resident in shared memory) and walks the query blocks of 64 rows
   that see them (causal: from the block holding the diagonal). One producer warp loads Q,
   dO and the rows' LSE and dPsum through two pipelines (what the first products read,
   then the MN-major copies that dV and dK read, released sooner and later); two consumer
   warpgroups own 64 keys each and compute, transposed so that keys are the rows of every
   accumulator: S^T = K Q^T and dP^T = V dO^T, P^T = exp2(S^T scale_log2 - LSE),
   dS^T = P^T (dP^T - dPsum); dV += P^T dO and dK += dS^T Q with P^T and dS^T as register
   fragments; dS^T goes transposed to shared memory, and dQ = dS K is added into the f32
   accumulator with TMA reduce-adds (64 x 32 chunks through swizzled staging chunks): at
   head dim 128 the warpgroups share dS and each adds 64 of dQ's columns over all 128 keys,
   at 64 each adds all columns over its own 64 keys. dK (times the scale) and dV stay in
   registers and are stored at the end: bf16 into (B, KVH, S_kv, D), or with `gqa` as f32
   per query head into (B, H, S_kv, D), summed afterwards. `deterministic`: every dQ
   tile's adds happen in one order (a semaphore per tile counts them in, key block by key
   block from the last that reaches the tile down to 0, the order in which they reach it,
   and warpgroup by warpgroup), so runs are bit-identical.
3. `make_finish()`: out = bf16(scale * sum over `group` consecutive heads of an f32
   buffer): dQ (group 1, times the softmax scale), and with `gqa` dK and dV (the query
   heads of a KV head, in head order: deterministic).

The window, varlen and softcap builds (`window`, `varlen`, `softcap` of make_preprocess and
make_attention_bwd) take what the forward's builds take: a sliding window (a key block's CTA
walks only the query blocks whose rows' windows reach it, attention_bwd_masks.py), packed
sequences (a CTA a key block of one sequence), capped scores; rows that see no key (the
forward's LSE -inf) get zero gradients.

Why the copies of Q, dO and K: wgmma reads a shared buffer either K-major or MN-major, a
property of the buffer's declaration. Q is the N operand of S^T = K Q^T (K-major) and of
dK += dS^T Q (MN-major); dO likewise; K is the A operand of S^T and the N operand of
dQ = dS K. Each is loaded into two buffers with the same bytes, one per reading.
"""

from contextlib import nullcontext

import numpy as np

import ptxdsl
from ptxdsl import array, bf16, f32, ptr, s32, tmap, u32
from ptxdsl.kernels.family import Family

from .attention import row_softmax, scores
from .attention_bwd_masks import (
    BM,
    BN,
    Walk,
    edge,
    key_blocks,
    masked,
    padded,  # noqa: F401 (re-exported: the callers size their buffers by it)
    query_blocks,
    varlen_rows0,
)
from .params import kernel_of
from .wgmma import consumer_lanes

NWG = 2  # consumer warpgroups
NEG = -1.0e30  # a masked score: exp2 of it minus any LSE is 0
LOG2E = 1.4426950408889634
PART = 32  # f32 columns of a dQ staging chunk (128 bytes, the swizzle span)
PAIR_BAR = 12  # the named barrier of both consumer warpgroups (8 + wg: one warpgroup's)
PRE_THREADS, FINISH_THREADS = 128, 256  # the preprocess's and the finish's CTA sizes


def make_preprocess(d: int = 128, threads: int = PRE_THREADS, window: bool = False,
                    varlen: bool = False) -> ptxdsl.KernelDef:
    """dPsum and the log2 LSE for every padded row (a thread a row), and the dQ
    accumulator's rows zeroed. `window` or `varlen`: a row that sees no key (the forward's
    LSE -inf) gets a log2 LSE of 1e30, so that its P is 0. `varlen`: the rows of packed
    (total_q, H, D) sequences (cu_seqlens_q), a thread a row of `seq_pad` (the longest
    sequence's padded rows) per sequence and head, the LSE (H, total_q); the outputs at
    varlen_rows0 in `head_rows` rows a head."""
    _check_d(d, "make_preprocess")

    def body(k, a: dict) -> None:
        lse, lse2, dps, seq_pad = a["lse"], a["lse2"], a["dps"], a["seq_pad"]
        i = k.let("i", k.ctaid.x * threads + k.tid.x)
        with k.if_(i < a["rows"] * seq_pad):
            bh = k.let("bh", i / seq_pad)
            r = k.let("r", i % seq_pad)
            if varlen:
                heads = a["heads"]
                b = k.let("b", bh / heads)
                q0 = k.let("q0", a["cu_seqlens_q"][b].to(u32))
                seq = k.let("seq", a["cu_seqlens_q"][b + 1].to(u32) - q0)
                out = k.let("out", bh % heads * a["head_rows"] + varlen_rows0(k, b, q0) + r)
                base = (q0 + r) * heads + bh % heads
                at_lse = bh % heads * a["total_q"] + q0 + r
            else:
                seq, out, base, at_lse = a["seq"], i, bh * a["seq"] + r, bh * a["seq"] + r
            with k.if_(r < seq):
                base = k.let("base", base * d)
                acc = k.let("acc", 0.0)
                with k.for_("c", 0, d // 8, unroll=True) as c:
                    ov = k.let("ov", k.vload(a["o"][base + c * 8], 8))
                    gv = k.let("gv", k.vload(a["dout"][base + c * 8], 8))
                    for e in range(8):
                        k.assign(acc, k.fma(ov[e].to(f32), gv[e].to(f32), acc))
                with k.for_("z", 0, d // 4, unroll=True) as z:
                    a["dqacc"][base + z * 4] = k.f32x4(0.0, 0.0, 0.0, 0.0)
                dps[out] = acc
                if window or varlen:  # LSE -inf: no key; -NEG makes every P 0
                    x = k.let("x", lse[at_lse])
                    lse2[out] = k.select(x > NEG, x * LOG2E, -NEG)
                else:
                    lse2[out] = lse[at_lse] * LOG2E
            with k.else_():  # padding: masked in the main kernel, but finite
                # varlen: the sequence's own padded rows (past them, the next one's)
                with k.if_(r < (seq + (BM - 1)) / BM * BM) if varlen else nullcontext():
                    dps[out] = 0.0
                    lse2[out] = 0.0

    params = [("o", ptr(bf16)), ("dout", ptr(bf16)), ("lse", ptr(f32)), ("lse2", ptr(f32)),
              ("dps", ptr(f32)), ("dqacc", ptr(f32))] + \
        ([("cu_seqlens_q", ptr(s32)), ("seq_pad", u32), ("rows", u32), ("heads", u32),
          ("total_q", u32), ("head_rows", u32)] if varlen else
         [("seq", u32), ("seq_pad", u32), ("rows", u32)])
    name = "attention_bwd_pre" + ("" if d == 128 else f"_d{d}") + \
        ("_window" if window else "") + ("_varlen" if varlen else "")
    return kernel_of(body, params, threads, name)


def make_finish(threads: int = FINISH_THREADS) -> ptxdsl.KernelDef:
    """out[i] = bf16(scale * sum of src over `group` heads), four elements a thread; out is
    `total` elements, `per_head` a head."""

    @ptxdsl.kernel(threads=threads, name="attention_bwd_finish")
    def attention_bwd_finish(k, src: ptr(f32), out: ptr(bf16), total: u32, per_head: u32,
                             group: u32, scale: f32):
        i = k.let("i", (k.ctaid.x * threads + k.tid.x) * 4)
        with k.if_(i < total):
            at = k.let("at", i / per_head * group * per_head + i % per_head)
            acc = k.let("acc", k.vload(src[at], 4))
            with k.for_("g", 1, group) as g:
                v = k.let("v", k.vload(src[at + g * per_head], 4))
                for e in range(4):
                    acc[e] = acc[e] + v[e]
            out[i] = k.bf16x4(*((acc[e] * scale).to(bf16) for e in range(4)))

    return attention_bwd_finish


def make_attention_bwd(d: int = 128, causal: bool = False, gqa: bool = False,
                       deterministic: bool = False, stages: tuple[int, int] | None = None,
                       window: bool = False, varlen: bool = False, softcap: bool = False
                       ) -> ptxdsl.KernelDef:
    """The main backward kernel for head dim `d` (64 or 128), causal or not. `gqa`: dK and
    dV as f32 partials per query head (for make_finish to sum), else bf16 per KV head (the
    caller's H = KVH). `deterministic`: dQ adds in key-block order. `stages`: of the pipeline
    of the K-major Q and dO (with the rows' LSE and dPsum), read first, and of the MN-major
    ones, read later (default: (2, 2) at head dim 64, (2, 1) at 128, what shared memory
    holds with one 64 x 32 dQ staging chunk a warpgroup).

    `window`: the sliding window of the forward's window build (u32 `window_left` and
    `window_right`; causal is the window (kv_seq, 0), so a window build is not also causal):
    a key block's CTA walks only the query blocks whose rows' windows reach it
    (attention_bwd_masks). `varlen`: packed sequences as the forward's varlen build takes
    them: Q, dO (total_q, H, D), K, V (total_k, KVH, D) and the f32 dQ accumulator
    (total_q, H, D) through 3-D maps, dK and dV rows of (total_k, H or KVH, D), the lengths
    from cu_seqlens_q and cu_seqlens_k; a CTA a key block of a sequence and query head, of
    the longest sequence's `kv_seq` keys; `seq_pad` is a head's rows of the LSE and dPsum
    (head_rows). `softcap`: the scores capped as s -> softcap tanh(s scale / softcap) before
    the softmax (`cap_scale` = scale / softcap, and scale_log2 = softcap log2 e), dS times
    the cap's derivative 1 - tanh^2."""
    _check_d(d, "make_attention_bwd")
    if (window or varlen) and causal:
        raise ValueError("make_attention_bwd: a window or varlen build takes the causal mask "
                         "as the window (kv_seq, 0); it is not also causal")
    plain = not (window or varlen)
    hb = d // 64  # 64-wide column blocks (a 128-byte swizzle row each)
    # head dim 128: the warpgroups share dS and split dQ's columns (one add of each dQ
    # element a key block); at 64 a column split would start an MN-major operand mid-row,
    # so each warpgroup adds dQ over its own keys
    split = d == 128
    st = stages if stages is not None else ((2, 2) if d == 64 else (2, 1))
    chunks = 2 if d == 64 else 1  # 64 x 32 dQ staging chunks a warpgroup
    out_t = f32 if gqa else bf16
    name = f"attention_bwd_d{d}" + ("_causal" if causal else "") + ("_gqa" if gqa else "") + \
        ("_det" if deterministic else "") + ("" if stages is None else f"_s{st[0]}{st[1]}") + \
        ("_window" if window else "") + ("_varlen" if varlen else "") + \
        ("_softcap" if softcap else "")
    tile = (bf16, [hb, BM, 64], 1024, 128)

    def body(k, a: dict) -> None:
        """The kernel, its parameters by name in `a` (k is the context)."""
        q, key, value, dout, lse2, dps = (a[x] for x in ("q", "key", "value", "dout", "lse2",
                                                          "dps"))
        heads, kv_heads, seq_pad, kv_seq = a["heads"], a["kv_heads"], a["seq_pad"], a["kv_seq"]
        win = (a["window_left"], a["window_right"]) if window else None
        kv = k.pipeline("kv", 1, k=(bf16, [hb, BN, 64], 1024, 128),
                        kmn=(bf16, [hb, BN, 64], 1024, 128, "mn"),
                        v=(bf16, [hb, BN, 64], 1024, 128))
        qa = k.pipeline("qa", st[0], q=tile, do=tile, lse=(f32, [BM], 16), dps=(f32, [BM], 16))
        qb = k.pipeline("qb", st[1], qmn=(*tile, "mn"), domn=(*tile, "mn"))
        dss = k.shared("dss", bf16, [NWG, BM, 64], align=1024, swizzle=128)
        dqs = k.shared("dqs", f32, [NWG, chunks, BM, PART], align=1024, swizzle=128)
        nkv = k.let("nkv", (kv_seq + (BN - 1)) / BN)  # varlen: the longest sequence's
        # the key block; deterministic, the last first: a tile's adds go from its last key
        # block down, so a CTA waits only for CTAs launched before it (never for one that
        # may not be resident yet)
        n = k.let("n", nkv - 1 - k.ctaid.x % nkv if deterministic else k.ctaid.x % nkv)
        bh = k.let("bh", k.ctaid.x / nkv)
        qh = k.let("qh", (bh % heads).to(s32))  # coordinates (.., head, batch)
        if varlen:  # coordinates (.., head, row)
            bb, off = None, None
            b = k.let("b", bh / heads)
            q0 = k.let("q0", a["cu_seqlens_q"][b].to(u32))
            k0s = k.let("k0s", a["cu_seqlens_k"][b].to(u32))
            nq = k.let("nq", a["cu_seqlens_q"][b + 1].to(u32) - q0)
            nk = k.let("nk", a["cu_seqlens_k"][b + 1].to(u32) - k0s)
            sq = Walk(seq=nq, kv_seq=nk, nkv=k.let("nkvs", (nk + (BN - 1)) / BN),
                      mblocks=k.let("mblocks", (nq + (BM - 1)) / BM), q0=q0, k0=k0s,
                      rows0=k.let("r0", bh % heads * seq_pad + varlen_rows0(k, b, q0)))
        else:
            bb = k.let("bb", (bh / heads).to(s32))
        kvh = k.let("kvh", (bh % heads / (heads / kv_heads)).to(s32))
        if not varlen:
            sq = Walk(seq=a["seq"], kv_seq=kv_seq, nkv=nkv,
                      mblocks=k.let("mblocks", seq_pad / BM))
            off = k.let("off", kv_seq - a["seq"])  # causal: query row r sees keys <= r + off
        # causal: the first query block with a row that sees key n * BN
        m0, m1 = query_blocks(k, n, sq, causal, win, off)

        def rows_at(h, m) -> list:
            """The Q and dO maps' coordinates of query block m's columns h * 64 .."""
            return [h * 64, qh, (sq.q0 + m * BM).to(s32)] if varlen else \
                [h * 64, (m * BM).to(s32), qh, bb]

        def row(m):
            """Query block m's first row in the LSE and dPsum buffers."""
            return sq.rows0 + m * BM if varlen else (bh * sq.mblocks + m) * BM

        with k.role("producer", 0, 4, regs=24):
            with k.if_((k.warp == 0) & k.elect()):
                k.acquire(kv)
                with k.for_("h", 0, hb, unroll=True) as h:
                    at = [(h * 64).to(s32), kvh, (sq.k0 + n * BN).to(s32)] if varlen else \
                        [(h * 64).to(s32), (n * BN).to(s32), kvh, bb]
                    k.tma_load(kv.k[h], key, at)
                    k.tma_load(kv.kmn[h], key, at)
                    k.tma_load(kv.v[h], value, at)
                k.commit(kv)
                with k.for_("m", m0, m1) as m:
                    k.acquire(qa)
                    for h in range(hb):
                        at = rows_at(h, m)
                        k.tma_load(qa.q[h], q, at)
                        k.tma_load(qa.do[h], dout, at)
                    k.bulk_load(qa.lse, lse2[row(m)])
                    k.bulk_load(qa.dps, dps[row(m)])
                    k.commit(qa)
                    k.acquire(qb)
                    for h in range(hb):
                        at = rows_at(h, m)
                        k.tma_load(qb.qmn[h], q, at)
                        k.tma_load(qb.domn[h], dout, at)
                    k.commit(qb)
        with k.role("consumer", 4, 4 + 4 * NWG, regs=240):
            wg, leader, lrow, col = consumer_lanes(k)
            k0 = k.let("k0", n * BN + wg * 64)  # this warpgroup's first key
            s = k.let("s", type=array(f32, BM // 2))
            dp = k.let("dp", type=array(f32, BM // 2))
            p = k.let("p", type=array(bf16, BM // 2))
            ds = k.let("ds", type=array(bf16, BM // 2))
            dka = k.let("dka", type=array(f32, d // 2))
            dva = k.let("dva", type=array(f32, d // 2))
            if not plain:  # keys that no row sees walk no query block: their dK, dV are 0
                with k.for_("x", 0, d // 2, unroll=True) as x:
                    dka[x] = 0.0
                    dva[x] = 0.0
            lanes = (wg, leader, lrow, col)
            k.wait(kv)
            with k.for_("m", m0, m1) as m:
                k.wait(qa)
                k.wgmma_fence()
                with k.for_("kk", 0, d // 16, unroll=True) as kk:
                    k.wgmma(s, kv.k[kk / 4, wg * 64, kk % 4 * 16], qa.q[kk / 4, 0, kk % 4 * 16],
                            kk > 0)
                with k.for_("kk", 0, d // 16, unroll=True) as kk:
                    k.wgmma(dp, kv.v[kk / 4, wg * 64, kk % 4 * 16],
                            qa.do[kk / 4, 0, kk % 4 * 16], kk > 0)
                k.wgmma_commit()
                k.wgmma_wait(0)
                scores(k, a, s, dp, p, ds, qa, m, k0, lrow, col, sq, off, win)
                k.release(qa)
                k.wait(qb)
                k.wgmma_fence()
                with k.for_("kk", 0, BM // 16, unroll=True) as kk:
                    k.wgmma(dva, k.frag(p, kk), qb.domn[0, kk * 16, 0], (m > m0) | (kk > 0))
                    k.wgmma(dka, k.frag(ds, kk), qb.qmn[0, kk * 16, 0], (m > m0) | (kk > 0))
                k.wgmma_commit()
                # dS^T transposed into tile wg of dss (rows: queries), for dQ = dS K
                if split:  # the other warpgroup's previous dQ wgmmas are done reading it
                    k.bar_sync(PAIR_BAR, 128 * NWG)
                with k.for_("j", 0, BM // 8, unroll=True) as j:
                    for e in range(4):
                        dss[wg, j * 8 + col + e % 2, lrow + e // 2 * 8] = ds[4 * j + e]
                k.fence_proxy_async()
                place = (m, n, bh, qh, bb, sq, off, win)
                if split:  # dQ's columns wg * 64 .. over all the CTA's keys
                    k.bar_sync(PAIR_BAR, 128 * NWG)
                    k.wgmma_fence()
                    with k.for_("kk", 0, BN // 16, unroll=True) as kk:
                        k.wgmma(s, dss[kk / 4, 0, kk % 4 * 16], kv.kmn[wg, kk * 16, 0], kk > 0)
                    k.wgmma_commit()
                    k.wgmma_wait(0)
                    k.release(qb)  # dV's and dK's wgmmas are done with Q and dO
                    add_dq(k, a, s, dqs, lanes, wg * 64, place, True, True)
                else:  # all of dQ's columns over the warpgroup's 64 keys, 64 at a time
                    k.bar_sync(8 + wg, 128)
                    for h in range(hb):
                        k.wgmma_fence()
                        with k.for_("kk", 0, 4, unroll=True) as kk:
                            k.wgmma(s, dss[wg, 0, kk * 16], kv.kmn[h, wg * 64 + kk * 16, 0],
                                    kk > 0)
                        k.wgmma_commit()
                        k.wgmma_wait(0)
                        if h == 0:
                            k.release(qb)
                        add_dq(k, a, s, dqs, lanes, h * 64, place, h == 0, h == hb - 1)
            k.release(kv)
            store_dkv(k, a, dka, dva, lrow, col, k0, bh, sq)
            with k.if_(leader):
                k.bulk_wait(0)

    def scores(k, a, s, dp, p, ds, qa, m, k0, row, col, sq, off, win) -> None:
        """P^T and dS^T (bf16) from S^T and dP^T; scores of keys past kv_seq, of query rows
        past seq, above the diagonal (causal) or outside a row's window are masked, on the
        tiles that have any (softcap: the capped scores)."""
        scale_log2 = a["scale_log2"]
        if softcap:
            with k.for_("x", 0, BM // 2, unroll=True) as x:
                s[x] = k.tanh(s[x] * a["cap_scale"])
        with k.if_(edge(k0, m, sq, causal, win, off)):
            with k.for_("j", 0, BM // 8, unroll=True) as j:
                for e in range(4):
                    kr = k.let(f"kr{e}", k0 + row + e // 2 * 8)
                    qr = k.let(f"qr{e}", m * BM + j * 8 + col + e % 2)
                    s[4 * j + e] = k.select(masked(kr, qr, sq, causal, win, off), NEG,
                                            s[4 * j + e])
        with k.for_("j", 0, BM // 8, unroll=True) as j:
            lv = k.let("lv", k.vload(qa.lse[j * 8 + col], 2))
            dv = k.let("dpv", k.vload(qa.dps[j * 8 + col], 2))
            for e in range(4):
                x = 4 * j + e
                pv = k.let(f"pv{e}", k.ex2(k.fma(s[x], scale_log2, -lv[e % 2])))
                p[x] = pv.to(bf16)
                grad = pv * (dp[x] - dv[e % 2])
                if softcap:  # d(softcap tanh(t / softcap)) / dt; a masked s is NEG, its P 0
                    grad = grad * (1.0 - k.min(s[x] * s[x], 1.0))
                ds[x] = grad.to(bf16)

    def add_dq(k, a, dq, dqs, lanes, c0, place, first: bool, last: bool) -> None:
        """Columns c0 .. c0 + 63 of this warpgroup's dQ partial into the f32 accumulator:
        two 64 x 32 chunks through the staging chunks, `chunks` a pass, reduce-added by the
        leader (after the previous adds read the chunks). Deterministic: one semaphore per
        dQ tile counts its adds, warpgroup wg of key block n being add NWG (nlast - n) + wg
        (the key blocks that reach a query block are nfirst .. nlast: key_blocks); the
        `first` part waits for its turn, the `last` publishes the next, and the tile's last
        add (key block nfirst's) resets the count to 0 for the next launch."""
        wg, leader, row, col = lanes
        m, n, bh, qh, bb, sq, off, win = place
        sem, dqacc = a["sem"], a["dqacc"]
        # the adds go from the last key block down to the first, the order in which the key
        # blocks reach the tile (causal: key block n starts its walk at its diagonal, so the
        # higher ones arrive first; in key-block order each would wait for block 0's walk)
        nfirst, nlast = key_blocks(k, m, sq, causal, win, off)
        turn = ((nlast - n) * NWG + wg) if deterministic else None
        tile = sq.rows0 / BM + m if varlen else bh * sq.mblocks + m  # its semaphore
        for ps in range(2 // chunks):  # passes of `chunks` chunks
            with k.if_(leader):
                k.bulk_wait_read(0)
                if deterministic and first and ps == 0:
                    with k.while_(k.ld_acquire(sem[tile]) != turn):
                        pass
                    k.fence_proxy_async_global()
            k.bar_sync(8 + wg, 128)
            with k.for_("j", 0, 4 * chunks, unroll=True) as j:
                with k.for_("i", 0, 2, unroll=True) as i:
                    x = 16 * ps + 4 * j + 2 * i
                    dqs[wg, j / 4, row + i * 8, j % 4 * 8 + col] = k.f32x2(dq[x], dq[x + 1])
            k.fence_proxy_async()
            k.bar_sync(8 + wg, 128)
            with k.if_(leader):
                with k.for_("c", 0, chunks, unroll=True) as c:
                    x0 = (c0 + (ps * chunks + c) * PART).to(s32)
                    k.tma_reduce_add(dqacc, [x0, qh, (sq.q0 + m * BM).to(s32)] if varlen else
                                     [x0, (m * BM).to(s32), qh, bb], dqs[wg, c])
                k.bulk_commit()
                if deterministic and last and ps == 2 // chunks - 1:
                    k.bulk_wait(0)  # complete, not just read: the count publishes the sums
                    done = (n == nfirst) & (wg == NWG - 1)
                    k.st_release(sem[tile], k.select(done, 0, turn + 1))

    def store_dkv(k, a, dka, dva, row, col, k0, bh, sq) -> None:
        """dK (times the scale) and dV from registers, rows below kv_seq, into the query
        head's rows (without `gqa` the caller's heads are the KV heads)."""
        pack = getattr(k, f"{out_t}x2")
        dk, dv, scale, heads = a["dk"], a["dv"], a["scale"], a["heads"]
        with k.for_("i", 0, 2, unroll=True) as i:
            kr = k.let("kr", k0 + row + i * 8)
            with k.if_(kr < sq.kv_seq):
                with k.for_("j", 0, d // 8, unroll=True) as j:
                    at = ((sq.k0 + kr) * heads + bh % heads) * d if varlen else \
                        (bh * sq.kv_seq + kr) * d
                    at = k.let("at", at + j * 8 + col)
                    x = 4 * j + 2 * i
                    dk[at] = pack((dka[x] * scale).to(out_t), (dka[x + 1] * scale).to(out_t))
                    dv[at] = pack(dva[x].to(out_t), dva[x + 1].to(out_t))

    params = [(x, tmap(bf16, 3 if varlen else 4)) for x in ("q", "key", "value", "dout")] + \
        [("lse2", ptr(f32)), ("dps", ptr(f32)), ("dqacc", tmap(f32, 3 if varlen else 4)),
         ("sem", ptr(u32)), ("dk", ptr(out_t)), ("dv", ptr(out_t))] + \
        ([("cu_seqlens_q", ptr(s32)), ("cu_seqlens_k", ptr(s32))] if varlen else
         [("seq", u32)]) + \
        [("kv_seq", u32), ("seq_pad", u32), ("heads", u32), ("kv_heads", u32),
         ("scale_log2", f32), ("scale", f32)] + \
        ([("window_left", u32), ("window_right", u32)] if window else []) + \
        ([("cap_scale", f32)] if softcap else [])
    return kernel_of(body, params, 128 * (NWG + 1), name)


def _check_d(d: int, who: str) -> None:
    if d not in (64, 128):
        raise ValueError(f"{who}: head dim is 64 or 128, not {d}")


def grid(batch: int, heads: int, kv_seq: int) -> int:
    """CTAs of the main kernel: one per key block and query head."""
    return -(-kv_seq // BN) * batch * heads


attention_bwd = make_attention_bwd()
preprocess = make_preprocess()
finish = make_finish()


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, causal: bool,
              scale: float, window: tuple[int, int] = (-1, -1), softcap: float = 0.0
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dQ, dK, dV) in float64 for float Q, dO (B, H, S, D), K and V (B, KVH, S_kv, D): the
    gradient of sum(dO * attention(Q, K, V)), the causal mask and the window (left, right;
    -1 unbounded) aligned to the end, the scores capped by `softcap` > 0 (attention.reference);
    dK and dV summed over the query heads of a KV head. A row that sees no key has zero
    gradients."""
    group = q.shape[1] // k.shape[1]
    s = scores(q, k, causal, scale, window, softcap)
    p, _ = row_softmax(s)
    # d capped / d s, 1 - tanh^2 (where a key is hidden, P is 0 and this any finite value)
    cap = 1.0 - (np.where(np.isfinite(s), s, 0.0) / softcap) ** 2 if softcap else 1.0
    q, do = q.astype(np.float64), do.astype(np.float64)
    kr = np.repeat(k, group, axis=1).astype(np.float64)
    vr = np.repeat(v, group, axis=1).astype(np.float64)
    o = np.einsum("bhqk,bhkd->bhqd", p, vr)
    dv = np.einsum("bhqk,bhqd->bhkd", p, do)
    dp = np.einsum("bhqd,bhkd->bhqk", do, vr)
    dsm = p * (dp - (do * o).sum(-1, keepdims=True)) * cap * scale
    dq = np.einsum("bhqk,bhkd->bhqd", dsm, kr)
    dk = np.einsum("bhqk,bhqd->bhkd", dsm, q)
    b, kvh, skv, d = k.shape
    return (dq, dk.reshape(b, kvh, group, skv, d).sum(2),
            dv.reshape(b, kvh, group, skv, d).sum(2))


FAMILY = Family(
    name="attention_bwd",
    summary="FlashAttention-3-style attention backward (dQ, dK, dV), bf16, head dim 64 or 128",
    factory=make_attention_bwd,
    defaults={"d": 128, "causal": False, "gqa": False, "deterministic": False},
)
