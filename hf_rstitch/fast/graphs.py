"""CUDA graphs captured on first use, keyed by shape.

The first call of a key runs the step for real on the capture stream (that run is the warm-up:
it loads kernels and sets up cuBLAS workspaces for the stream), then records the same call as a
graph; later calls replay it. A warm-up whose outputs are thrown away (:meth:`GraphRunner.record`: a lane
capturing its buckets ahead) records without the real call where an earlier call of the runner already ran the
same kernels' specializations, and falls back to the real call where that recording fails. Recording executes nothing, so the lane's state (cache slots,
write offset) advances exactly once per call either way. All graphs of a runner share one memory
pool: they run one at a time on one stream, and every caller copies what it needs out of a
graph's outputs before the next replay (the outputs are overwritten in place).
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from typing import Any, Callable, Hashable

import torch

# GraphRunner.record records without a real call first; HF_RSTITCH_LEAN_CAPTURE=0: always the real call first
LEAN = os.environ.get("HF_RSTITCH_LEAN_CAPTURE", "1").strip() != "0"


@contextlib.contextmanager
def capturing(graph: torch.cuda.CUDAGraph, keep_cache: bool = False, **kwargs):
    """``torch.cuda.graph(graph, **kwargs)`` with no garbage collection inside. A collection during a capture
    can free another engine's CUDA graph, whose destructor (a graph reset) is not permitted while a stream
    captures and invalidates the capture (seen on an H200 in a long GPU test run; torch 2.11 no longer
    collects before capturing). ``thread_local``: CUDA calls other threads make meanwhile (a compiler's
    worker loading its kernels) do not invalidate it either; this thread's own calls are still checked.
    ``keep_cache`` (with a ``stream``): the same capture without what ``torch.cuda.graph`` does first -- wait for
    the device and hand every cached block back to the driver -- which a lane capturing its buckets one after
    another would pay before each (and its next warm-up run would allocate those blocks again)."""
    enabled = gc.isenabled()
    gc.disable()
    before = _stream_before(kwargs.get("stream"))
    lean = keep_cache and kwargs.get("stream") is not None
    try:
        with (_captured(graph, **kwargs) if lean else
              torch.cuda.graph(graph, capture_error_mode="thread_local", **kwargs)):
            yield
    except BaseException:
        if before is not None:
            recover_from_failed_capture(before)
        raise
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def _captured(graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream, pool=None):
    """What ``torch.cuda.graph`` does around a capture on ``stream``, less its device sync and cache release."""
    with torch.cuda.stream(stream):
        graph.capture_begin(*(() if pool is None else (pool,)), capture_error_mode="thread_local")
        try:
            yield
        finally:
            graph.capture_end()


def _stream_before(capture_stream) -> torch.cuda.Stream | None:
    """This thread's current stream on the capture's device (what a failed capture must give back)."""
    if isinstance(capture_stream, torch.cuda.Stream):
        return torch.cuda.current_stream(capture_stream.device)
    return torch.cuda.current_stream() if capture_stream is None and torch.cuda.is_available() else None


def recover_from_failed_capture(stream: torch.cuda.Stream) -> None:
    """Leave the process as a failed capture found it, so the eager engine can take over (``"auto"``'s rerun).

    When a capture is invalidated (a CUDA call fails inside it), ``CUDAGraph.capture_end`` raises before it
    ends the generators' capture and before ``torch.cuda.graph`` restores the stream: the default CUDA
    generator stays "capturing" (every later sampling call raises "Offset increment outside graph capture
    encountered unexpectedly") and this thread keeps the capture stream as its current stream (seen on an
    H200 with xmod, torch 2.11). The generator gets a fresh state with the same seed and offset
    (``clone_state``: not capturing); graphs captured before hold no random draws (sampling runs outside
    them), so they lose nothing."""
    torch.cuda.set_stream(stream)
    generator = torch.cuda.default_generators[stream.device.index if stream.device.index is not None else 0]
    try:
        generator.graphsafe_set_state(generator.clone_state())
    except RuntimeError:  # a generator that cannot clone its state mid-capture: leave it as it is
        pass


class GraphRunner:
    """Run ``fn`` under the graph recorded for ``key``, capturing it on first use."""

    def __init__(self, device: torch.device):
        if device.type != "cuda":
            raise ValueError(
                f"CUDA graphs need a CUDA device, got {device}. Build the lane with graphs=False to run the same "
                "static-cache steps eagerly (e.g. on CPU for tests)."
            )
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[Hashable, tuple[torch.cuda.CUDAGraph, Any]] = {}
        self.capture_seconds = 0.0  # host seconds spent warming up and recording
        self.warm_seconds = 0.0  # of which the real calls before each recording (the warm-ups)
        self.lean = 0  # graphs recorded without a real call first (record)
        self.lean_failed = 0  # of those tried, recordings that failed and were made again after a real call

    def __contains__(self, key: Hashable) -> bool:
        return key in self.graphs

    def run(self, key: Hashable, fn: Callable[[], Any]) -> Any:
        entry = self.graphs.get(key)
        if entry is not None:
            entry[0].replay()
            return entry[1]
        return self._capture(key, fn)

    def record(self, key: Hashable, fn: Callable[[], Any]) -> None:
        """Capture ``fn``'s graph for ``key`` now, for later replays, without running it: what a warm-up whose
        outputs nobody reads needs, where every kernel ``fn`` launches already ran in this process (so nothing loads
        or compiles while recording). A recording that fails anyway (a kernel or compile first met here) is
        dropped, the process recovered as after any failed capture, and the key captured the usual way."""
        if key in self.graphs:
            return
        if LEAN:
            start = time.perf_counter()
            graph = torch.cuda.CUDAGraph()
            try:
                with capturing(graph, keep_cache=True, pool=self.pool, stream=self.stream):
                    static_out = fn()  # recorded, not executed
            except Exception:  # noqa: BLE001 - e.g. a kernel that loads at its first launch: warm it up for real
                self.lean_failed += 1
                torch.cuda.synchronize(self.device)
            else:
                self.graphs[key] = (graph, static_out)
                self.lean += 1
                self.capture_seconds += time.perf_counter() - start
                return
        self._capture(key, fn)

    def _capture(self, key: Hashable, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            out = fn()  # the real call, doubling as the warm-up
        current.wait_stream(self.stream)
        self.warm_seconds += time.perf_counter() - start
        graph = torch.cuda.CUDAGraph()
        with capturing(graph, keep_cache=True, pool=self.pool, stream=self.stream):
            static_out = fn()  # recorded, not executed
        self.graphs[key] = (graph, static_out)
        self.capture_seconds += time.perf_counter() - start
        return out
