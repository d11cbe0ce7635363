"""Checks on where a model or router comes from and where it runs, shared by the configs and
the CLI, so a typo gets a message about the typo: a missing local folder is reported as a missing
folder (not as an invalid Hub id), an unusable ``--device`` before any model loads.

Cheap to import (no torch at module level).
"""

from __future__ import annotations

import os
from pathlib import Path


def looks_local(source: str) -> bool:
    """True when ``source`` can only mean a path: it starts with ``.``, ``/`` or ``~``, has a
    backslash or more than one ``/``, or its parent folder exists here (``runs/llm`` with a local
    ``runs/``). A Hub id is ``name`` or ``owner/name``."""
    s = str(source)
    if s.startswith((".", "/", "~")) or "\\" in s or s.count("/") > 1 or os.path.isabs(s):
        return True
    parent = os.path.dirname(s)
    return bool(parent) and os.path.isdir(parent)


def check_local_source(source: str | os.PathLike, flag: str, needs: tuple[str, ...] = ("config.json",),
                       what: str = "a model saved with save_pretrained") -> None:
    """Raise ``FileNotFoundError`` if ``source`` is meant as a local folder but is not a usable one.

    A Hub id that is not a local path passes (the Hub loader reports its own errors)."""
    path = Path(source).expanduser()
    if path.exists():
        if not path.is_dir():
            raise FileNotFoundError(f"{flag} {source}: is a file; give the folder that holds {needs[0]} ({what}).")
        missing = [name for name in needs if not (path / name).is_file()]
        if missing:
            raise FileNotFoundError(f"{flag} {source}: the folder has no {' / '.join(missing)}; expected {what}.")
        return
    if looks_local(str(source)):
        raise FileNotFoundError(f"{flag} {source}: no such folder (looked for {path.resolve()}). Give the folder that "
                                f"holds {needs[0]} ({what}), or a Hub id such as owner/name.")


def check_device(device: str, flag: str = "--device") -> None:
    """Raise ``ValueError`` unless ``device`` is ``auto`` or a torch device this machine has."""
    if device == "auto":
        return
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"{flag} {device!r} is not a torch device ({err}); use cpu, cuda, cuda:1 or auto.") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"{flag} {device}: CUDA is not available on this machine (torch {torch.__version__}); "
                             "use --device cpu (or auto).")
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"{flag} {device}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}.")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{flag} {device}: MPS is not available on this machine; use --device cpu.")


def hub_offline() -> bool:
    """Whether the Hub is switched off (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``)."""
    return any(os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")
               for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def check_hub_source(source: str, flag: str, timeout: float = 5.0) -> None:
    """Raise ``OSError`` at once when ``source``, meant as a Hub id, cannot load.

    A local path, or a Hub id already in the Hugging Face cache, passes without any network call.
    Otherwise, offline (``HF_HUB_OFFLINE=1``) is an error at once; online, one metadata request
    (no retries) tells a missing or private repository from an unreachable Hub -- where
    ``from_pretrained`` would spend most of a minute retrying before failing with a long traceback.
    """
    source = str(source)
    if Path(source).expanduser().exists() or looks_local(source):
        return
    from huggingface_hub import try_to_load_from_cache

    try:
        if isinstance(try_to_load_from_cache(source, "config.json"), str):
            return
    except Exception:  # not a valid repo id: the request below, or from_pretrained, says so
        pass
    if hub_offline():
        raise OSError(f"{flag} {source}: not a local folder, and not in the Hugging Face cache while the Hub is "
                      "off (HF_HUB_OFFLINE=1). Give a local folder (save_pretrained), or download it first with "
                      f"the Hub on (hf download {source}).")
    from huggingface_hub import HfApi
    from huggingface_hub.utils import RepositoryNotFoundError

    try:
        HfApi().model_info(source, timeout=timeout)
    except RepositoryNotFoundError:
        raise OSError(f"{flag} {source}: no such model on the Hugging Face Hub (or it is private: log in with "
                      "`hf auth login`). Check the id, or give a local folder.") from None
    except Exception as err:  # DNS, proxy, timeout, HTTP 5xx: the Hub cannot be asked
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise OSError(f"{flag} {source}: cannot reach the Hugging Face Hub ({first}), and the model is not in the "
                      "local cache. Check the network, or give a local folder (HF_HUB_OFFLINE=1 skips the Hub)."
                      ) from None


ROUTER_FILES = ("config.json", "model.safetensors")
ROUTER_WHAT = "a router saved with Router.save_pretrained (rstitch train-router writes OUT/router)"


def check_router_source(source, flag: str) -> None:
    """:func:`check_local_source` then :func:`check_hub_source` for a router given as a folder or Hub id;
    ``"shipped"`` and router objects pass."""
    if not isinstance(source, (str, os.PathLike)) or str(source) in ("", "shipped", "shipped:router"):
        return
    check_local_source(source, flag, needs=ROUTER_FILES, what=ROUTER_WHAT)
    check_hub_source(str(source), flag)


def check_sources(flags: dict[str, str | None]) -> None:
    """Pre-check every ``{flag: source}`` a command is about to load, before anything loads: a model
    (``shipped:NAME``, folder or Hub id) or, for a flag naming a router, a router. Empty sources are skipped."""
    from .resources import resolve

    for flag, source in flags.items():
        if not source:
            continue
        if "router" in flag:
            check_router_source(source, flag)
        else:
            check_local_source(resolve(source), flag)
            check_hub_source(resolve(source), flag)


def one_line(err: BaseException) -> str:
    """An exception as one line (transformers' and the Hub's messages span several)."""
    text = " ".join(part.strip() for part in str(err).splitlines() if part.strip())
    return text or type(err).__name__
