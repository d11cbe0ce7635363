"""Which models a run used: name, Hub revision (commit) or a fingerprint of a local folder.

Recorded in ``run.json`` by ``rstitch eval`` and in ``rstitch tune``'s JSON so a result can be tied
to the exact checkpoint. Reads only the local Hub cache and file metadata: no network, no hashing
of weights.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any


def _hub_revision(repo_id: str, revision: str | None = None) -> str | None:
    """Commit of the cached snapshot ``from_pretrained(repo_id)`` loads, or None when not cached."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    except Exception:  # not a valid repo id
        return None
    if not isinstance(found, str):
        return None
    parts = Path(found).parts
    return parts[parts.index("snapshots") + 1] if "snapshots" in parts else None


def folder_fingerprint(folder: Path) -> str:
    """sha256 (16 hex digits) of config.json's bytes and the weight files' names and sizes."""
    digest = hashlib.sha256()
    config = folder / "config.json"
    if config.is_file():
        digest.update(config.read_bytes())
    for weights in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin")):
        digest.update(f"{weights.name}:{weights.stat().st_size}".encode())
    return digest.hexdigest()[:16]


def model_provenance(ref: Any, revision: str | None = None) -> dict[str, Any]:
    """``{"name": ..., "revision": commit or None, "fingerprint": ... for a local folder}``."""
    from ..resources import reference, resolve

    if not isinstance(ref, (str, Path)):
        name = getattr(ref, "name_or_path", None) or type(ref).__name__
        return model_provenance(name, revision) if isinstance(name, str) and name else {"name": str(name)}
    name = str(ref)
    path = Path(resolve(name))
    if path.is_dir():
        return {"name": reference(name), "path": str(path.resolve()), "revision": None, "fingerprint": folder_fingerprint(path)}
    return {"name": name, "revision": _hub_revision(name, revision)}
