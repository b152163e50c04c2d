"""The references the benchmarks measure ptxdsl against, each written or loaded here.

Every function returns None when its library is missing, so a benchmark still runs (and
says what it could not measure) where Triton, cupy or Liger are absent. torch is imported
where it is used, so the module imports without it."""

from __future__ import annotations


def triton_copy():
    """A plain Triton load/store copy (BLOCK elements a program), or None."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def copy(src, dst, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=m), mask=m)

    def run(src, dst, block=8192, warps=8):
        n = src.numel()
        copy[(triton.cdiv(n, block),)](src, dst, n, BLOCK=block, num_warps=warps)

    return run


def triton_norms():
    """Row-per-program Triton RMSNorm, softmax and LayerNorm (`warps` warps a program, 16
    unless given; the benchmark tries several), or None."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def rms(x_ptr, w_ptr, y_ptr, n, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < n
        x = tl.load(x_ptr + row * n + cols, mask=m, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
        inv = tl.rsqrt(tl.sum(x * x, axis=0) / n + eps)
        tl.store(y_ptr + row * n + cols, (x * inv * w).to(y_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def smax(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < n
        x = tl.load(x_ptr + row * n + cols, mask=m, other=-float("inf")).to(tl.float32)
        e = tl.exp(x - tl.max(x, axis=0))
        tl.store(y_ptr + row * n + cols, (e / tl.sum(e, axis=0)).to(y_ptr.dtype.element_ty),
                 mask=m)

    @triton.jit
    def lnorm(x_ptr, w_ptr, b_ptr, y_ptr, n, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < n
        x = tl.load(x_ptr + row * n + cols, mask=m, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=0) / n
        d = tl.where(m, x - mean, 0.0)
        rstd = tl.rsqrt(tl.sum(d * d, axis=0) / n + eps)
        w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=m, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * n + cols, (d * rstd * w + b).to(y_ptr.dtype.element_ty), mask=m)

    def run(kind, x, w, b, y, eps, warps=16):
        rows, n = x.shape
        block = triton.next_power_of_2(n)
        if kind == "rmsnorm":
            rms[(rows,)](x, w, y, n, eps, BLOCK=block, num_warps=warps)
        elif kind == "softmax":
            smax[(rows,)](x, y, n, BLOCK=block, num_warps=warps)
        else:
            lnorm[(rows,)](x, w, b, y, n, eps, BLOCK=block, num_warps=warps)

    return run


def triton_fused_softmax():
    """The design of Triton's tutorial 02 fused softmax: a persistent grid of programs, each
    striding over rows with a software-pipelined `tl.range(num_stages=...)`, 8 warps; the
    caller tries several grid sizes (the tutorial derives one from occupancy). Or None."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def fused(y_ptr, x_ptr, x_stride, y_stride, rows, n, BLOCK: tl.constexpr,
              STAGES: tl.constexpr):
        first, step = tl.program_id(0), tl.num_programs(0)
        for r in tl.range(first, rows, step, num_stages=STAGES):
            cols = tl.arange(0, BLOCK)
            m = cols < n
            x = tl.load(x_ptr + r * x_stride + cols, mask=m, other=-float("inf")).to(tl.float32)
            num = tl.exp(x - tl.max(x, axis=0))
            out = num / tl.sum(num, axis=0)
            tl.store(y_ptr + r * y_stride + cols, out.to(y_ptr.dtype.element_ty), mask=m)

    def run(x, y, programs, stages=4, warps=8):
        rows, n = x.shape
        fused[(programs,)](y, x, x.stride(0), y.stride(0), rows, n,
                           BLOCK=triton.next_power_of_2(n), STAGES=stages, num_warps=warps)

    return run


def liger_norms():
    """Liger-Kernel's RMSNorm / LayerNorm / softmax forward functions, or None."""
    try:
        from liger_kernel.ops import layer_norm, rms_norm
    except Exception:
        return None
    out = {
        "rmsnorm": lambda x, w, b, eps: rms_norm.LigerRMSNormFunction.apply(x, w, eps),
        "layernorm": lambda x, w, b, eps: layer_norm.LigerLayerNormFunction.apply(x, w, b, eps),
    }
    try:
        from liger_kernel.ops import softmax

        out["softmax"] = lambda x, w, b, eps: softmax.LigerSoftmaxFunction.apply(x)
    except Exception:
        pass
    return out


def quack_norms():
    """QuACK's (Dao-AILab's CuTe-DSL kernels) forward functions by kind, or None where quack
    is not importable. Its LayerNorm, where it has one, takes no bias: (x, w, eps)."""
    try:
        import quack
    except Exception:
        return None
    out = {"rmsnorm": lambda x, w, b, eps: quack.rmsnorm(x, w, eps=eps),
           "softmax": lambda x, w, b, eps: quack.softmax(x)}
    try:
        from quack.layernorm import layernorm

        out["layernorm"] = lambda x, w, b, eps: layernorm(x, w, eps=eps)
    except Exception:
        pass
    return out


def torch_norm(kind, n, w, b, eps):
    """torch's own (eager) op for `kind`."""
    import torch

    f = torch.nn.functional
    if kind == "rmsnorm":
        return lambda x: f.rms_norm(x, (n,), w, eps)
    if kind == "softmax":
        return lambda x: torch.softmax(x, dim=-1)
    return lambda x: f.layer_norm(x, (n,), w, b, eps)


def compiled_norms(kind, n, w, b, eps):
    """torch.compile (Inductor) of the op two ways: torch's own op, and the math written out
    in float32; (description, compiled function) pairs, empty without Inductor."""
    import torch

    try:
        import torch._inductor  # noqa: F401
    except Exception:
        return []

    def rms(x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)

    def smax(x):
        return torch.softmax(x.float(), dim=-1).to(x.dtype)

    def ln(x):
        xf = x.float()
        mean = xf.mean(-1, keepdim=True)
        var = (xf - mean).pow(2).mean(-1, keepdim=True)
        return ((xf - mean) * torch.rsqrt(var + eps) * w.float() + b.float()).to(x.dtype)

    written = {"rmsnorm": rms, "softmax": smax, "layernorm": ln}[kind]
    return [("torch op", torch.compile(torch_norm(kind, n, w, b, eps), dynamic=False)),
            ("f32 math written out", torch.compile(written, dynamic=False))]


CUPY_PROBE = r"""
struct __align__(64) TensorMapBytes { unsigned long long v[16]; };
extern "C" __global__ void probe(const __grid_constant__ TensorMapBytes m, unsigned short* p,
                                 unsigned n) {
    if (threadIdx.x == 0 && n == 12345u) p[0] = (unsigned short)m.v[0];
}
extern "C" __global__ void probe_ptrs(const unsigned short* q, unsigned short* p, unsigned n) {
    if (threadIdx.x == 0 && n == 12345u) p[0] = q[0];
}
"""


def cupy_probe():
    """cupy RawKernel launchers of a do-nothing kernel: (name, callable) pairs, or None.
    One takes a 128-byte struct by value like a tensor map (when cupy accepts it), one takes
    two arrays; both take a u32 as well."""
    try:
        import cupy
        import numpy as np
    except ImportError:
        return None
    mod = cupy.RawModule(code=CUPY_PROBE, options=("-std=c++17",))
    probe, probe_ptrs = mod.get_function("probe"), mod.get_function("probe_ptrs")
    p = cupy.zeros(64, dtype=cupy.uint16)
    n = np.uint32(7)
    out = [("cupy RawKernel (2 cupy arrays + u32)",
            lambda: probe_ptrs((1,), (128,), (p, p, n)))]
    tmap = np.zeros(1, dtype=np.dtype([("v", "<u8", (16,))], align=True))[0]
    try:
        probe((1,), (128,), (tmap, p, n))
        cupy.cuda.runtime.deviceSynchronize()
        out.insert(0, ("cupy RawKernel (128-byte struct + cupy array + u32)",
                       lambda: probe((1,), (128,), (tmap, p, n))))
    except Exception as e:  # cupy versions that do not pass structs by value
        out.append((f"cupy RawKernel with a struct argument: not supported ({type(e).__name__})",
                    None))
    return out


def triton_probe():
    """A Triton launch of a do-nothing kernel with a tensor and a u32, or None."""
    import torch

    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def probe(p, n):
        if n == 12345:
            tl.store(p, 0)

    x = torch.zeros(64, dtype=torch.int32, device="cuda")
    return lambda: probe[(1,)](x, 7)


def triton_longrow():
    """Row-per-program Triton RMSNorm and softmax for long bf16 rows: the whole row in
    registers (ONE_PASS, as Liger does for n <= 65536) or two passes over BLOCK-wide
    blocks (online softmax); `run(kind, x, w, y, block, one_pass, warps)`. Or None."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def rms_row(x_ptr, w_ptr, y_ptr, n, eps, BLOCK: tl.constexpr, ONE_PASS: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        x_ptr += row * n
        y_ptr += row * n
        if ONE_PASS:
            cols = tl.arange(0, BLOCK)
            x = tl.load(x_ptr + cols).to(tl.float32)
            inv = tl.rsqrt(tl.sum(x * x, axis=0) / n + eps)
            w = tl.load(w_ptr + cols).to(tl.float32)
            tl.store(y_ptr + cols, (x * inv * w).to(tl.bfloat16))
        else:
            acc = tl.zeros([BLOCK], tl.float32)
            for off in range(0, n, BLOCK):
                x = tl.load(x_ptr + off + tl.arange(0, BLOCK)).to(tl.float32)
                acc += x * x
            inv = tl.rsqrt(tl.sum(acc, axis=0) / n + eps)
            for off in range(0, n, BLOCK):
                cols = off + tl.arange(0, BLOCK)
                x = tl.load(x_ptr + cols).to(tl.float32)
                w = tl.load(w_ptr + cols).to(tl.float32)
                tl.store(y_ptr + cols, (x * inv * w).to(tl.bfloat16))

    @triton.jit
    def softmax_row(x_ptr, y_ptr, n, BLOCK: tl.constexpr, ONE_PASS: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        x_ptr += row * n
        y_ptr += row * n
        if ONE_PASS:
            cols = tl.arange(0, BLOCK)
            x = tl.load(x_ptr + cols).to(tl.float32)
            e = tl.exp(x - tl.max(x, axis=0))
            tl.store(y_ptr + cols, (e / tl.sum(e, axis=0)).to(tl.bfloat16))
        else:  # online softmax: one pass for (max, sum), one to write
            m = tl.full([BLOCK], -float("inf"), tl.float32)
            s = tl.zeros([BLOCK], tl.float32)
            for off in range(0, n, BLOCK):
                x = tl.load(x_ptr + off + tl.arange(0, BLOCK)).to(tl.float32)
                nm = tl.maximum(m, x)
                s = s * tl.exp(m - nm) + tl.exp(x - nm)
                m = nm
            big = tl.max(m, axis=0)
            total = tl.sum(s * tl.exp(m - big), axis=0)
            for off in range(0, n, BLOCK):
                cols = off + tl.arange(0, BLOCK)
                x = tl.load(x_ptr + cols).to(tl.float32)
                tl.store(y_ptr + cols, (tl.exp(x - big) / total).to(tl.bfloat16))

    def run(kind, x, w, y, block, one_pass, warps):
        rows, n = x.shape
        if kind == "rmsnorm":
            rms_row[(rows,)](x, w, y, n, 1e-5, BLOCK=block, ONE_PASS=one_pass, num_warps=warps)
        else:
            softmax_row[(rows,)](x, y, n, BLOCK=block, ONE_PASS=one_pass, num_warps=warps)

    return run
