"""Python API: the DSMEM exchange of samples/dsmem_exchange.py with its first cluster_sync
moved after the store: the partner may not have started."""

import ptxdsl
from ptxdsl import f32, ptr


def api_peer_before_sync(k, src: ptr(f32), dst: ptr(f32)):
    box = k.shared("box", f32, [128])
    tid = k.let("tid", k.tid.x)
    g = k.let("g", k.ctaid.x * 128 + tid)
    k.peer(box, k.cluster_ctarank ^ 1)[tid] = src[g] * 2.0
    k.cluster_sync()
    dst[g] = box[tid]


kernel = ptxdsl.kernel(api_peer_before_sync, threads=128, cluster=2)
