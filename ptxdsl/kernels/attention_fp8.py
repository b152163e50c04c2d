"""FlashAttention-style forward pass on e4m3 inputs with the Python API.

O = softmax(Q K^T * scale) V for e4m3 Q (B x H x S x D) and K (B x KVH x S_kv x D), each
with a per-tensor f32 descale factor (the true values are q_descale * Q and so on, the
factors read from device memory, as torch passes them), and V given transposed
(vt_layout: B x KVH x D x keys), since fp8 wgmma takes both operands K-major only and P V
reduces over the keys. O is bf16 like Q's shape, the f32 log-sum-exp (B x H x S) of the
true scores too. `make_attention_fp8(d, causal)` builds it for head dim 64 or 128, causal
(aligned to the end) or not.

The structure is the bf16 kernel's (attention.py, whose softmax, tile walk and O store it
calls): one producer warp, two consumer warpgroups of 64 query rows, the next block's S
issued before P V of the current one, the wait for P V held after the softmax. What differs:

- S = Q K^T is one e4m3 wgmma chain of D / 32 k32 steps (Q and K tiles in one swizzled row
  of D bytes each: a 128-byte swizzle at D = 128, 64-byte at 64). The descales fold into the
  softmax's scale: scale_log2 * q_descale * k_descale.
- P is scaled by 2^8 (Softmax's offset: exp2 of the score minus the row max plus 8), so
  that P in (0, 256] sits in e4m3's normal range (its smallest normal is 2^-6: unscaled,
  a typical P of e^-4 would be subnormal) and below its 448; the row sums carry the same
  2^8, so O = (P V) / l needs no further factor but v_descale. e4m3 keeps P to 2^-4
  relative; the row max moves at every block (no lazy max: a max held 2^8 behind would
  push P past 448).
- P goes to the P V wgmma from registers, converted to e4m3 in place (frag(p, k) of an
  e4m3 array, four to a 32-bit register). An fp8 A fragment holds columns 4l .. 4l + 3 (and
  16 + ...) of quad lane l where the S accumulator holds 2l, 2l + 1, 8 + 2l, 9 + 2l: so the
  thread's own P values, taken row by row, land in the fragment's k slots in a fixed
  permutation of the keys within each 16 (slot 4l + 2a + b holds key 8a + 2l + b). No
  shuffle undoes it: V^T's keys come permuted the same way (VT_AXES), so that P V sums the
  same products.
- Each key block's P V starts a fresh accumulator (tmp), added to O's in f32 with the
  rescale (one fma an element, as the rescale alone took one multiply): the tensor cores'
  fp8 sums keep about 14 bits (DeepGEMM's measurement, the reason gemm_fp8's block-scaled
  kernel promotes every K block), and O's sum over S_kv keys would otherwise run inside
  them. `promote=False` builds the other way, for comparison.
- V^T is read by TMA in 128-key boxes of D rows, its keys padded with zeros to a multiple
  of 16 and permuted within each 16 (vt_layout); the torch op writes it (one read and write
  of V, small beside the S_kv^2 work)."""

import math
from typing import Any, NamedTuple

import numpy as np

import ptxdsl
from ptxdsl import array, bf16, e4m3, f32, ptr, s32, tmap, u32
from ptxdsl.kernels.family import Family

from .attention import (
    BN,
    LN2,
    Lengths,
    Softmax,
    block_rows,
    causal_stop,
    reference,
    store_o,
    walk,
    walk_tiles,
)
from .wgmma import consumer_lanes

OFFSET = 8.0  # P is scaled by 2^OFFSET: its largest value 256, inside e4m3's 448
NWG = 2  # consumer warpgroups: a tile is 128 query rows
KEY_PITCH = 16  # V^T's rows: a multiple of 16 keys (TMA's 16-byte pitch, the key order's)
# V^T's key order: slot 4l + 2a + b of each 16 holds key 8a + 2l + b (the P fragments' order,
# see the module's docstring). V (B, KVH, keys, D), its keys padded to a multiple of 16 and
# seen as (B, KVH, groups, a, l, b, D), goes to these axes, then to (B, KVH, D, keys)
VT_AXES = (0, 1, 6, 2, 4, 3, 5)
VT_SPLIT = (2, 4, 2)  # (a, l, b) of a group of 16 keys


class Rows(NamedTuple):
    """A consumer's rows of a finished tile: O is acc times fac (1 / the row sums, times
    v_descale); the rows' maxima mx and sums l (P's 2^OFFSET in them), r0 the first row."""

    acc: Any
    fac: Any
    mx: Any
    l: Any  # noqa: E741
    r0: Any


def make_attention_fp8(d: int = 128, causal: bool = False, stages: tuple[int, int] = (2, 2),
                       promote: bool = True) -> ptxdsl.KernelDef:
    """The e4m3 forward kernel for head dim `d` (64 or 128), with the causal mask or
    without; `stages`: of the K and the V^T pipeline. `promote`: each key block's P V goes
    into a fresh accumulator, added to O's in f32 (as the block-scaled fp8 GEMM promotes
    every K block), so the tensor cores' fp8 sums, which keep about 14 bits, never run past
    128 keys; without it O accumulates in the tensor cores over all S_kv keys."""
    if d not in (64, 128):
        raise ValueError(f"make_attention_fp8: head dim is 64 or 128, not {d}")
    bm = block_rows(NWG)
    cz = int(causal)
    sw = d  # the swizzle of Q's and K's tiles: one row of d bytes
    name = f"attention_fp8_d{d}{'_causal' if cz else ''}" + \
        ("" if stages == (2, 2) else f"_s{stages[0]}{stages[1]}") + \
        ("" if promote else "_unpromoted")
    softmax = Softmax(bm=bm, causal=cz, plain=True, lazy=0, offset=OFFSET)

    def body(k, q, kt, vt, o, lse, q_descale, k_descale, v_descale, seq, kv_seq, heads,
             kv_heads, batch, scale_log2) -> None:
        qp = k.pipeline("qp", 1, q=(e4m3, [bm, d], 1024, sw))
        kp = k.pipeline("kp", stages[0], k=(e4m3, [BN, d], 1024, sw))
        vp = k.pipeline("vp", stages[1], v=(e4m3, [d, BN], 1024, 128))
        os_ = k.shared("os", bf16, [NWG, d // 64, 64, 64], align=1024, swizzle=128)
        mblocks = k.let("mblocks", (seq + (bm - 1)) / bm)
        sq = Lengths(seq=seq, kv_seq=kv_seq, nkv=k.let("nkv", (kv_seq + 127) / 128),
                     off=k.let("off", kv_seq - seq))
        wk = walk(k, mblocks, batch, heads, kv_heads, cz)
        with k.role("producer", 0, 4, regs=24):
            with k.if_((k.warp == 0) & k.elect()):
                with walk_tiles(k, wk, mblocks) as (mb, bh):
                    qh = k.let("qh", (bh % heads).to(s32))
                    bb = k.let("bb", (bh / heads).to(s32))
                    kvh = k.let("kvh", (bh % heads / wk.group).to(s32))
                    k.acquire(qp)
                    k.tma_load(qp.q, q, [0, (mb * bm).to(s32), qh, bb])
                    k.commit(qp)
                    with k.for_("j", 0, causal_stop(k, mb, sq, bm, cz)) as j:
                        k.acquire(kp)
                        k.tma_load(kp.k, kt, [0, (j * BN).to(s32), kvh, bb])
                        k.commit(kp)
                        k.acquire(vp)
                        k.tma_load(vp.v, vt, [(j * BN).to(s32), 0, kvh, bb])
                        k.commit(vp)
        with k.role("consumer", 4, 4 + 4 * NWG, regs=240):
            lanes = consumer_lanes(k)
            sl2 = k.let("sl2", scale_log2 * q_descale[0] * k_descale[0])
            vd = k.let("vd", v_descale[0])
            with walk_tiles(k, wk, mblocks) as (mb, bh):
                rows = consume(k, mb, causal_stop(k, mb, sq, bm, cz), sq, lanes,
                               (qp, kp, vp), (sl2, vd))
                store_o(k, o, rows.acc, rows.fac, os_, mb, bh, heads, lanes, bm, d)
                with k.for_("i", 0, 2, unroll=True) as i:  # the LSE of the true scores
                    r = rows.r0 + i * 8
                    with k.if_((k.laneid % 4 == 0) & (r < seq)):
                        lse[bh * seq + r] = (rows.mx[i] * sl2 + k.lg2(rows.l[i])
                                             - OFFSET) * LN2
            with k.if_(lanes[1]):
                k.bulk_wait(0)

    def consume(k, mb, stop, sq, lanes, bufs, scales) -> Rows:
        """A consumer warpgroup's tile: its 64 rows of O over key blocks 0 .. stop."""
        wg, _, row, col = lanes
        qp, kp, vp = bufs
        sl2, vd = scales
        r0 = k.let("r0", mb * bm + wg * 64 + row)
        s = k.let("s", type=array(f32, 64))
        p = k.let("p", type=array(e4m3, 64))
        mx = k.let("mx", type=array(f32, 2))
        l = k.let("l", type=array(f32, 2))  # noqa: E741
        if promote:  # O's accumulator, summed in f32 from each block's tmp
            acc = k.let("acc", 0.0, array(f32, d // 2))
            tmp = k.let("tmp", type=array(f32, d // 2))
            fac = k.let("fac", 1.0, array(f32, 2))
            prev = k.let("prev", 1.0, array(f32, 2))  # the factor acc still lacks
        else:
            acc = tmp = k.let("acc", type=array(f32, d // 2))
            fac = k.let("fac", type=array(f32, 2))

        def qk() -> None:
            """S = Q K_j^T, issued as one group."""
            k.wgmma_fence()
            with k.for_("kk", 0, d // 32, unroll=True) as kk:
                k.wgmma(s, qp.q[wg * 64, kk * 32], kp.k[0, kk * 32], kk > 0)
            k.wgmma_commit()

        def pv(accumulate) -> None:
            """P V_j with P from registers, issued as one group: into tmp afresh (promoted),
            or added to acc."""
            k.wgmma_fence()
            with k.for_("kk", 0, BN // 32, unroll=True) as kk:
                k.wgmma(tmp, k.frag(p, kk), vp.v[0, kk * 32],
                        (kk > 0) if promote else accumulate | (kk > 0))
            k.wgmma_commit()

        def add(factor) -> None:
            """Promoted: O's acc, scaled to the basis of the block in tmp, plus tmp."""
            with k.for_("x", 0, d // 2, unroll=True) as x:
                acc[x] = k.fma(acc[x], factor[x % 4 / 2], tmp[x])

        def to_e4m3() -> None:
            """P (f32 in s) as e4m3 fragments: element 8h + 4i + c of fragment kk (row half
            i) is s's element of key block 4kk + 2h + c / 2, row half i, column c % 2."""
            with k.for_("kk", 0, 4, unroll=True) as kk:
                with k.for_("h", 0, 2, unroll=True) as h:
                    with k.for_("i", 0, 2, unroll=True) as i:
                        with k.for_("c", 0, 4, unroll=True) as c:
                            p[16 * kk + 8 * h + 4 * i + c] = \
                                s[16 * kk + 8 * h + 4 * (c / 2) + 2 * i + c % 2].to(e4m3)

        k.wait(qp)
        k.wait(kp)
        qk()
        k.wgmma_wait(0)
        k.release(kp)
        softmax(k, s, mx, l, fac, col, 0, mb, r0, sq, sl2, True)
        to_e4m3()
        with k.for_("j", 1, stop) as j:
            k.wait(kp)
            k.wait(vp)
            qk()
            pv(j > 1)
            k.wgmma_wait(1)
            k.release(kp)
            if promote:  # acc lacks the factor of the block before tmp's
                with k.for_("i", 0, 2, unroll=True) as i:
                    prev[i] = fac[i]
            softmax(k, s, mx, l, fac, k.let("c0", j * BN + col), j, mb, r0, sq, sl2, False)
            k.fence_cta()  # the wait for P V stays after the softmax
            k.wgmma_wait(0)
            k.release(vp)
            if promote:
                add(prev)
            else:
                with k.for_("x", 0, d // 2, unroll=True) as x:
                    acc[x] = acc[x] * fac[x % 4 / 2]
            to_e4m3()
        k.wait(vp)
        pv(stop > 1)
        k.wgmma_wait(0)
        k.release(vp)
        k.release(qp)
        if promote:
            add(fac)
        with k.for_("i", 0, 2, unroll=True) as i:
            l[i] = l[i] + k.shfl_xor(l[i], 1)
            l[i] = l[i] + k.shfl_xor(l[i], 2)
            fac[i] = k.rcp(l[i]) * vd
        return Rows(acc=acc, fac=fac, mx=mx, l=l, r0=r0)

    def attention_fp8(k, q: tmap(e4m3, 4), kt: tmap(e4m3, 4), vt: tmap(e4m3, 4),
                      o: tmap(bf16, 4), lse: ptr(f32), q_descale: ptr(f32),
                      k_descale: ptr(f32), v_descale: ptr(f32), seq: u32, kv_seq: u32,
                      heads: u32, kv_heads: u32, batch: u32, scale_log2: f32) -> None:
        body(k, q, kt, vt, o, lse, q_descale, k_descale, v_descale, seq, kv_seq, heads,
             kv_heads, batch, scale_log2)

    return ptxdsl.kernel(threads=128 * (NWG + 1), name=name)(attention_fp8)


attention_fp8 = make_attention_fp8()


def key_pitch(kv_seq: int) -> int:
    """V^T's row length in keys: kv_seq rounded up to KEY_PITCH."""
    return -(-kv_seq // KEY_PITCH) * KEY_PITCH


def vt_layout(v: np.ndarray) -> np.ndarray:
    """V (B, KVH, S_kv, D) as the kernel reads it: V^T (B, KVH, D, key_pitch(S_kv)), the
    keys padded with zeros and in VT_AXES's order within each 16."""
    b, kvh, skv, d = v.shape
    pitch = key_pitch(skv)
    padded = np.zeros((b, kvh, pitch, d), v.dtype)
    padded[:, :, :skv] = v
    return padded.reshape(b, kvh, pitch // KEY_PITCH, *VT_SPLIT, d).transpose(VT_AXES) \
        .reshape(b, kvh, d, pitch)


def example(rng: np.random.Generator, batch: int = 1, heads: int = 2, kv_heads: int = 1,
            seq: int = 200, kv_seq: int | None = None, d: int = 128, causal: bool = False,
            grid: int | None = None) -> dict:
    """Random e4m3 Q, K, V quantised per tensor (amax to 448) from normals of different
    magnitudes, V handed over as vt_layout makes it; the reference is
    attention in float64 on the dequantised values. The tolerance is P's e4m3 rounding at
    its worst, every P off by 2^-4 of itself the same way: 2^-4 of the attention of |V|
    (an output element's sum of P |V| / l), plus 2^-7 relative for O's bf16 rounding (at
    random inputs the error comes to a quarter to a half of it)."""
    from ptxdsl.fp8 import MAX, quantize

    kv_seq = seq if kv_seq is None else kv_seq
    if causal and kv_seq < seq:
        raise ValueError(f"causal attention needs kv_seq >= seq, got {kv_seq} < {seq}")
    shape, kv_shape = (batch, heads, seq, d), (batch, kv_heads, kv_seq, d)
    parts, deq = {}, {}
    for name, sh, mag in (("q", shape, 2.0), ("k", kv_shape, 0.5), ("v", kv_shape, 3.0)):
        x = rng.standard_normal(sh).astype(np.float32) * mag
        descale = np.float32(np.abs(x).max() / MAX["e4m3"])
        parts[name] = quantize(x / descale, e4m3)
        parts[name + "_descale"] = np.array([descale], np.float32)
        deq[name] = parts[name].astype(np.float64) * float(descale)
    scale = 1.0 / math.sqrt(d)
    ref_o, ref_lse = reference(deq["q"], deq["k"], deq["v"], causal, scale)
    bm = block_rows(NWG)
    qk_box = {"swizzle": f"{d}B"}
    bound, _ = reference(deq["q"], deq["k"], np.abs(deq["v"]), causal, scale)
    return {"grid": grid or min(132, -(-seq // bm) * batch * heads),
            "inputs": {"q": parts["q"], "kt": parts["k"], "vt": vt_layout(parts["v"]),
                       "q_descale": parts["q_descale"], "k_descale": parts["k_descale"],
                       "v_descale": parts["v_descale"], "seq": seq, "kv_seq": kv_seq,
                       "heads": heads, "kv_heads": kv_heads, "batch": batch,
                       "scale_log2": np.float32(scale * math.log2(math.e))},
            "tensor_maps": {"q": {"box": (1, 1, bm, d), **qk_box},
                            "kt": {"box": (1, 1, BN, d), **qk_box},
                            "vt": {"box": (1, 1, d, BN), "swizzle": "128B"},
                            "o": {"box": (1, 1, 64, 64), "swizzle": "128B"}},
            "outputs": {"o": np.zeros(shape, np.uint16),
                        "lse": np.zeros(batch * heads * seq, np.float32)},
            # the LSE as (B, H, S, 1), so that O's per-element tolerance broadcasts over it
            # (loose for it: tests/interp/test_attention_fp8.py checks it to 2^-16)
            "expected": {"o": ref_o, "lse": ref_lse[..., None]},
            "rtol": 2 ** -7, "atol": 2 ** -4 * bound}


SMALL = {"batch": 1, "heads": 2, "kv_heads": 1, "seq": 100, "kv_seq": 190, "grid": 2}


FAMILY = Family(
    name="attention_fp8",
    summary="FlashAttention-3-style forward attention, e4m3 Q, K, V (per-tensor descales), "
            "bf16 O, head dim 64 or 128",
    factory=make_attention_fp8,
    defaults={"d": 128, "causal": False},
)
