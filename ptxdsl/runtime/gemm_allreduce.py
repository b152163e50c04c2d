"""A row-parallel linear layer for decoding in one launch a rank, over torch.distributed
(ptxdsl/kernels/gemm_allreduce.py): every rank holds A_r (M x k_local) and W_r (N x k_local),
a K-shard, and gets C = sum over ranks of A_r W_r^T, the same bits on every rank.

    gar = GemmAllReduce(m, n, k_local)       # a collective: every rank builds one
    gar(a, w, out)                           # out (M x N bf16) = the sum over ranks

The plan owns symmetric memory (the f32 slots partial tiles are stored into; past 8 rows, the
bf16 slots the owners push their parts of the results into; and the flag words) and counts
its calls; every rank calls it the same number of times, in the same order, on one stream
each, as AllReduce."""

from __future__ import annotations

from functools import cache
from typing import Any

from ..errors import LaunchError
from .distributed import (
    SymmetricBuffer,
    _dist,
    _stream_of,
    agree,
    local_device,
    on_device,
    one_stream,
    refuse_capture,
)
from .driver import device_ordinal


@cache
def _program(mp: int, bw: int, device: int, watchdog_ms: int) -> Any:
    from ..compiler import compile
    from ..kernels.gemm_allreduce import make_gemm_allreduce

    return compile(make_gemm_allreduce(mp, bw), device=device, watchdog_ms=watchdog_ms)


class GemmAllReduce:
    """A plan for C = sum over the ranks of `group` of A_r @ W_r^T: A_r (m x k_local, m from
    1 to 256) and W_r (n x k_local) bf16 on each rank, C (m x n) bf16, the same bits on every
    rank. m up to 8: every rank adds every rank's K ranges' f32 partials in rank order,
    rounded once; more: each rank's K ranges are added at home and rounded to bf16, and the
    owner rank of each part of a tile adds the ranks' sums in rank order in f32, rounds and
    sends its part to every rank (torch.mm + NCCL all_reduce rounds as often, or more).

    `bw` is the weight tile (64, 128 or 256 rows of N; 256 takes m up to 128), `splits` the
    K ranges of a tile (0: `gemm_allreduce.pick_splits`). a, w and out are row-major device
    arrays (torch tensors, DeviceArrays) on the plan's GPU; k_local a multiple of 8 (TMA's
    16-byte rows). With `watchdog_ms`, a peer that never launches ends in a named
    DeviceError instead of a hang. Refused: a call under CUDA graph capture (a replay would
    repeat the launch count the flags compare) and a call on another stream than the first.
    Like the fused layers, a launch needs every CTA resident (one an SM): no other kernel may
    hold SMs for good while it runs."""

    def __init__(self, m: int, n: int, k_local: int, *, device: Any = None, group: Any = None,
                 watchdog_ms: int = 0, bw: int = 128, splits: int = 0):
        from ..kernels import gemm_allreduce as ga
        from ..kernels import gemm_smallm as sm
        from .driver import device_info

        if bw not in (64, 128, 256):
            raise LaunchError(f"GemmAllReduce: bw is 64, 128 or 256, got {bw}")
        top = sm.max_mp(bw)
        if not 1 <= m <= top or n < 1 or k_local < 1 or k_local % 8 or splits < 0:
            raise LaunchError(f"GemmAllReduce needs 1 <= m <= {top} (with bw {bw}), n >= 1, "
                              f"k_local a positive multiple of 8 (16-byte rows for TMA) and "
                              f"splits >= 0, got m={m}, n={n}, k_local={k_local}, "
                              f"splits={splits}")
        dist = _dist()
        self.m, self.n, self.k, self.bw, self.group = m, n, k_local, bw, group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.device = local_device() if device is None else device_ordinal(device)
        sms = device_info(self.device).sm_count
        self.mp = sm.pad_m(m, top)
        self.splits = splits or ga.pick_splits(m, n, k_local, bw, self.mp, sms)
        self.grid = sm.launch_grid(m, n, k_local, bw, self.mp, self.splits, sms)
        agree(dist, group, "GEMM + all-reduce plans (m, n, k_local, bw, splits, grid)",
              (m, n, k_local, bw, self.splits, self.grid))
        size = ga.region_elems(m, n, k_local, bw, self.mp, self.splits, self.world)
        self.ws = SymmetricBuffer(size * 4, "f32", device=self.device, group=group)
        self.res = SymmetricBuffer(ga.result_elems(m, n, bw, self.mp, self.world) * 2, "bf16",
                                   device=self.device, group=group) \
            if ga.owners(self.mp) else None
        words = ga.flag_words(m, n, k_local, bw, self.mp, self.splits, self.world)
        self.sig = SymmetricBuffer(words * 4, "u32", device=self.device, group=group)
        import numpy as np

        self.sig.local.copy_from_host(np.zeros(self.sig.local.shape, np.uint32))
        self.sig.barrier()  # every rank's flags are zero before any launch
        self._ws_all = self.ws.stacked().array(dtype="f32")
        self._res = {} if self.res is None else {
            "res": self.res.stacked().array(dtype="bf16"), "res_stride": self.res.stride // 2}
        self._sig_all = self.sig.stacked().array(dtype="u32")
        self.kernel = _program(self.mp, bw, self.device, watchdog_ms).kernel(device=self.device)
        self.epoch = 0
        self._maps: dict = {}  # (operand, shape, strides) -> its tensor map, re-pointed a call
        self._stream: int | None = None  # the stream of the first call: every call's

    def _map(self, x: Any, rows: int, box_rows: int, what: str) -> Any:
        """The tensor map of bf16 operand `x` (rows x k_local, row-major), encoded once per
        layout and re-pointed to x's address."""
        from ..kernels.gemm_smallm import BK
        from .interop import contiguous_strides, describe
        from .tensormap import TensorMap

        d = describe(x, what)
        self._checked(x, d, (rows, self.k), what)
        if d.strides != contiguous_strides(d.shape, 2):
            raise LaunchError(f"{what} must be row-major (contiguous), got strides {d.strides} "
                              "(bytes)")
        key = (what, d.shape, d.strides)
        tm = self._maps.get(key)
        if tm is None:
            tm = self._maps[key] = TensorMap(x, (box_rows, BK), dtype="bf16", swizzle="128B",
                                             device=self.device)
        return tm.at(d.ptr)

    def _checked(self, x: Any, d: Any, shape: tuple, what: str) -> None:
        if tuple(d.shape) != shape or d.elem.name != "bf16":
            raise LaunchError(f"{what} must be a bf16 array of shape {shape}, got {d.elem} "
                              f"{tuple(d.shape)}")
        on_device(x, self.device, what)

    def __call__(self, a: Any, w: Any, out: Any = None, stream: Any = None) -> Any:
        """out (m x n bf16; default a new torch tensor where a is one) = the sum over ranks of
        a @ w^T. Returns out."""
        from ..kernels.gemm_allreduce import arguments
        from .interop import contiguous_strides, describe

        ta = self._map(a, self.m, self.mp, "a")
        tw = self._map(w, self.n, self.bw, "w")
        if out is None:
            if not hasattr(a, "new_empty"):
                raise LaunchError("GemmAllReduce needs an out array where a is not a torch "
                                  "tensor")
            out = a.new_empty((self.m, self.n))
        d = describe(out, "out")
        self._checked(out, d, (self.m, self.n), "out")
        if d.strides != contiguous_strides(d.shape, 2):
            raise LaunchError(f"out must be row-major (contiguous), got strides {d.strides} "
                              "(bytes)")
        handle = refuse_capture(self.device, _stream_of(stream, self.device), "gemm_allreduce")
        self._stream = one_stream(self._stream, handle, "gemm_allreduce")
        args = arguments(tw, ta, out, self._ws_all, self.ws.stride // 4, self._sig_all,
                         self.sig.stride // 4, self.rank, self.world, self.m, self.n, self.k,
                         self.splits, self.epoch + 1, **self._res)
        self.kernel[self.grid, None, handle](*args.values())  # positional: the fast path
        self.epoch += 1  # launches enqueued (a refused one does not count)
        return out

    def free(self) -> None:
        """Release the symmetric memory (a collective)."""
        for buf in (self.ws, self.res, self.sig):
            if buf is not None:
                buf.free()
