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

Why the copies of Q, dO and K: wgmma reads a shared buffer either K-major or MN-major, a
property of the buffer's declaration. Q is the N operand of S^T = K Q^T (K-major) and of
dK += dS^T Q (MN-major); dO likewise; K is the A operand of S^T and the N operand of
dQ = dS K. Each is loaded into two buffers with the same bytes, one per reading.
"""

import numpy as np

import ptxdsl
from ptxdsl import array, bf16, f32, ptr, s32, tmap, u32
from ptxdsl.kernels.family import Family

from .wgmma import consumer_lanes

BN = 128  # keys of a CTA (64 per consumer warpgroup)
BM = 64  # query rows of a block
NWG = 2  # consumer warpgroups
NEG = -1.0e30  # a masked score: exp2 of it minus any LSE is 0
LOG2E = 1.4426950408889634
PART = 32  # f32 columns of a dQ staging chunk (128 bytes, the swizzle span)
PAIR_BAR = 12  # the named barrier of both consumer warpgroups (8 + wg: one warpgroup's)
PRE_THREADS, FINISH_THREADS = 128, 256  # the preprocess's and the finish's CTA sizes


def make_preprocess(d: int = 128, threads: int = PRE_THREADS) -> ptxdsl.KernelDef:
    """dPsum and the log2 LSE for every padded row (a thread a row), and the dQ
    accumulator's rows zeroed."""
    _check_d(d, "make_preprocess")

    def attention_bwd_pre(k, o: ptr(bf16), dout: ptr(bf16), lse: ptr(f32), lse2: ptr(f32),
                          dps: ptr(f32), dqacc: ptr(f32), seq: u32, seq_pad: u32, rows: u32):
        i = k.let("i", k.ctaid.x * threads + k.tid.x)
        with k.if_(i < rows * seq_pad):
            bh = k.let("bh", i / seq_pad)
            r = k.let("r", i % seq_pad)
            with k.if_(r < seq):
                base = k.let("base", (bh * seq + r) * d)
                acc = k.let("acc", 0.0)
                with k.for_("c", 0, d // 8, unroll=True) as c:
                    ov = k.let("ov", k.vload(o[base + c * 8], 8))
                    gv = k.let("gv", k.vload(dout[base + c * 8], 8))
                    for e in range(8):
                        k.assign(acc, k.fma(ov[e].to(f32), gv[e].to(f32), acc))
                with k.for_("z", 0, d // 4, unroll=True) as z:
                    dqacc[base + z * 4] = k.f32x4(0.0, 0.0, 0.0, 0.0)
                dps[i] = acc
                lse2[i] = lse[bh * seq + r] * LOG2E
            with k.else_():  # padding: masked in the main kernel, but finite
                dps[i] = 0.0
                lse2[i] = 0.0

    name = "attention_bwd_pre" if d == 128 else f"attention_bwd_pre_d{d}"
    return ptxdsl.kernel(threads=threads, name=name)(attention_bwd_pre)


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
                       deterministic: bool = False, stages: tuple[int, int] | None = None
                       ) -> ptxdsl.KernelDef:
    """The main backward kernel for head dim `d` (64 or 128), causal or not. `gqa`: dK and
    dV as f32 partials per query head (for make_finish to sum), else bf16 per KV head (the
    caller's H = KVH). `deterministic`: dQ adds in key-block order. `stages`: of the pipeline
    of the K-major Q and dO (with the rows' LSE and dPsum), read first, and of the MN-major
    ones, read later (default: (2, 2) at head dim 64, (2, 1) at 128, what shared memory
    holds with one 64 x 32 dQ staging chunk a warpgroup)."""
    _check_d(d, "make_attention_bwd")
    hb = d // 64  # 64-wide column blocks (a 128-byte swizzle row each)
    # head dim 128: the warpgroups share dS and split dQ's columns (one add of each dQ
    # element a key block); at 64 a column split would start an MN-major operand mid-row,
    # so each warpgroup adds dQ over its own keys
    split = d == 128
    st = stages if stages is not None else ((2, 2) if d == 64 else (2, 1))
    chunks = 2 if d == 64 else 1  # 64 x 32 dQ staging chunks a warpgroup
    out_t = f32 if gqa else bf16
    name = f"attention_bwd_d{d}" + ("_causal" if causal else "") + ("_gqa" if gqa else "") + \
        ("_det" if deterministic else "") + ("" if stages is None else f"_s{st[0]}{st[1]}")
    tile = (bf16, [hb, BM, 64], 1024, 128)

    def attention_bwd(k, q: tmap(bf16, 4), key: tmap(bf16, 4), value: tmap(bf16, 4),
                      dout: tmap(bf16, 4), lse2: ptr(f32), dps: ptr(f32), dqacc: tmap(f32, 4),
                      sem: ptr(u32), dk: ptr(out_t), dv: ptr(out_t), seq: u32, kv_seq: u32,
                      seq_pad: u32, heads: u32, kv_heads: u32, scale_log2: f32, scale: f32):
        kv = k.pipeline("kv", 1, k=(bf16, [hb, BN, 64], 1024, 128),
                        kmn=(bf16, [hb, BN, 64], 1024, 128, "mn"),
                        v=(bf16, [hb, BN, 64], 1024, 128))
        qa = k.pipeline("qa", st[0], q=tile, do=tile, lse=(f32, [BM], 16), dps=(f32, [BM], 16))
        qb = k.pipeline("qb", st[1], qmn=(*tile, "mn"), domn=(*tile, "mn"))
        dss = k.shared("dss", bf16, [NWG, BM, 64], align=1024, swizzle=128)
        dqs = k.shared("dqs", f32, [NWG, chunks, BM, PART], align=1024, swizzle=128)
        nkv = k.let("nkv", (kv_seq + (BN - 1)) / BN)
        # the key block; deterministic, the last first: a tile's adds go from its last key
        # block down, so a CTA waits only for CTAs launched before it (never for one that
        # may not be resident yet)
        n = k.let("n", nkv - 1 - k.ctaid.x % nkv if deterministic else k.ctaid.x % nkv)
        bh = k.let("bh", k.ctaid.x / nkv)
        qh = k.let("qh", (bh % heads).to(s32))  # coordinates (.., head, batch)
        bb = k.let("bb", (bh / heads).to(s32))
        kvh = k.let("kvh", (bh % heads / (heads / kv_heads)).to(s32))
        mblocks = k.let("mblocks", seq_pad / BM)
        off = k.let("off", kv_seq - seq)  # causal: query row r sees keys <= r + off
        # causal: the first query block with a row that sees key n * BN
        m0 = k.let("m0", k.select(n * BN > off, (n * BN - off) / BM, 0) if causal else 0)
        with k.role("producer", 0, 4, regs=24):
            with k.if_((k.warp == 0) & k.elect()):
                k.acquire(kv)
                with k.for_("h", 0, hb, unroll=True) as h:
                    at = [(h * 64).to(s32), (n * BN).to(s32), kvh, bb]
                    k.tma_load(kv.k[h], key, at)
                    k.tma_load(kv.kmn[h], key, at)
                    k.tma_load(kv.v[h], value, at)
                k.commit(kv)
                with k.for_("m", m0, mblocks) as m:
                    k.acquire(qa)
                    for h in range(hb):
                        at = [h * 64, (m * BM).to(s32), qh, bb]
                        k.tma_load(qa.q[h], q, at)
                        k.tma_load(qa.do[h], dout, at)
                    k.bulk_load(qa.lse, lse2[(bh * mblocks + m) * BM])
                    k.bulk_load(qa.dps, dps[(bh * mblocks + m) * BM])
                    k.commit(qa)
                    k.acquire(qb)
                    for h in range(hb):
                        at = [h * 64, (m * BM).to(s32), qh, bb]
                        k.tma_load(qb.qmn[h], q, at)
                        k.tma_load(qb.domn[h], dout, at)
                    k.commit(qb)
        with k.role("consumer", 4, 4 + 4 * NWG, regs=240):
            wg, leader, row, col = consumer_lanes(k)
            k0 = k.let("k0", n * BN + wg * 64)  # this warpgroup's first key
            s = k.let("s", type=array(f32, BM // 2))
            dp = k.let("dp", type=array(f32, BM // 2))
            p = k.let("p", type=array(bf16, BM // 2))
            ds = k.let("ds", type=array(bf16, BM // 2))
            dka = k.let("dka", type=array(f32, d // 2))
            dva = k.let("dva", type=array(f32, d // 2))
            k.wait(kv)
            with k.for_("m", m0, mblocks) as m:
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
                scores(k, s, dp, p, ds, qa, m, k0, row, col, seq, kv_seq, off, scale_log2)
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
                        dss[wg, j * 8 + col + e % 2, row + e // 2 * 8] = ds[4 * j + e]
                k.fence_proxy_async()
                if split:  # dQ's columns wg * 64 .. over all the CTA's keys
                    k.bar_sync(PAIR_BAR, 128 * NWG)
                    k.wgmma_fence()
                    with k.for_("kk", 0, BN // 16, unroll=True) as kk:
                        k.wgmma(s, dss[kk / 4, 0, kk % 4 * 16], kv.kmn[wg, kk * 16, 0], kk > 0)
                    k.wgmma_commit()
                    k.wgmma_wait(0)
                    k.release(qb)  # dV's and dK's wgmmas are done with Q and dO
                    add_dq(k, s, dqs, dqacc, sem, wg, leader, row, col, wg * 64, m, n, bh, qh,
                           bb, mblocks, nkv, off, True, True)
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
                        add_dq(k, s, dqs, dqacc, sem, wg, leader, row, col, h * 64, m, n, bh,
                               qh, bb, mblocks, nkv, off, h == 0, h == hb - 1)
            k.release(kv)
            store_dkv(k, dka, dva, dk, dv, row, col, k0, bh, kv_seq, scale)
            with k.if_(leader):
                k.bulk_wait(0)

    def scores(k, s, dp, p, ds, qa, m, k0, row, col, seq, kv_seq, off, scale_log2) -> None:
        """P^T and dS^T (bf16) from S^T and dP^T; scores of keys past kv_seq, of query rows
        past seq and (causal) above the diagonal are masked, on the blocks that have any."""
        edge = (k0 + 64 > kv_seq) | (m * BM + BM > seq)
        if causal:
            edge = edge | (k0 + 63 > m * BM + off)
        with k.if_(edge):
            with k.for_("j", 0, BM // 8, unroll=True) as j:
                for e in range(4):
                    kr = k.let(f"kr{e}", k0 + row + e // 2 * 8)
                    qr = k.let(f"qr{e}", m * BM + j * 8 + col + e % 2)
                    masked = (kr >= kv_seq) | (qr >= seq)
                    if causal:
                        masked = masked | (kr > qr + off)
                    s[4 * j + e] = k.select(masked, NEG, s[4 * j + e])
        with k.for_("j", 0, BM // 8, unroll=True) as j:
            lv = k.let("lv", k.vload(qa.lse[j * 8 + col], 2))
            dv = k.let("dpv", k.vload(qa.dps[j * 8 + col], 2))
            for e in range(4):
                x = 4 * j + e
                pv = k.let(f"pv{e}", k.ex2(k.fma(s[x], scale_log2, -lv[e % 2])))
                p[x] = pv.to(bf16)
                ds[x] = (pv * (dp[x] - dv[e % 2])).to(bf16)

    def add_dq(k, dq, dqs, dqacc, sem, wg, leader, row, col, c0, m, n, bh, qh, bb,
               mblocks, nkv, off, first: bool, last: bool) -> None:
        """Columns c0 .. c0 + 63 of this warpgroup's dQ partial into the f32 accumulator:
        two 64 x 32 chunks through the staging chunks, `chunks` a pass, reduce-added by the
        leader (after the previous adds read the chunks). Deterministic: one semaphore per
        dQ tile counts its adds, warpgroup wg of key block n being add NWG (nlast - n) + wg
        (the key blocks that reach a query block are 0 .. nlast, the one holding its last
        row's diagonal, causal, else all); the `first` part waits for its turn, the `last`
        publishes the next, and the tile's last add (key block 0's) resets the count to 0
        for the next launch."""
        # the last key block that adds to query block m; the adds go from it down to key
        # block 0, the order in which the key blocks reach the tile (causal: key block n
        # starts its walk at its diagonal, so the higher ones arrive first; in key-block
        # order each would wait for block 0's walk to come by)
        nlast = k.min((m * BM + (BM - 1) + off) / BN, nkv - 1) if causal else nkv - 1
        turn = ((nlast - n) * NWG + wg) if deterministic else None
        for ps in range(2 // chunks):  # passes of `chunks` chunks
            with k.if_(leader):
                k.bulk_wait_read(0)
                if deterministic and first and ps == 0:
                    with k.while_(k.ld_acquire(sem[bh * mblocks + m]) != turn):
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
                    k.tma_reduce_add(dqacc, [(c0 + (ps * chunks + c) * PART).to(s32),
                                             (m * BM).to(s32), qh, bb], dqs[wg, c])
                k.bulk_commit()
                if deterministic and last and ps == 2 // chunks - 1:
                    k.bulk_wait(0)  # complete, not just read: the count publishes the sums
                    done = (n == 0) & (wg == NWG - 1)
                    k.st_release(sem[bh * mblocks + m], k.select(done, 0, turn + 1))

    def store_dkv(k, dka, dva, dk, dv, row, col, k0, bh, kv_seq, scale) -> None:
        """dK (times the scale) and dV from registers, rows below kv_seq, into the query
        head's rows (without `gqa` the caller's heads are the KV heads)."""
        pack = getattr(k, f"{out_t}x2")
        with k.for_("i", 0, 2, unroll=True) as i:
            kr = k.let("kr", k0 + row + i * 8)
            with k.if_(kr < kv_seq):
                with k.for_("j", 0, d // 8, unroll=True) as j:
                    at = k.let("at", (bh * kv_seq + kr) * d + j * 8 + col)
                    x = 4 * j + 2 * i
                    dk[at] = pack((dka[x] * scale).to(out_t), (dka[x + 1] * scale).to(out_t))
                    dv[at] = pack(dva[x].to(out_t), dva[x + 1].to(out_t))

    return ptxdsl.kernel(threads=128 * (NWG + 1), name=name)(attention_bwd)


def _check_d(d: int, who: str) -> None:
    if d not in (64, 128):
        raise ValueError(f"{who}: head dim is 64 or 128, not {d}")


def padded(seq: int) -> int:
    """Query rows rounded up to whole blocks: the row count of the LSE and dPsum buffers."""
    return -(-seq // BM) * BM


def grid(batch: int, heads: int, kv_seq: int) -> int:
    """CTAs of the main kernel: one per key block and query head."""
    return -(-kv_seq // BN) * batch * heads


attention_bwd = make_attention_bwd()
preprocess = make_preprocess()
finish = make_finish()


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, causal: bool,
              scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dQ, dK, dV) in float64 for float Q, dO (B, H, S, D), K and V (B, KVH, S_kv, D): the
    gradient of sum(dO * attention(Q, K, V)), the causal mask aligned to the end; dK and dV
    summed over the query heads of a KV head."""
    group = q.shape[1] // k.shape[1]
    q, do = q.astype(np.float64), do.astype(np.float64)
    kr = np.repeat(k, group, axis=1).astype(np.float64)
    vr = np.repeat(v, group, axis=1).astype(np.float64)
    s = np.einsum("bhqd,bhkd->bhqk", q, kr) * scale
    if causal:
        sq, skv = s.shape[-2:]
        s = np.where(np.tril(np.ones((sq, skv), bool), skv - sq), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = np.einsum("bhqk,bhkd->bhqd", p, vr)
    dv = np.einsum("bhqk,bhqd->bhkd", p, do)
    dp = np.einsum("bhqd,bhkd->bhqk", do, vr)
    dsm = p * (dp - (do * o).sum(-1, keepdims=True)) * scale
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
