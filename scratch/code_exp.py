import sys, os
import torch
sys.path.insert(0, ".")
import ptxdsl.torch  # noqa
from ptxdsl.runtime import launch_overhead_us
x = torch.randn(4, 1024, device="cuda")
f = torch.compile(lambda t: torch.ops.ptxdsl.softmax(t), fullgraph=True)
f(x)
a = torch.randn(64, 64, device="cuda")
g = torch.compile(lambda t: torch.mm(t, t), fullgraph=True)
g(a)
h = torch.compile(lambda t: torch.ops.ptxdsl.softmax(t), fullgraph=True, backend="aot_eager")
h(x)
for n, fn in (("ptxdsl compiled", lambda: f(x)), ("aten mm compiled", lambda: g(a)), ("ptxdsl aot_eager", lambda: h(x)), ("ptxdsl eager", lambda: torch.ops.ptxdsl.softmax(x))):
    print(n, round(launch_overhead_us(fn, n=2000), 2))
