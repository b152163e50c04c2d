"""Python API: a ring built in a loop over its stage count, whose consumers wait with the
producers' parity (the '^ 1' of a fresh empty barrier): every wait on 'full' returns at once.
(`build(0)` is the correct form, valid/api_wait_ring.py.)"""

import ptxdsl
from ptxdsl import f32, ptr, u32

STAGES = 3


def build(flip: int) -> ptxdsl.KernelDef:
    def api_wait_ring(k, src: ptr(f32), out: ptr(f32), ntiles: u32):
        stage = k.shared("stage", f32, [STAGES, 256], align=128)
        full = k.mbarrier("full", count=1, n=STAGES)
        empty = k.mbarrier("empty", count=128, n=STAGES)
        with k.if_(k.tid.x == 0):
            for s in range(STAGES):
                k.mbarrier_init(full[s])
                k.mbarrier_init(empty[s])
            k.fence_mbarrier_init()
        k.bar_sync(0)
        with k.if_(k.warp == 0):
            with k.if_(k.elect()):
                with k.for_("t", 0, ntiles) as t:
                    s = k.let("s", t % STAGES)
                    k.mbarrier_wait(empty[s], ((t / STAGES) & 1) ^ 1)
                    k.mbarrier_arrive_expect_tx(full[s], 1024)
                    k.bulk_load(stage[s], src[t * 256], full[s])
        with k.if_(k.tid.x >= 128):
            c = k.let("c", k.tid.x - 128)
            acc = k.let("acc", 0.0, type=f32)
            with k.for_("t", 0, ntiles) as t:
                s = k.let("s", t % STAGES)
                k.mbarrier_wait(full[s], ((t / STAGES) & 1) ^ flip)
                k.assign(acc, acc + stage[s, c])
                k.mbarrier_arrive(empty[s])
            out[k.ctaid.x * 128 + c] = acc

    return ptxdsl.kernel(api_wait_ring, threads=256)


kernel = build(1)
