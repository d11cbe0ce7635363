"""Proofs kept on disk: what the on-machine probe (:mod:`hf_rstitch.fast.proof`) found, one small JSON file a key.

Where: ``$HF_HOME/hf_rstitch/proofs/`` (``huggingface_hub.constants.HF_HOME``: ``~/.cache/huggingface`` unless set),
or ``$HF_RSTITCH_PROOFS`` (a folder; ``off``: memory only). A key names everything a proof holds for: the GPU
(name, compute capability), the profile, torch, Triton, transformers and hf_rstitch versions, the two models'
types and dtypes, and the engine configuration (:func:`key_for`); its file is named by a hash of it.

Several processes may prove at once: each writes a whole file under a temporary name, then renames it over the
key's (an atomic replace on one file system), so a reader sees one complete proof or none, never a mix. A file
that cannot be read as a proof (torn by a crash, edited by hand) counts as no proof -- the probe runs again and
replaces it -- and is named in :func:`entries` so ``rstitch env`` shows it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

ENV = "HF_RSTITCH_PROOFS"  # a folder, or "off" / "0" for memory only
OFF = ("", "0", "off", "false", "no")
FORMAT = 1
_MEMORY: dict[str, dict] = {}  # key hash -> record, where no folder is used


def folder() -> Path | None:
    """The folder proofs live in (None: memory only)."""
    setting = os.environ.get(ENV)
    if setting is not None:
        return None if setting.strip().lower() in OFF else Path(setting).expanduser()
    from huggingface_hub import constants

    return Path(constants.HF_HOME) / "hf_rstitch" / "proofs"


def key_for(llm, slm, config, device) -> dict:
    """What a proof of this pair holds for on this machine (a JSON-able dict)."""
    import torch
    import transformers

    from . import capabilities

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    device = torch.device(device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    capability = list(torch.cuda.get_device_capability(device)) if device.type == "cuda" else None
    return {"gpu": gpu, "capability": capability, "profile": config.profile or capabilities.active_profile(),
            "torch": torch.__version__, "triton": triton_version, "transformers": transformers.__version__,
            "hf_rstitch": _package_version(), "llm": [_kind(llm), str(llm.dtype)], "slm": [_kind(slm), str(slm.dtype)],
            "config": config.key()}


def _package_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("hf_rstitch")
    except metadata.PackageNotFoundError:
        return "unknown"


def _kind(model) -> str:
    return getattr(model.config.get_text_config(), "model_type", None) or model.config.model_type


def digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


def load(key: dict) -> dict | None:
    """The stored record for ``key`` (``{"key", "passed", "reason", "metrics", "seconds", "date"}``), or None."""
    name = digest(key)
    where = folder()
    if where is None:
        return _MEMORY.get(name)
    record = _read(where / f"{name}.json")
    return record if record is not None and record.get("key") == key else None


def save(key: dict, passed: bool, reason: str | None, metrics: dict, seconds: float) -> dict:
    """Store the probe's verdict for ``key`` (replacing any); a folder that cannot be written keeps it in memory."""
    record = {"format": FORMAT, "key": key, "passed": passed, "reason": reason, "metrics": metrics,
              "seconds": round(seconds, 3), "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    name, where = digest(key), folder()
    if where is None:
        _MEMORY[name] = record
        return record
    try:
        where.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=where)
        with os.fdopen(handle, "w") as out:
            json.dump(record, out, indent=1)
        os.replace(temporary, where / f"{name}.json")  # atomic: readers see the old proof or this one
    except OSError:
        _MEMORY[name] = record
    return record


def _read(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(record, dict) and record.get("format") == FORMAT and isinstance(record.get("key"), dict)
    return record if ok and isinstance(record.get("passed"), bool) else None


def entries() -> list[dict]:
    """Every stored proof (memory included), oldest first; unreadable files as ``{"file", "unreadable": True}``."""
    found = list(_MEMORY.values())
    where = folder()
    if where is not None and where.is_dir():
        for path in sorted(where.glob("*.json")):
            record = _read(path)
            found.append(record if record is not None else {"file": str(path), "unreadable": True})
    return sorted(found, key=lambda r: r.get("date", ""))


def describe(record: dict) -> str:
    """One line of a stored proof, as ``rstitch env`` prints it."""
    if record.get("unreadable"):
        return f"unreadable (ignored; the probe runs again and replaces it): {record['file']}"
    key = record["key"]
    cap = "" if key["capability"] is None else " sm{}{}".format(*key["capability"])
    verdict = "passed" if record["passed"] else f"FAILED ({record['reason']})"
    return (f"{key['llm'][0]}/{key['slm'][0]} {key['llm'][1].replace('torch.', '')} on {key['gpu']}{cap} "
            f"[{key['profile']}; torch {key['torch']}, triton {key['triton']}, hf_rstitch {key['hf_rstitch']}]: "
            f"{verdict}, {record['seconds']:.2f} s, {record['date']}")
