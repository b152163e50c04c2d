import sys, dataclasses
import torch
sys.path.insert(0, ".")
import ptxdsl.torch  # noqa
from ptxdsl.torch.norms import SOFTMAX
from ptxdsl.torch import opspec
from ptxdsl.runtime import launch_overhead_us
from bench.op_launch import ops

spec = dataclasses.replace(SOFTMAX, name="softmax")
lib = torch.library.Library("ptxdsl_lo", "FRAGMENT")
lib.define("softmax" + spec.schema)
first = "x"
def allocate(args):
    shape, dtype = spec.output(args)
    return args[first].new_empty(shape, dtype=dtype)
def cuda_impl(*raw):
    args = spec.bind(raw)
    spec.validate(args, real=True)
    out = allocate(args)
    spec.launch(args, out, opspec.raw_stream(args[first].device))
    return out
def fake_impl(*raw):
    args = spec.bind(raw); spec.validate(args, real=False); return allocate(args)
lib.impl("softmax", cuda_impl, "CUDA")
torch.library.register_fake("ptxdsl_lo::softmax", fake_impl, lib=lib)
x = torch.randn(4, 1024, device="cuda")
o = ops()
cands = {"custom_op fwd": o["ptxdsl fwd"], "Library.impl": torch.ops.ptxdsl_lo.softmax, "triton fwd": o["Triton fwd"]}
for n, f in list(cands.items()):
    cands[n + ", compiled"] = torch.compile(lambda t, f=f: f(t), fullgraph=True)
want = torch.softmax(x, -1)
for n, f in cands.items():
    assert (f(x) - want).abs().max() < 1e-5, n
for n, f in cands.items():
    print(n, round(min(launch_overhead_us(lambda: f(x), n=2000) for _ in range(2)), 2))
