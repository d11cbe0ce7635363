"""Where ``torch.compile`` keeps its caches for the fast engine: a directory that outlives the process.

Why: compiling the 7B + 1.5B pair costs ~30 s (``compile="parts"``) to ~100 s (``compile="decode"``)
in a fresh process. Inductor's FX-graph and AOTAutograd caches (on by default in torch 2.11) let a
later process reuse the generated kernels, but by default they live under the system temp directory
(``/tmp/torchinductor_<user>``), which containers, job schedulers and reboots wipe. Before its first
compile the fast engine therefore points inductor at ``$XDG_CACHE_HOME/hf_rstitch/inductor``
(``~/.cache/hf_rstitch/inductor``), or at ``$HF_RSTITCH_COMPILE_CACHE`` if set.

What it does not do: override a directory already chosen -- ``TORCHINDUCTOR_CACHE_DIR`` set by the
user, or by inductor itself once it has compiled anything in this process (it writes its choice back
into the environment) -- or cache anything itself. ``HF_RSTITCH_COMPILE_CACHE=off`` leaves torch's
default. The caches are keyed by torch version, device and graph, so one directory serves any mix.
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


def use_persistent_cache() -> str | None:
    """Point inductor's caches at the persistent directory unless one is already chosen.

    Returns the directory set now, or None when nothing was changed (a directory already chosen, or
    ``HF_RSTITCH_COMPILE_CACHE`` turned it off). Call before the process's first ``torch.compile``.
    """
    if TORCH_ENV in os.environ:
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
