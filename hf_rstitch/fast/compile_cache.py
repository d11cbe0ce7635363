"""Where ``torch.compile`` keeps its caches for the fast engine: a directory that outlives the process.

Why: compiling the 7B + 1.5B pair costs ~30 s (``compile="parts"``) to ~100 s (``compile="decode"``)
in a fresh process. Inductor's FX-graph and AOTAutograd caches (on by default in torch 2.11) let a
later process reuse the generated kernels, but by default they live under the system temp directory
(``/tmp/torchinductor_<user>``), which containers, job schedulers and reboots wipe. Before its first
compile the fast engine therefore points inductor at ``$XDG_CACHE_HOME/hf_rstitch/inductor``
(``~/.cache/hf_rstitch/inductor``), or at ``$HF_RSTITCH_COMPILE_CACHE`` if set.

What it does not do: override a directory the user chose (``TORCHINDUCTOR_CACHE_DIR`` set to anything
but torch's default -- torch itself writes its default into the environment as soon as dynamo is
imported, which ``import transformers`` does, so only a different value counts as a choice), or cache
anything itself. ``HF_RSTITCH_COMPILE_CACHE=off`` leaves torch's default. The caches are keyed by
torch version, device and graph, so one directory serves any mix.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

ENV = "HF_RSTITCH_COMPILE_CACHE"  # a directory, or "off" / "0" / "" for torch's default
TORCH_ENV = "TORCHINDUCTOR_CACHE_DIR"

log = logging.getLogger("hf_rstitch.fast")


def default_dir() -> Path:
    """``$XDG_CACHE_HOME/hf_rstitch/inductor`` (``~/.cache/hf_rstitch/inductor`` when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hf_rstitch" / "inductor"


def user_chose() -> bool:
    """Whether ``TORCHINDUCTOR_CACHE_DIR`` holds a directory other than torch's default."""
    chosen = os.environ.get(TORCH_ENV)
    if chosen is None:
        return False
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # a torch without it: take any value as the user's
        return True
    return os.path.abspath(chosen) != os.path.abspath(default_cache_dir())


def use_persistent_cache() -> str | None:
    """Point inductor's caches at the persistent directory unless the user chose one.

    Returns the directory set now, or None when nothing was changed (the user's directory, or
    ``HF_RSTITCH_COMPILE_CACHE`` turned it off). Call before the process's first ``torch.compile``.
    """
    if user_chose():
        return None
    setting = os.environ.get(ENV)
    if setting is not None and setting.strip().lower() in ("", "0", "off", "false", "no"):
        return None
    path = str(Path(setting).expanduser() if setting else default_dir())
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:  # read-only home, ...: keep torch's default rather than fail a generation
        log.warning("hf_rstitch: cannot create the compile cache %s (%s); torch's default is used. Set %s to a "
                    "writable directory, or to 'off'.", path, err, ENV)
        return None
    os.environ[TORCH_ENV] = path
    log.info("hf_rstitch: torch.compile caches in %s (set %s or %s to choose another)", path, TORCH_ENV, ENV)
    return path
