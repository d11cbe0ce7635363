"""How many CPU threads torch should use for the models a command is about to load.

torch starts one intra-op thread per core. For tiny models that is the wrong choice: a matmul of
the shipped 9.7M-parameter LLM is a few microseconds of work, so OpenMP's fork/join and its
spin-waiting cost more than the second thread saves, and on a machine whose cores are busy with
other work every op waits for a thread the kernel has descheduled. Measured on a 2-core machine
shared with other jobs: 122 tokens of plain ``generate`` on the shipped LLM took 77.8 s with 2
threads and 6.7 s with 1.

The rule (:func:`choose_threads`): when every model has fewer than :data:`TINY_PARAMS` parameters and
the user chose nothing (no ``OMP_NUM_THREADS``, no ``--threads``), use one thread. A model whose size
cannot be read without loading it (a Hub id not in the local cache) keeps torch's default.
Parameter counts come from the weight files' headers (:func:`count_params`), before anything loads.

Cheap to import (no torch at module level); :func:`apply_threads` sets the count through torch when torch is
loaded, else through ``OMP_NUM_THREADS``, which torch reads when it loads (so a command can still fail on bad
input before paying for torch's import).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Iterable, Mapping

TINY_PARAMS = 50_000_000  # below this (every model), one thread is faster on any CPU we measured
ENV = "OMP_NUM_THREADS"


def _safetensors_params(path: Path) -> int:
    """Parameters stored in one ``.safetensors`` file, from its header (the library maps no tensor data)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as fh:
        return sum(math.prod(fh.get_slice(name).get_shape()) for name in fh.keys())


def _cached_folder(repo_id: str) -> Path | None:
    """The local snapshot folder of a Hub model already in the cache (never downloads), or None."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # not an id the Hub accepts, or no huggingface_hub: size unknown
        return None
    return Path(found).parent if isinstance(found, str) else None


def count_params(source: str | os.PathLike) -> int | None:
    """Parameter count of a model folder or cached Hub id from its weight files; None if unknown."""
    folder = Path(source).expanduser()
    if not folder.is_dir():
        folder = _cached_folder(str(source))
        if folder is None:
            return None
    try:
        tensors = sorted(folder.glob("*.safetensors"))
        if tensors:
            return sum(_safetensors_params(p) for p in tensors)
        binaries = sorted(folder.glob("*.bin"))  # pickled: at least 2 bytes a parameter, so this over-counts
        return sum(p.stat().st_size for p in binaries) // 2 if binaries else None
    except Exception:  # noqa: BLE001  (an unreadable or foreign weight file: size unknown, torch decides)
        return None


def choose_threads(params: Iterable[int | None], requested: int | None = None,
                   env: Mapping[str, str] | None = None) -> tuple[int | None, str]:
    """``(threads to set or None to leave torch alone, why)`` for models of ``params`` parameters."""
    env = os.environ if env is None else env
    if requested is not None:
        return requested, f"--threads {requested}"
    if env.get(ENV):
        return None, f"{ENV}={env[ENV]}"
    counts = list(params)
    if not counts or any(c is None for c in counts):
        return None, "model size unknown before loading"
    if max(counts) >= TINY_PARAMS:
        return None, f"models of {max(counts) / 1e6:.0f}M parameters"
    sizes = " and ".join(f"{c / 1e6:.1f}M" for c in counts)
    return 1, (f"the models are tiny ({sizes} parameters), where more threads only add overhead; "
               f"--threads N or {ENV}=N overrides")


def apply_threads(sources: Iterable[str | os.PathLike], requested: int | None = None) -> str | None:
    """Set torch's thread count for models loaded from ``sources``; returns a line saying so, or None."""
    threads, why = choose_threads([count_params(s) for s in sources] if requested is None else [], requested)
    if threads is None:
        return None
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    else:
        os.environ[ENV] = str(threads)  # read by torch (OpenMP) when it loads
    return f"torch uses {threads} CPU thread{'s' if threads > 1 else ''}: {why}"
