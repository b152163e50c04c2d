"""Tensor-parallel linear layers with the communication fused into the GEMM, one process per
GPU under torchrun: the host side of the library's ag_gemm.ptxdsl and gemm_rs.ptxdsl.

    ag = AllGatherGemm(m_local, k, n)        # a collective: every rank builds one
    ag.shard().copy_from_host(my_rows)       # this rank's M / world rows of A (or write them)
    ag(b, c)                                 # C (M x n) = all_gather(A) @ B^T; ag.gathered()
    rs = GemmReduceScatter(m_local, n, k_local)
    rs(a, b)                                 # rs.shard(): rows rank * m_local .. of sum(A @ B^T)

Each object is a plan for one shape on one process group: it owns the symmetric memory
(the gathered A, or the C shards, and the signal words) and counts its launches (`epoch`);
every rank calls it the same number of times, in the same order. Shapes are compared across
ranks when the plan is built, so a mismatch is an error on every rank, not a hang. With
`watchdog_ms`, a rank whose peer never launches ends in a named DeviceError instead of
spinning forever (and so does a peer that starts more than `watchdog_ms` late).

The kernels' CTAs wait for one another (and for the peers'), so all of a launch's CTAs must
be resident at once: the grid is at most one CTA an SM, which holds while no other
persistent kernel occupies SMs at the same time (a concurrent kernel on another stream that
never yields its SMs could make a launch wait for it).

`interp_ag(world, ...)` and `interp_rs(world, ...)` run either kernel for `world` ranks at
once in the CPU interpreter on small random data and return what each rank computed with
numpy's answer.
"""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

import ptxdsl
from ptxdsl import kernels
from ptxdsl import runtime as rt
from ptxdsl.errors import LaunchError
from ptxdsl.runtime.distributed import agree as _agree
from ptxdsl.runtime.dtypes import bf16_to_f32, f32_to_bf16
from ptxdsl.swizzle import chunk_box, chunk_columns
from ptxdsl.target import target

# the kernels are the library's (ptxdsl/kernels/ag_gemm.ptxdsl, gemm_rs.ptxdsl)
LIBRARY = Path(kernels.__file__).resolve().parent
BM, BN, BK = 128, 256, 64  # tile rows, tile columns (the widest), k-block


@cache
def program(name: str, device: int, watchdog_ms: int = 0, defines: tuple = ()) -> Any:
    """ag_gemm or gemm_rs compiled for GPU `device` (`defines`: (name, value) pairs of its
    compile-time parameters)."""
    return ptxdsl.compile(LIBRARY / f"{name}.ptxdsl", device=device, watchdog_ms=watchdog_ms,
                          defines=dict(defines))


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def ag_chunk(world: int, m_local: int, k: int, grid: int) -> int:
    """k-blocks per gather unit: 4, or 1 when units of 4 would leave most CTAs with nothing
    to pull (few remote panels, as when decoding): more pulls then run at once."""
    return 4 if (world - 1) * cdiv(m_local, BM) * cdiv(cdiv(k, BK), 4) >= grid else 1


def ag_pullers(world: int, m_local: int, grid: int, pace: int) -> int:
    """CTAs that pull gather units: every CTA, or when every tile runs in the first wave
    (`pace`, decoding) 16 per remote row panel: the units then go k-block by k-block, and a
    few at a time put the first-needed units first on the link (all 112 CTAs pulling a
    unit each at once landed the first 6-10 us in, 16 at 4-5 us; 2 x H200). Every remote
    panel's tiles consume its units at once, so the pullers grow with the panels."""
    return min(grid, 16 * (world - 1) * cdiv(m_local, BM)) if pace else grid


def ag_width(world: int, m_local: int, n: int, sms: int) -> int:
    """ag_gemm's tile width: 256, or 224 where 224-wide tiles still fit in one wave and there
    are more of them (decoding: 2 x 64 fill 128 SMs at N 14336 where 256-wide ones fill
    112)."""
    panels = world * cdiv(m_local, BM)
    wide = panels * cdiv(n, BN)
    return 224 if wide < panels * cdiv(n, 224) <= sms else BN


def ag_staging(pace: int, bn: int = BN) -> tuple[int, int]:
    """ag_gemm's (pipeline stages, C chunks staged at once) at tile width bn: with `pace` (one
    tile a CTA, decoding) 4 stages, C going out one chunk at a time through a chunk-sized
    staging tile; otherwise 3 stages and all of a tile's chunks at once (2 x H200, one
    process: decode 111.3 -> 107.3 us a call; at 8192 tokens, 28 tiles a CTA, the chunked
    epilogue costs 3%)."""
    return (4, 1) if pace else (3, bn // chunk_columns(bn, 2))


def ag_flag_words(world: int, m_local: int, k: int, ck: int) -> int:
    """ag_gemm's `flags` words: a bit per gather unit (ck k-blocks), whole words a panel."""
    return (world - 1) * cdiv(m_local, BM) * cdiv(cdiv(cdiv(k, BK), ck), 32)


def rs_counters(m_local: int, n: int, bn: int = BN) -> int:
    """Counter words of one rank's C shard: one per 64-row half of each tile."""
    return cdiv(m_local, BM) * cdiv(n, bn) * 2


RS_SMEM = target("sm_90a").smem_bytes - 1024  # a CTA's shared memory, less the barriers' room
RS_WIDTHS = (64, 128, 192, 256)


def rs_stages(bn: int) -> int:
    """gemm_rs's pipeline stages at tile width bn: as many as fit beside the staging tile
    (2 x bn x 64 bf16), at most 6 (256: 3, 192: 4, 128 and 64: 6)."""
    stage = (BM + bn) * BK * 2
    return min(6, (RS_SMEM - 2 * bn * 64 * 2) // stage)


def rs_tiling(world: int, m_local: int, n: int, k_local: int, sms: int, splits: int = 0,
              bn: int = 0) -> tuple[int, int, int]:
    """gemm_rs's (tile width, pipeline stages, K ranges a tile) for a shape; `splits` and
    `bn` as the caller asked (0: chosen).

    256-wide tiles, and as many K ranges a tile as fill the GPU (at most 4) when the tiles
    alone leave SMs idle. Where 256-wide tiles would leave half the SMs idle or more and
    128-wide ones fit in a wave (decoding), 128-wide tiles, with K ranges only where those
    still leave SMs idle: a tile's partial crosses the link half as often (at 256 tokens,
    once instead of twice: half the bytes added into the peers after the main loop), and
    the smaller stages leave room for more of them (decode reduce-scatter on 2 x H200:
    256-wide in 2 ranges 103.2 us; 128-wide with 3, 4, 5, 6 stages 134.2, 107.2, 97.2,
    97.1)."""
    tiles = world * cdiv(m_local, BM)
    if bn not in (0, *RS_WIDTHS):
        raise LaunchError(f"gemm_rs tiles are {', '.join(map(str, RS_WIDTHS))} columns wide, "
                          f"not {bn}")
    if not bn:
        bn = 128 if splits <= 1 and tiles * cdiv(n, 256) * 2 <= sms and \
            tiles * cdiv(n, 128) <= sms else BN
    want = splits if splits else min(sms // (tiles * cdiv(n, bn)), 4)
    return bn, rs_stages(bn), max(1, min(want, cdiv(k_local, BK)))


class _Plan:
    """What both fused layers share: the process group, this rank's GPU, the signal words
    in symmetric memory (zeroed once) and the launch count."""

    kernel_name = ""

    def __init__(self, device: Any, group: Any, watchdog_ms: int):
        from ptxdsl.runtime.distributed import _dist, local_device

        self.dist, self.group = _dist(), group
        self.rank, self.world = self.dist.get_rank(group), self.dist.get_world_size(group)
        self.device = local_device() if device is None else device
        self.epoch = 0
        self._launchers: dict = {}
        self._maps: dict = {}
        self.sms = rt.device_info(self.device).sm_count
        # the kernel's compile-time parameters: (name, value) pairs
        self.defines = self._tile()
        self.prog = program(self.kernel_name, self.device, watchdog_ms, self.defines)

    def _tile(self) -> tuple:
        """Chooses the plan's tiling for its shape and GPU (sets its attributes) and returns
        the kernel's compile-time parameters."""
        return ()

    def _symmetric(self, nbytes: int, dtype: str, zero: bool = False) -> Any:
        from ptxdsl.runtime.distributed import SymmetricBuffer

        buf = SymmetricBuffer(nbytes, dtype, device=self.device, group=self.group)
        if zero:
            buf.local.copy_from_host(np.zeros(buf.local.shape, buf.local.dtype))
            buf.barrier()
        return buf

    def _signals(self, words: int) -> None:
        self.sig = self._symmetric(max(words, 1) * 4, "u32", zero=True)
        self.sig_all = self.sig.stacked().array(dtype="u32")
        self.sig_stride = self.sig.stride // 4

    def _launcher(self, grid: int, stream: Any) -> Any:
        """The bound launcher for `stream` (torch's current stream when None and torch is
        loaded), kept per stream handle: a call costs the argument packing and the driver."""
        if stream is None and "torch" in sys.modules:
            import torch

            stream = torch.cuda.current_stream(self.device).cuda_stream
        launch = self._launchers.get(stream)
        if launch is None:
            launch = self._launchers[stream] = self.prog[grid, None, stream]
        return launch

    def _map(self, x: Any, shape: tuple, what: str, box: tuple, view: tuple = (),
             swizzle: str = "128B") -> Any:
        """The tensor map of operand `x`, a bf16 array of `shape` (contiguous when `view`
        reshapes it), kept per layout (address, shape, strides, dtype): a layer called on the
        same tensors again builds and checks nothing."""
        from ptxdsl.runtime.interop import contiguous_strides, describe, layout_key

        layout = layout_key(x)
        key = (layout, what)  # b and c may share a layout, at different times: not a map
        m = self._maps.get(key) if layout is not None else None
        if m is None:
            d = describe(x, what)
            if d.shape != shape or str(d.elem) != "bf16":
                raise LaunchError(f"{what} must be a bf16 array of shape {shape}, got "
                                  f"{d.elem} {d.shape}")
            if view and d.strides != contiguous_strides(d.shape, 2):
                raise LaunchError(f"{what} must be contiguous (row-major), got strides "
                                  f"{d.strides} (bytes)")
            m = (rt.TensorMap(rt.DevicePointer(d.ptr), box, dtype="bf16", shape=view,
                              swizzle=swizzle, device=self.device) if view else
                 rt.TensorMap(x, box, dtype="bf16", swizzle=swizzle, device=self.device))
            if layout is not None:
                if len(self._maps) > 64:
                    self._maps.clear()
                self._maps[key] = m
        return m

    def free(self) -> None:
        """Release the symmetric memory (a collective)."""
        self.sig.free()


class AllGatherGemm(_Plan):
    """C = all_gather(A) @ B^T for this rank's N-shard B (n x k): every rank holds m_local
    rows of A in its slot of the gathered buffer (`shard()`); the kernel pulls the others'
    rows over NVLink while it multiplies the rows already here."""

    kernel_name = "ag_gemm"

    def __init__(self, m_local: int, k: int, n: int, *, device: Any = None, group: Any = None,
                 watchdog_ms: int = 0):
        from ptxdsl.runtime.distributed import _dist

        _agree(_dist(), group, "all-gather GEMM shapes (m_local, k)", (m_local, k))
        if k % 8:
            raise LaunchError(f"k must be a multiple of 8 (16-byte rows for TMA), got {k}")
        self.m_local, self.k, self.n = m_local, k, n
        _Plan.__init__(self, device, group, watchdog_ms)
        w = self.world
        self._signals(w + 1)
        self.buf = self._symmetric(w * m_local * k * 2, "u16")
        # fixed for the plan's life: the flag words' bit layout follows ck
        self.ck = ag_chunk(w, m_local, k, self.grid)
        self.pullers = ag_pullers(w, m_local, self.grid, self.pace)
        # a bit a gather unit, (units a panel + 31) / 32 words a remote row panel
        self.flags = rt.zeros(max(ag_flag_words(w, m_local, k, self.ck), 1), "u32",
                              device=self.device)
        local = rt.DevicePointer(self.buf.local.ptr)
        shape = (w, m_local, k)
        self.t_a = rt.TensorMap(local, (1, BM, BK), dtype="bf16", shape=shape,
                                swizzle="128B", device=self.device)
        self.t_st = rt.TensorMap(local, (1, 64, BK), dtype="bf16", shape=shape,
                                 swizzle="128B", device=self.device)
        stacked = self.buf.stacked()
        self.t_pull = rt.TensorMap(
            rt.DevicePointer(stacked.ptr), (1, 1, 64, BK), dtype="bf16",
            shape=(w, w, m_local, k), strides=(self.buf.stride, m_local * k * 2, k * 2, 2),
            swizzle="128B", device=self.device)

    def _tile(self) -> tuple:
        w = self.world
        self.bn = ag_width(w, self.m_local, self.n, self.sms)
        tiles = w * cdiv(self.m_local, BM) * cdiv(self.n, self.bn)
        self.grid = min(self.sms, tiles)
        # every tile in the first wave (decoding): local tiles keep pace with remote ones
        self.pace = int(w > 1 and tiles <= self.grid)
        self.stages, self.cch = ag_staging(self.pace, self.bn)
        return (("STAGES", self.stages), ("CCH", self.cch), ("BN", self.bn))

    def shard(self) -> Any:
        """This rank's m_local x k rows of A (bf16 bits as u16), in place in the buffer."""
        return self.buf.allocations[self.rank].array(
            (self.m_local, self.k), "u16", device=self.device,
            offset=self.rank * self.m_local * self.k * 2)

    def gathered(self) -> Any:
        """All M x k rows of A after a call (bf16 bits as u16)."""
        return self.buf.allocations[self.rank].array((self.world * self.m_local, self.k),
                                                     "u16", device=self.device)

    def __call__(self, b: Any, c: Any, stream: Any = None) -> None:
        """C (M x n, bf16, row-major) = all_gather(A) @ B^T, with B (n x k, bf16)."""
        w, ml, n = self.world, self.m_local, self.n
        tb = self._map(b, (n, self.k), "b", (self.bn, BK))
        (rows, cw), swz = chunk_box(64, self.bn, 2)
        tc = self._map(c, (w * ml, n), "c", (1, rows, cw), (w, ml, n), swz)
        launch = self._launcher(self.grid, stream)
        # the epoch counts launches enqueued: a launch refused before it runs must not count
        # (a landed unit's bit is the epoch's parity, so a skipped epoch would read every
        # stale bit as landed)
        launch(self.t_a, self.t_pull, self.t_st, tb, tc, self.flags, self.sig_all,
               self.sig_stride, self.rank, w, ml, n, self.k, self.epoch + 1, self.ck, self.pace,
               self.pullers)
        self.epoch += 1

    def free(self) -> None:
        self.buf.free()
        self.flags.free()
        super().free()


class GemmReduceScatter(_Plan):
    """This rank's rows of C = sum over ranks of A_r @ B_r^T, where every rank holds A_r
    (M x k_local) and B_r (n x k_local), a K-shard; C's M = world * m_local rows are
    scattered, m_local to a rank (`shard()`). `ordered=True` adds the ranks' partial tiles
    in one fixed order (bit-reproducible run to run). `splits` cuts each tile's K steps into
    that many ranges when the tiles alone would leave SMs idle (default: as many as fill the
    GPU, at most 4; each range's partial is rounded to bf16 before it is added). When every
    work item runs in the first wave (decoding, unordered) the owners zero their tiles as
    the launch starts, so no contribution waits for the owner's first. `bn`: the tile width
    (64, 128, 192 or 256; default: `rs_tiling`'s choice)."""

    kernel_name = "gemm_rs"

    def __init__(self, m_local: int, n: int, k_local: int, *, device: Any = None,
                 group: Any = None, watchdog_ms: int = 0, ordered: bool = False,
                 splits: int = 0, bn: int = 0):
        if n % 8 or k_local % 8:
            raise LaunchError(f"n and k_local must be multiples of 8 (16-byte rows for TMA), "
                              f"got {n} and {k_local}")
        self.m_local, self.n, self.k_local, self.ordered = m_local, n, k_local, bool(ordered)
        self._want = (splits, bn)
        _Plan.__init__(self, device, group, watchdog_ms)
        w = self.world
        tiles = w * cdiv(m_local, BM) * cdiv(n, self.bn)
        # every work item in the first wave (decoding): the owners zero their tiles first and
        # every contribution adds as soon as it is done (unordered)
        self.grid = min(self.sms, tiles * self.splits)
        self.zeroed = int(w > 1 and not ordered and tiles * self.splits <= self.sms)
        _agree(self.dist, group, "GEMM + reduce-scatter plans (m_local, n, ordered, tile "
               "width, K ranges a tile, zeroed)",
               (m_local, n, bool(ordered), self.bn, self.splits, self.zeroed))
        self._signals(rs_counters(m_local, n, self.bn))
        self.out = self._symmetric(m_local * n * 2, "u16")
        stacked = self.out.stacked()
        self.t_c = rt.TensorMap(rt.DevicePointer(stacked.ptr), (1, 64, 64), dtype="bf16",
                                shape=(w, m_local, n), strides=(self.out.stride, n * 2, 2),
                                swizzle="128B", device=self.device)

    def _tile(self) -> tuple:
        # every rank must count the same: agreed in __init__
        self.bn, self.stages, self.splits = rs_tiling(
            self.world, self.m_local, self.n, self.k_local, self.sms, *self._want)
        return (("BN", self.bn), ("STAGES", self.stages))

    def shard(self) -> Any:
        """This rank's m_local x n rows of C after a call (bf16 bits as u16)."""
        return self.out.allocations[self.rank].array((self.m_local, self.n), "u16",
                                                     device=self.device)

    def __call__(self, a: Any, b: Any, stream: Any = None) -> None:
        """Reduce-scatter A @ B^T (A: M x k_local, B: n x k_local, bf16) into `shard()`."""
        w, ml, n = self.world, self.m_local, self.n
        ta = self._map(a, (w * ml, self.k_local), "a", (BM, BK))
        tb = self._map(b, (n, self.k_local), "b", (self.bn, BK))
        launch = self._launcher(self.grid, stream)
        launch(ta, tb, self.t_c, self.sig_all, self.sig_stride, self.rank, w, ml, n,
               self.k_local, self.epoch + 1, int(self.ordered), self.splits, self.zeroed)
        self.epoch += 1  # launches enqueued (a refused one does not count)

    def free(self) -> None:
        self.out.free()
        super().free()


# ----------------------------------------------------------------------------- interpreter


def interp_ag(world: int, m_local: int = 80, k: int = 320, n: int = 264, grid: int = 2,
              seed: int = 0, rng: Any = None, ck: int = 4, epochs: int = 1,
              pace: int = 0, pullers: int = 0, staging: tuple[int, int] = (3, 4),
              bn: int = BN) -> dict[str, Any]:
    """All-gather + GEMM for `world` ranks at once in the CPU interpreter, launched `epochs`
    times on fresh data (the other slots poisoned again in between; flags and signal words
    carry over): returns each rank's C and gathered A (f32) of the last launch with numpy's
    answers, and the flags and signal words. Ranks may cut gather units differently: `ck`
    is one value for all, or a list of one a rank; `pace` makes local tiles wait with their
    remote partners (and the units go k-block by k-block); `pullers` CTAs pull (0: all);
    `staging`: (pipeline stages, C chunks staged at once); `bn`: the tile width."""
    from ptxdsl.interp import TensorMapModel, run_ranks

    rng = rng if rng is not None else np.random.default_rng(seed)
    cks = list(ck) if isinstance(ck, (list, tuple)) else [ck] * world
    buf = np.empty((world, world, m_local, k), np.uint16)  # rank r's buffer: buf[r]
    sig = np.zeros((world, world + 1), np.uint32)
    cs = [np.empty((world, m_local, n), np.uint16) for _ in range(world)]
    flags = [np.zeros(max(ag_flag_words(world, m_local, k, c), 1), np.uint32) for c in cks]
    pull = TensorMapModel(buf, (1, 1, 64, BK), swizzle="128B", dtype="bf16")
    kern = ptxdsl.parse_file(LIBRARY / "ag_gemm.ptxdsl",
                             defines={"STAGES": staging[0], "CCH": staging[1], "BN": bn})
    (rows, cw), swz = chunk_box(64, bn, 2)
    for epoch in range(1, epochs + 1):
        a = f32_to_bf16(rng.standard_normal((world, m_local, k)))
        bs = [f32_to_bf16(rng.standard_normal((n, k))) for _ in range(world)]
        buf.fill(0xFFFF)
        for r in range(world):
            buf[r, r] = a[r]
            cs[r].fill(0xFFFF)
        args = [dict(a=TensorMapModel(buf[r], (1, BM, BK), swizzle="128B", dtype="bf16"),
                     a_pull=pull,
                     a_st=TensorMapModel(buf[r], (1, 64, BK), swizzle="128B", dtype="bf16"),
                     b=TensorMapModel(bs[r], (bn, BK), swizzle="128B", dtype="bf16"),
                     c=TensorMapModel(cs[r], (1, rows, cw), swizzle=swz, dtype="bf16"),
                     flags=flags[r], sig=sig.reshape(-1), sig_stride=world + 1, rank=r,
                     world=world, m_local=m_local, n=n, kdim=k, epoch=epoch, ck=cks[r],
                     pace=pace, pullers=pullers or grid)
                for r in range(world)]
        run_ranks(kern, grid, args, seed=seed + epoch - 1)
    full = bf16_to_f32(a).reshape(world * m_local, k)
    return {"c": [bf16_to_f32(c).reshape(-1, n) for c in cs],
            "want_c": [full @ bf16_to_f32(b).T for b in bs],
            "gathered": [bf16_to_f32(buf[r]).reshape(-1, k) for r in range(world)],
            "want_gathered": full, "sig": sig, "flags": flags}


def interp_rs(world: int, m_local: int = 80, n: int = 264, k_local: int = 192,
              grid: int = 2, ordered: bool = False, epochs: int = 2, seed: int = 0,
              rng: Any = None, splits: int = 1, zeroed: int = 0, bn: int = BN,
              stages: int = 3) -> dict[str, Any]:
    """GEMM + reduce-scatter for `world` ranks at once in the CPU interpreter, launched
    `epochs` times on fresh data (the counters carry over): returns the last launch's C
    shards (f32) with numpy's answer, a bound on the partials' magnitudes (each partial is
    rounded to bf16 before it is added) and the counters. `zeroed`: the owners zero their
    tiles first and every contribution adds; `bn`, `stages`: the build."""
    from ptxdsl.interp import TensorMapModel, run_ranks

    rng = rng if rng is not None else np.random.default_rng(seed)
    m = world * m_local
    out = np.full((world, m_local, n), 0xFFFF, np.uint16)  # rank r's C shard: out[r]
    sig = np.zeros((world, rs_counters(m_local, n, bn)), np.uint32)
    tc = TensorMapModel(out, (1, 64, 64), swizzle="128B", dtype="bf16")
    kern = ptxdsl.parse_file(LIBRARY / "gemm_rs.ptxdsl", defines={"BN": bn, "STAGES": stages})
    for epoch in range(1, epochs + 1):
        a = [f32_to_bf16(rng.standard_normal((m, k_local))) for _ in range(world)]
        b = [f32_to_bf16(rng.standard_normal((n, k_local))) for _ in range(world)]
        args = [dict(a=TensorMapModel(a[r], (BM, BK), swizzle="128B", dtype="bf16"),
                     b=TensorMapModel(b[r], (bn, BK), swizzle="128B", dtype="bf16"),
                     c=tc, sig=sig.reshape(-1), sig_stride=sig.shape[1], rank=r,
                     world=world, m_local=m_local, n=n, kdim=k_local, epoch=epoch,
                     ordered=int(ordered), splits=splits, zeroed=zeroed)
                for r in range(world)]
        run_ranks(kern, grid, args, seed=seed + epoch - 1)
    fa, fb = [bf16_to_f32(x) for x in a], [bf16_to_f32(x) for x in b]
    # what a K range's partial can be at most: the magnitudes of every k-block's, summed
    scale = sum(np.abs(fa[r][:, k0:k0 + BK] @ fb[r][:, k0:k0 + BK].T)
                for r in range(world) for k0 in range(0, k_local, BK))
    return {"c": bf16_to_f32(out).reshape(m, n), "want": sum(fa[r] @ fb[r].T for r in range(world)),
            "scale": scale, "sig": sig}
