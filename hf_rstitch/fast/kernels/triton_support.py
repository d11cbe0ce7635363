"""What the fast engine's Triton kernels share: Triton itself (optional), where it runs, block sizes, the
device's multiprocessors, the timers that tune launch configurations (:func:`fastest`), the parallel
compiles of the candidates they time and of their launchers (:func:`compile_ahead`), and the switch for
programmatic dependent launch (:data:`PDL`)."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from .. import capabilities
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


@functools.lru_cache(maxsize=1)
def _has_gdc() -> bool:
    """Triton has the grid-dependency intrinsics (``tl.extra.cuda.gdc_wait``; Triton 3.5 and later)."""
    found = _triton()
    return found is not None and hasattr(getattr(found[1].extra, "cuda", None), "gdc_wait")


def pdl(device: torch.device, rows: int) -> bool:
    """Whether a kernel launched now on ``device`` over ``rows`` rows of activations uses programmatic
    dependent launch (:data:`PDL`): never off CUDA, under the interpreter, where the GPU (or the profile) has no
    ``"pdl"`` (:mod:`hf_rstitch.fast.capabilities`), or with a Triton that lacks the intrinsics (the kernels then
    build without them)."""
    if PDL not in _PDL_MODES:
        raise ValueError(f"triton_support.PDL must be one of {list(_PDL_MODES)}, got {PDL!r}")
    if PDL == "off" or (PDL == "one-row" and rows != 1):
        return False
    return capabilities.has("pdl", device) and not interpreted() and _has_gdc()


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
def compile_ahead(jobs: int, device: torch.device | None = None):
    """Within the block, kernel launches made through :func:`start` are compiled in :data:`COMPILE_THREADS`
    threads (at most ``jobs``) and not run; leaving it waits for every compile, then prepares their launchers
    for ``device`` (:func:`prepare_launchers`). Compiles that fail are left for the real launch to raise. Off
    CUDA, under the interpreter, with one thread or an older Triton the block is skipped by the caller
    (:func:`precompile`)."""
    mode = _async_mode()
    with ThreadPoolExecutor(max(1, min(COMPILE_THREADS, jobs))) as pool:
        with mode(pool, ignore_errors=True) as compiling:
            _ahead.on = True
            try:
                yield
            finally:
                _ahead.on = False
        built = [k.kernel for k in compiling.future_kernels.values() if getattr(k, "kernel", None) is not None]
        prepare_launchers(built, pool, device)


def launcher_key(kernel):
    """What a compiled kernel's launcher (a small C module Triton builds with the host's C compiler at the
    kernel's first launch) depends on: the types of its arguments, not its constexpr values; None when this
    Triton keeps no argument signature."""
    signature = getattr(getattr(kernel, "src", None), "signature", None)
    return None if signature is None else repr(sorted(signature.items(), key=str))


def prepare_launchers(kernels, pool, device: torch.device | None = None) -> int:
    """Build, in ``pool``'s threads, the launcher of one kernel per distinct :func:`launcher_key` among
    ``kernels`` (Triton's compiled kernels), so that their first launches -- the tuner's timing loop, the first
    graph capture -- load a launcher from Triton's cache instead of running the C compiler one kernel after
    another on a fresh machine. Launchers Triton cannot prepare (a kernel the device cannot run)
    are left for the real launch to report; ``device``: the CUDA device they load on (None: each thread's
    current one). Returns how many it prepared."""
    firsts = {}
    for kernel in kernels:
        key = launcher_key(kernel)
        if key is not None and getattr(kernel, "_run", 1) is None:  # not prepared yet
            firsts.setdefault(key, kernel)

    def prepare(kernel) -> bool:
        try:
            with torch.cuda.device(device) if device is not None else contextlib.nullcontext():
                kernel._init_handles()
            return True
        except Exception:  # noqa: BLE001 - the launch meets it again (out of resources: the tuner skips it)
            return False

    return sum(pool.map(prepare, firsts.values()))


def ahead_possible(device: torch.device | str) -> bool:
    """Whether :func:`compile_ahead` can build kernels for ``device``: CUDA (not the interpreter), more than one
    compile thread, and a Triton with asynchronous compiles (3.4 and later)."""
    return (torch.device(device).type == "cuda" and not interpreted() and COMPILE_THREADS > 1
            and _async_mode() is not None)


def precompile(jobs, device) -> None:
    """Compile the kernels of every candidate of every ``(candidates, run)`` job in one parallel batch, before
    :func:`fastest` times them one by one: a fresh machine otherwise builds dozens of kernels in a row (~0.2 s
    each) while tuning. Kernels already built (this process) or on Triton's disk cache cost a lookup."""
    device = torch.device(device)
    count = sum(len(candidates) for candidates, _ in jobs)
    if not ahead_possible(device) or count < 2:
        return
    with compile_ahead(count, device):
        for candidates, run in jobs:
            for cfg in candidates:
                try:
                    run(cfg)
                except Exception:  # noqa: BLE001 - the timing loop meets it again and skips the candidate
                    continue


L2_ENV = "HF_RSTITCH_TUNE_L2"  # "cold" (default): timed products read their weights from device memory; "warm"


def cold_copies(tensors: tuple, calls: int) -> list[tuple]:
    """``tensors`` (a product's weights; None kept) and copies of them, so many that a tuner cycling through them
    (:func:`cycling`) reads its weights from device memory, not from the L2 cache: twice L2's bytes in all (at
    most ``calls`` sets). A decode step reads each weight once, after a step's other weights went through L2; timed
    on one weight, a 4-30 MB product (most of a sub-2B model's, fitting the H100's 50 MB L2) is timed at L2's
    bandwidth and its fastest configuration is not the one that streams best from memory. ``HF_RSTITCH_TUNE_L2=warm``
    times the tensors alone (the choice as it was made before, for comparisons)."""
    mode = os.environ.get(L2_ENV, "cold").strip().lower()
    if mode not in ("cold", "warm"):
        raise ValueError(f"{L2_ENV} must be 'cold' (the default: weights read from device memory) or 'warm' "
                         f"(weights left in L2 between timed calls), got {mode!r}")
    real = [t for t in tensors if t is not None]
    if mode == "warm" or not real or real[0].device.type != "cuda":
        return [tuple(tensors)]
    size = sum(t.numel() * t.element_size() for t in real)
    l2 = torch.cuda.get_device_properties(real[0].device).L2_cache_size
    n = max(1, min(calls, -(-2 * l2 // max(size, 1))))
    return [tuple(tensors)] + [tuple(t.clone() if t is not None else None for t in tensors) for _ in range(n - 1)]


def cycling(sets: list[tuple]):
    """A function returning the next of ``sets`` at each call, round and round."""
    state = {"i": -1}

    def advance() -> tuple:
        state["i"] = (state["i"] + 1) % len(sets)
        return sets[state["i"]]
    return advance


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
