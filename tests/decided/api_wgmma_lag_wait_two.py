"""Python API: the lagging release written for any stage count, with wgmma_wait(2): the
group of the previous iteration may still read the stage handed back to the producer.
(`build(1)` is the correct form, valid/api_wgmma_lag_release.py.)"""

import ptxdsl
from ptxdsl import f32, ptr

STAGES, KTILES = 2, 6


def build(lag: int) -> ptxdsl.KernelDef:
    def api_wgmma_lag(k, src: ptr(f32), out: ptr(f32)):
        sa = k.shared("sa", f32, [STAGES, 64, 32], align=1024, swizzle=128)
        sb = k.shared("sb", f32, [STAGES, 64, 32], align=1024, swizzle=128)
        full = k.mbarrier("full", count=1, n=STAGES)
        empty = k.mbarrier("empty", count=4, n=STAGES)
        with k.if_(k.tid.x == 0):
            for s in range(STAGES):
                k.mbarrier_init(full[s])
                k.mbarrier_init(empty[s])
            k.fence_mbarrier_init()
        k.bar_sync(0)
        with k.if_(k.warp == 4):
            with k.if_(k.elect()):
                with k.for_("kt", 0, KTILES) as kt:
                    s = k.let("s", kt % STAGES)
                    k.mbarrier_wait(empty[s], ((kt / STAGES) & 1) ^ 1)
                    k.mbarrier_arrive_expect_tx(full[s], 16384)
                    k.bulk_load(sa[s], src[kt * 4096], full[s])
                    k.bulk_load(sb[s], src[kt * 4096 + 2048], full[s])
        with k.else_():
            acc = k.let("acc", None, type=ptxdsl.array(f32, 32))
            with k.for_("kt", 0, KTILES) as kt:
                s = k.let("s", kt % STAGES)
                k.mbarrier_wait(full[s], (kt / STAGES) & 1)
                k.wgmma_fence()
                with k.for_("kk", 0, 4, unroll=True) as kk:
                    k.wgmma(acc, sa[s, 0, kk * 8], sb[s, 0, kk * 8], (kt > 0) | (kk > 0))
                k.wgmma_commit()
                k.wgmma_wait(lag)
                with k.if_((kt > 0) & k.elect()):  # the stage of the previous iteration
                    k.mbarrier_arrive(empty[(kt + STAGES - 1) % STAGES])
            k.wgmma_wait(0)
            with k.if_(k.elect()):
                k.mbarrier_arrive(empty[(KTILES - 1) % STAGES])
            out[k.tid.x] = acc[0]

    return ptxdsl.kernel(api_wgmma_lag, threads=160)


kernel = build(2)
