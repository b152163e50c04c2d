"""The runtime's one lifetime mechanism (ptxdsl/runtime/resource.py), without a GPU: a fake
release callable, and the real resource classes on a fake driver that records its calls.
Covered: double close, use after close, the context manager, the finaliser, and the
interpreter's shutdown."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ptxdsl import types as T
from ptxdsl.errors import DeviceError, LaunchError
from ptxdsl.runtime import DeviceArray, Event, Graph, Stream, VmmAllocation, memory, streams, vmm
from ptxdsl.runtime import driver as rd
from ptxdsl.runtime.resource import Resource


class Thing(Resource):
    noun = "thing"

    def __init__(self, release):
        self._release_fn = release
        Resource.__init__(self)

    def _release(self):
        self._release_fn()

    def use(self):
        self._check_open()
        return "used"


def test_close_releases_once():
    calls = []
    t = Thing(lambda: calls.append(1))
    assert not t.closed
    t.close()
    t.close()
    assert calls == [1] and t.closed


def test_use_after_close_names_the_resource():
    t = Thing(lambda: None)
    assert t.use() == "used"
    t.close()
    with pytest.raises(LaunchError, match="the thing was closed and cannot be used any more"):
        t.use()


def test_context_manager_closes_also_when_the_block_raises():
    calls = []
    with Thing(lambda: calls.append("a")) as t:
        assert t.use() == "used"
    assert calls == ["a"] and t.closed
    with pytest.raises(ValueError), Thing(lambda: calls.append("b")):
        raise ValueError("boom")
    assert calls == ["a", "b"]


def test_a_failing_release_is_not_retried():
    calls = []

    def release():
        calls.append(1)
        raise DeviceError("cuSomethingDestroy failed")

    t = Thing(release)
    with pytest.raises(DeviceError):
        t.close()
    t.close()
    del t
    gc.collect()
    assert calls == [1]


def test_finaliser_releases_and_swallows_errors():
    calls = []
    Thing(lambda: calls.append("collected"))  # dropped at once
    gc.collect()
    assert calls == ["collected"]

    def fail():
        calls.append("failed")
        raise DeviceError("context destroyed")

    Thing(fail)
    gc.collect()  # the error is swallowed: pytest's unraisable-exception check stays quiet
    assert calls == ["collected", "failed"]


def test_a_half_built_resource_is_not_released():
    calls = []

    class Failing(Thing):
        def __init__(self):
            raise DeviceError("cuSomethingCreate failed")

        def _release(self):
            calls.append(1)

    with pytest.raises(DeviceError):
        Failing()
    gc.collect()
    assert calls == []


def test_nothing_is_released_or_reported_at_interpreter_shutdown():
    code = textwrap.dedent(
        """
        from ptxdsl.runtime.resource import Resource

        class Loud(Resource):
            def __init__(self):
                Resource.__init__(self)

            def _release(self):
                print("released")
                raise RuntimeError("the driver is gone")

        kept = Loud()  # a module global: destroyed while the interpreter finalises
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and r.stderr == ""


# ----------------------------------------------------------------------------- real classes


class FakeDriver:
    """The driver calls the resource classes make, each recorded; every call succeeds."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.CUstream_flags = type("F", (), {"CU_STREAM_NON_BLOCKING": 1, "CU_STREAM_DEFAULT": 0})
        self.CUevent_flags = type("F", (), {"CU_EVENT_DEFAULT": 0, "CU_EVENT_DISABLE_TIMING": 2})

    def __getattr__(self, name):
        def call(*args):
            self.calls.append((name, *args))
            return (0, 0x5000 + len(self.calls)) if name.endswith("Create") else (0,)

        return call

    def named(self, name):
        return [c for c in self.calls if c[0] == name]


@pytest.fixture
def fake(monkeypatch):
    drv = FakeDriver()
    monkeypatch.setattr(rd, "_drv", drv)
    monkeypatch.setattr(streams, "_current", lambda device: None)
    monkeypatch.setattr(memory, "ensure_current", lambda: None)
    monkeypatch.setattr(vmm, "make_current", lambda ctx: None)
    monkeypatch.setattr(vmm, "device_context", lambda device: None)
    return drv


def test_stream_closes_once_and_refuses_use(fake):
    s = Stream()
    h = s.handle
    s.close()
    s.close()
    assert fake.named("cuStreamDestroy") == [("cuStreamDestroy", h)]
    with pytest.raises(LaunchError, match="the stream was closed"):
        s.synchronize()
    with pytest.raises(LaunchError, match="the stream was closed"):  # not the default stream
        rd.stream_handle(s)
    with Stream(non_blocking=True):
        pass
    assert len(fake.named("cuStreamDestroy")) == 2


def test_event_closes_once_and_refuses_use(fake):
    e = Event()
    h = e.handle
    with e:
        e.record()
    e.close()
    assert fake.named("cuEventDestroy") == [("cuEventDestroy", h)]
    with pytest.raises(LaunchError, match="the event was closed"):
        e.record()
    Event()
    gc.collect()
    assert len(fake.named("cuEventDestroy")) == 2


def test_graph_closes_once_and_refuses_replay(fake):
    g = Graph(0x77)
    with pytest.raises(LaunchError, match="no instantiated capture"):
        g.replay()
    g._graph, g._exec = "graph", "exec"
    g.replay()
    assert repr(g) == "Graph(0 nodes, stream=0x77)"
    g.close()
    g.close()
    assert fake.named("cuGraphExecDestroy") == [("cuGraphExecDestroy", "exec")]
    assert fake.named("cuGraphDestroy") == [("cuGraphDestroy", "graph")]
    with pytest.raises(LaunchError, match="the CUDA graph was closed"):
        g.replay()
    assert repr(g) == "Graph(closed, stream=0x77)"


def test_device_array_frees_once_and_refuses_use(fake):
    a = DeviceArray(0x7000, (4,), T.f32, owned=True)
    a.free()
    a.close()
    assert fake.named("cuMemFree") == [("cuMemFree", 0x7000)]
    assert a.ptr == 0
    uses = (a.copy_to_host, lambda: a.__ptxdsl_array__,
            lambda: a.copy_from_host(np.zeros(4, np.float32)))
    for use in uses:
        with pytest.raises(LaunchError, match="the device array was freed"):
            use()
    with DeviceArray(0x8000, (4,), T.f32, owned=True):
        pass
    DeviceArray(0x9000, (4,), T.f32, owned=True)
    gc.collect()
    assert [c[1] for c in fake.named("cuMemFree")] == [0x7000, 0x8000, 0x9000]


def test_a_view_releases_its_owner_but_frees_nothing(fake):
    owner = object()
    v = DeviceArray(0x7000, (4,), T.f32, owned=False, owner=owner)
    v.free()
    assert v._owner is None and fake.named("cuMemFree") == []


def test_vmm_allocation_unmaps_once_and_refuses_use(fake):
    a = VmmAllocation(0xA000, 1 << 21, 1000, 0, "handle", shareable=False)
    assert vmm.mapping_of(0xA000 + 10) is a
    with a:
        pass
    a.free()
    assert fake.named("cuMemUnmap") == [("cuMemUnmap", 0xA000, 1 << 21)]
    assert fake.named("cuMemRelease") == [("cuMemRelease", "handle")]
    assert vmm.mapping_of(0xA000 + 10) is None
    with pytest.raises(LaunchError, match="the VMM allocation was freed"):
        a.array()
