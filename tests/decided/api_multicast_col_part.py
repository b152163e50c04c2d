"""Python API: a 2 x 2 cluster shares tiles along its columns (cluster_col_mask()), but each
CTA picks its part by its column (x) instead of its place in the column (y): the two CTAs
of a column deliver the same part. (`build("y")` is the correct form,
valid/api_multicast_col_part.py.)"""

import ptxdsl
from ptxdsl import f32, ptr, u32


def build(axis: str) -> ptxdsl.KernelDef:
    def api_multicast_col_part(k, src: ptr(f32), dst: ptr(f32), ntiles: u32):
        ring = k.pipeline("ring", 2, row=(f32, [2, 32], 128))
        with k.role("producer", 0, 1):
            with k.if_(k.elect()):
                part = k.let("part", getattr(k.cluster_ctaid, axis))
                with k.for_("t", 0, ntiles) as t:
                    k.acquire(ring)
                    k.bulk_load_multicast(ring.row[part], src[(t * 2 + part) * 32],
                                          k.cluster_col_mask())
                    k.commit(ring)
        with k.role("consumer", 1, 2):
            j = k.let("j", k.tid.x - 32)
            acc = k.let("acc", 0.0, type=f32)
            with k.for_("t", 0, ntiles):
                k.wait(ring)
                k.assign(acc, acc + ring.row[0, j] + ring.row[1, j])
                k.release(ring)
            dst[(k.ctaid.y * k.nctaid.x + k.ctaid.x) * 32 + j] = acc

    return ptxdsl.kernel(api_multicast_col_part, threads=64, cluster=(2, 2))


kernel = build("x")
