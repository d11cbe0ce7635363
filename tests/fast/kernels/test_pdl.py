"""The switch for programmatic dependent launch of the fast engine's Triton kernels (hf_rstitch.fast.kernels.triton_support.PDL).
On a GPU the kernel tests check the kernels with it when it is switched on."""

import pytest
import torch


def test_programmatic_dependent_launch_switch(monkeypatch):
    """triton_support.PDL: 'one-row' by default, which launches only one-row kernels with it; never off CUDA or
    under the interpreter; a wrong value says which values exist."""
    from hf_rstitch.fast.kernels import triton_support as g

    assert g.PDL == "one-row"
    cpu = torch.device("cpu")
    for mode in ("off", "one-row", "all"):
        monkeypatch.setattr(g, "PDL", mode)
        assert not g.pdl(cpu, 1) and not g.pdl(cpu, 8)
    monkeypatch.setattr(g, "PDL", "on")
    with pytest.raises(ValueError, match="one-row"):
        g.pdl(cpu, 1)


def test_programmatic_dependent_launch_needs_the_intrinsics(monkeypatch):
    """On a Hopper GPU a Triton without tl.extra.cuda.gdc_wait (before 3.5) builds the kernels without it."""
    from hf_rstitch.fast import capabilities
    from hf_rstitch.fast.kernels import triton_support as g

    pytest.importorskip("triton")
    cuda = torch.device("cuda")
    monkeypatch.setattr(g, "interpreted", lambda: False)
    with capabilities.assume((9, 0)):  # the GPU's capability, as the lanes read it (fast.capabilities)
        assert g._has_gdc()  # the Triton of this environment has them
        assert g.pdl(cuda, 1) and not g.pdl(cuda, 8)
        monkeypatch.setattr(g, "_has_gdc", lambda: False)
        assert not g.pdl(cuda, 1)
    monkeypatch.setattr(g, "_has_gdc", lambda: True)
    with capabilities.assume((8, 0)):
        assert not g.pdl(cuda, 1)  # Ampere: no programmatic dependent launch


def test_captures_run_without_garbage_collection(monkeypatch):
    """graphs.capturing: no collection inside a capture (one could free another engine's graph, whose reset
    invalidates the capture), collections back on after it, even when the capture fails; thread-local
    capture errors only."""
    import contextlib
    import gc

    from hf_rstitch.fast import graphs

    seen = []

    @contextlib.contextmanager
    def fake_graph(graph, **kwargs):
        seen.append((gc.isenabled(), kwargs))
        yield

    monkeypatch.setattr(torch.cuda, "graph", fake_graph)
    assert gc.isenabled()
    with graphs.capturing("g", stream="s"):
        assert not gc.isenabled()
    assert gc.isenabled() and seen == [(False, {"capture_error_mode": "thread_local", "stream": "s"})]
    with pytest.raises(RuntimeError), graphs.capturing("g"):
        raise RuntimeError("capture failed")
    assert gc.isenabled()


def test_lane_captures_keep_the_allocator_cache(monkeypatch):
    """graphs.capturing(keep_cache=True), a lane's captures: begun and ended on the capture stream with the graph's
    pool and thread-local errors, no device sync or cache release first (torch.cuda.graph's), no collection
    inside; a failed capture still ends it and turns collections back on."""
    import contextlib
    import gc

    from hf_rstitch.fast import graphs

    calls = []

    class Graph:
        def capture_begin(self, *pool, capture_error_mode):
            calls.append(("begin", pool, capture_error_mode, gc.isenabled()))

        def capture_end(self):
            calls.append(("end",))

    @contextlib.contextmanager
    def on(stream):
        calls.append(("stream", stream))
        yield

    monkeypatch.setattr(torch.cuda, "stream", on)
    monkeypatch.setattr(torch.cuda, "graph", lambda *a, **k: pytest.fail("torch.cuda.graph syncs and empties"))
    monkeypatch.setattr(graphs, "_stream_before", lambda stream: None)
    with graphs.capturing(Graph(), keep_cache=True, pool="p", stream="s"):
        assert not gc.isenabled()
    assert calls == [("stream", "s"), ("begin", ("p",), "thread_local", False), ("end",)] and gc.isenabled()
    calls.clear()
    with pytest.raises(RuntimeError), graphs.capturing(Graph(), keep_cache=True, stream="s"):
        raise RuntimeError("capture failed")
    assert calls == [("stream", "s"), ("begin", (), "thread_local", False), ("end",)] and gc.isenabled()
