"""The switch for programmatic dependent launch of the fast engine's Triton kernels (hf_rstitch.fast.triton_support.PDL).
On a GPU the kernel tests check the kernels with it when it is switched on."""

import pytest
import torch


def test_programmatic_dependent_launch_switch(monkeypatch):
    """triton_support.PDL: 'one-row' by default, which launches only one-row kernels with it; never off CUDA or
    under the interpreter; a wrong value says which values exist."""
    from hf_rstitch.fast import triton_support as g

    assert g.PDL == "one-row"
    cpu = torch.device("cpu")
    for mode in ("off", "one-row", "all"):
        monkeypatch.setattr(g, "PDL", mode)
        assert not g.pdl(cpu, 1) and not g.pdl(cpu, 8)
    monkeypatch.setattr(g, "PDL", "on")
    with pytest.raises(ValueError, match="one-row"):
        g.pdl(cpu, 1)


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
