"""What the fast engine's Triton kernels share: Triton itself (optional), where it runs, block sizes, the
device's multiprocessors, the timers that tune launch configurations (:func:`fastest`), the parallel
compiles of the candidates they time (:func:`compile_ahead`), and the switch for programmatic dependent
launch (:data:`PDL`)."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from ..graphs import capturing


@functools.lru_cache(maxsize=1)
def _triton():
    try:
        import triton
        import triton.language as tl
        import triton.language.extra.cuda  # noqa: F401  (tl.extra.cuda.gdc_*: programmatic dependent launch)
    except ImportError:
        return None
    return triton, tl


def next_pow2(n: int) -> int:
    """The smallest power of two >= ``n`` (Triton block sizes)."""
    return 1 << max(0, (n - 1).bit_length())


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def available(device: torch.device | str) -> bool:
    """True where the Triton kernel can run: CUDA with Triton installed (or Triton's interpreter)."""
    device = torch.device(device)
    return _triton() is not None and (device.type == "cuda" or interpreted())


@functools.lru_cache(maxsize=8)
def sm_count(device: torch.device) -> int:
    """Multiprocessors of ``device`` (launch plans size their grids by it); 8 off CUDA (the interpreter)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8


# Programmatic dependent launch (compute capability 9+): a kernel launched with it starts while the kernel
# before it still runs, waits for that kernel's results before reading anything (griddepcontrol.wait; the
# one-row products read their first weight tiles before that wait), then lets the next kernel launch, so the
# launch and ramp-up of each small kernel overlap its predecessor. One-row steps gain, batches of 8 lose,
# batches of 64 do not change (benchmarks/results/engine_pdl_*.md). "one-row"
# (the default): launches over one row of activations only; "all": every launch; "off": none. (A GPU test
# run once had a graph capture invalidated with it on: a garbage collection inside the capture freed an
# old engine's graph; graphs.capturing now keeps collections out of captures.)
PDL = "one-row"
_PDL_MODES = ("off", "one-row", "all")


@functools.lru_cache(maxsize=8)
def _capability(device: torch.device) -> int:
    return torch.cuda.get_device_capability(device)[0]


@functools.lru_cache(maxsize=1)
def _has_gdc() -> bool:
    """Triton has the grid-dependency intrinsics (``tl.extra.cuda.gdc_wait``; Triton 3.5 and later)."""
    found = _triton()
    return found is not None and hasattr(getattr(found[1].extra, "cuda", None), "gdc_wait")


def pdl(device: torch.device, rows: int) -> bool:
    """Whether a kernel launched now on ``device`` over ``rows`` rows of activations uses programmatic
    dependent launch (:data:`PDL`): never off CUDA, under the interpreter, before compute capability 9, or
    with a Triton that lacks the intrinsics (the kernels then build without them)."""
    if PDL not in _PDL_MODES:
        raise ValueError(f"triton_support.PDL must be one of {list(_PDL_MODES)}, got {PDL!r}")
    if PDL == "off" or (PDL == "one-row" and rows != 1):
        return False
    return device.type == "cuda" and not interpreted() and _has_gdc() and _capability(device) >= 9


# Compiles of the tuner's candidates run in this many threads (Triton releases the interpreter lock while it
# lowers and assembles a kernel); 1: one after another, at first launch. HF_RSTITCH_COMPILE_THREADS sets it.
def _threads_from_env() -> int:
    value = os.environ.get("HF_RSTITCH_COMPILE_THREADS", "").strip()
    if value and not (value.isdigit() and int(value) > 0):
        raise ValueError(f"HF_RSTITCH_COMPILE_THREADS must be a positive whole number of threads (1: compile one "
                         f"kernel after another), got {value!r}")
    return int(value) if value else min(16, os.cpu_count() or 1)


COMPILE_THREADS = _threads_from_env()
_ahead = threading.local()


def start(kernel, grid):
    """``kernel[grid]``: what the kernels' launch functions call. Inside :func:`compile_ahead` it compiles the
    launch's specialization instead (``kernel.warmup``) and runs nothing."""
    if getattr(_ahead, "on", False):
        return functools.partial(kernel.warmup, grid=grid)
    return kernel[grid]


def _async_mode():
    try:
        from triton.runtime._async_compile import AsyncCompileMode  # Triton 3.4 and later
    except ImportError:
        return None
    return AsyncCompileMode


@contextlib.contextmanager
def compile_ahead(jobs: int):
    """Within the block, kernel launches made through :func:`start` are compiled in :data:`COMPILE_THREADS`
    threads (at most ``jobs``) and not run; leaving it waits for every compile. Compiles that fail are left
    for the real launch to raise. Off CUDA, under the interpreter, with one thread or an older Triton the
    block is skipped by the caller (:func:`precompile`)."""
    mode = _async_mode()
    with ThreadPoolExecutor(max(1, min(COMPILE_THREADS, jobs))) as pool, mode(pool, ignore_errors=True):
        _ahead.on = True
        try:
            yield
        finally:
            _ahead.on = False


def precompile(jobs, device) -> None:
    """Compile the kernels of every candidate of every ``(candidates, run)`` job in one parallel batch, before
    :func:`fastest` times them one by one: a fresh machine otherwise builds dozens of kernels in a row (~0.2 s
    each) while tuning. Kernels already built (this process) or on Triton's disk cache cost a lookup."""
    device = torch.device(device)
    count = sum(len(candidates) for candidates, _ in jobs)
    if device.type != "cuda" or interpreted() or COMPILE_THREADS <= 1 or _async_mode() is None or count < 2:
        return
    with compile_ahead(count):
        for candidates, run in jobs:
            for cfg in candidates:
                try:
                    run(cfg)
                except Exception:  # noqa: BLE001 - the timing loop meets it again and skips the candidate
                    continue


# The tuners time each candidate over ``calls`` launches in one CUDA graph. With the same weight every launch, a
# weight smaller than the L2 cache (every product of a sub-2B model, a 7B's attention projections) is read from L2
# after the first launch, while a decode step reads it from memory. COLD_TUNING: the launches take turns over
# copies of the weights (:func:`cold_copies`) that together exceed the L2 cache twice over, so the timing sees
# memory reads. Off: on one H100 it timed within noise of the default (Qwen2-1.5B step graph 1.513 against 1.521
# ms; results/engine_ab_nvidia_h100_80gb_hbm3.md); the 0.6B and 7B were not timed with it.
COLD_TUNING = False
L2_SPAN = 2  # the copies a cold tuning takes turns over hold at least this many L2 caches


@functools.lru_cache(maxsize=8)
def l2_bytes(device: torch.device) -> int:
    """The L2 cache of ``device`` in bytes (50 MiB off CUDA: an H100's, for the interpreter)."""
    if device.type != "cuda":
        return 50 << 20
    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20))


def cold_copies(tensors: tuple[torch.Tensor, ...], calls: int):
    """A function returning, call after call, ``tensors`` or one of its copies in turn: with
    :data:`COLD_TUNING`, enough copies (at most ``calls``) that the bytes between two uses of one copy exceed
    :data:`L2_SPAN` L2 caches; without it, ``tensors`` every time."""
    size = sum(t.numel() * t.element_size() for t in tensors)
    want = -(-L2_SPAN * l2_bytes(tensors[0].device) // max(1, size)) if COLD_TUNING else 1
    sets = [tensors] + [tuple(t.clone() for t in tensors) for _ in range(min(calls, want) - 1)]
    turn = iter(range(1 << 62))
    return lambda: sets[next(turn) % len(sets)]


def fastest(candidates, run, baseline=None, calls: int = 20):
    """The candidate whose ``run(cfg)`` takes least time in a CUDA graph, or None when ``baseline()`` (if
    given) beats every one; candidates the device cannot run are skipped. A lane builds their kernels
    beforehand (:func:`precompile`); elsewhere the first run of each builds it."""
    best, best_ms = None, graph_ms(baseline, calls) if baseline is not None else float("inf")
    for cfg in candidates:
        try:
            ms = graph_ms(lambda: run(cfg), calls)
        except Exception:  # noqa: BLE001 - a configuration the device cannot run (registers, shared memory)
            continue
        if ms < best_ms:
            best, best_ms = cfg, ms
    return best


def graph_ms(fn, calls: int, repeats: int = 1) -> float:
    """Milliseconds per call of ``fn`` recorded ``calls`` times in one CUDA graph (median of
    ``repeats`` replays): no launch overhead in the number."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # compiles the kernel and warms up, outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with capturing(graph):
        for _ in range(calls):
            fn()
    graph.replay()  # warm
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return sorted(times)[len(times) // 2]
