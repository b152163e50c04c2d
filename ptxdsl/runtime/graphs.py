"""CUDA graphs: record launches made on a stream once, replay them with one driver call.

    s = Stream(non_blocking=True)
    with capture(s) as g:          # launches on `s` are recorded, not run
        k[grid, None, s](x, y, n)
        k2[grid, None, s](y, z, n)
    g.replay()                     # runs both, in order, on `s` (or g.replay(other_stream))

A replay costs one `cuGraphLaunch` however many kernels the graph holds, which is the path
for repeated small launches. Arguments are fixed at capture time (the driver copies them),
so a replay reads and writes the same memory each time.
"""

from __future__ import annotations

from typing import Any

from ..errors import DeviceError, LaunchError
from .driver import check, driver, ensure_current, stream_handle
from .resource import Resource


class Graph(Resource):
    """An instantiated CUDA graph (a `CUgraphExec`), made by `capture`.

    `replay(stream)` launches it on `stream` (default: the stream it was captured on);
    `nodes` is how many operations it holds. Destroyed by `close()`, at the end of a `with`
    block, or by garbage collection (see resource.py)."""

    noun = "CUDA graph"

    def __init__(self, stream: int):
        self.stream = stream
        self.nodes = 0
        self._graph: Any = None
        self._exec: Any = None
        Resource.__init__(self)

    def replay(self, stream: Any = None) -> None:
        """Launch the whole graph once on `stream` (asynchronous, like a kernel launch)."""
        self._check_open()
        if self._exec is None:
            raise LaunchError(
                "this CUDA graph has no instantiated capture (its capture failed or has not ended)"
            )
        sh = self.stream if stream is None else stream_handle(stream)
        check(driver().cuGraphLaunch(self._exec, sh), "cuGraphLaunch")

    def _release(self) -> None:  # a replay already queued still runs
        drv = driver()
        ex, self._exec = self._exec, None
        g, self._graph = self._graph, None
        if ex is not None:
            check(drv.cuGraphExecDestroy(ex), "cuGraphExecDestroy")
        if g is not None:
            check(drv.cuGraphDestroy(g), "cuGraphDestroy")

    def __repr__(self) -> str:
        state = "closed" if self.closed else "empty" if self._exec is None else \
            f"{self.nodes} nodes"
        return f"Graph({state}, stream=0x{self.stream:x})"


class capture:  # noqa: N801 -- used as a context manager, like open()
    """`with capture(stream) as g:` records the work queued on `stream` into the Graph `g`.

    `stream` must be a real stream (a ptxdsl `Stream`, a torch or cupy stream, or a handle),
    not the legacy default stream, which cannot be captured (a non-blocking stream is best:
    the legacy stream must not be used while a blocking one captures). Capture is
    thread-local: other
    threads may keep using the GPU meanwhile. If the block raises, the capture is ended and
    discarded and the exception propagates."""

    def __init__(self, stream: Any):
        sh = stream_handle(stream)
        if sh in (0, 1, 2):  # legacy default, per-thread default (CU_STREAM_LEGACY/PER_THREAD)
            raise LaunchError(
                "CUDA graphs capture a created stream, not the default stream; "
                "pass a ptxdsl.runtime.Stream() (or a torch/cupy stream) and launch on it"
            )
        self.graph = Graph(sh)

    def __enter__(self) -> Graph:
        drv = driver()
        ensure_current()
        mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check(drv.cuStreamBeginCapture(self.graph.stream, mode), "cuStreamBeginCapture")
        return self.graph

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        drv = driver()
        err, graph = drv.cuStreamEndCapture(self.graph.stream)
        if exc_type is not None:  # the block failed: discard whatever was recorded
            if err == 0 and graph is not None:
                drv.cuGraphDestroy(graph)
            return
        if err != 0:
            check((err,), "cuStreamEndCapture (a launch inside the capture was not allowed, "
                  "e.g. on another stream or a synchronising call)")
        self.graph._graph = graph
        self.graph.nodes = int(check(drv.cuGraphGetNodes(graph, 0), "cuGraphGetNodes")[1])
        try:
            self.graph._exec = check(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        except DeviceError:
            self.graph.close()
            raise
