"""The GEMV tuner's choices kept on disk, so that a later process on the same machine does not tune again.

Why: a lane times every candidate launch configuration of its products when it is built
(:func:`hf_rstitch.fast.kernels.gemv.tune`, :func:`hf_rstitch.fast.kernels.gated.tune`): seconds for a 7B + 1.5B pair even
with Triton's kernel cache warm (``benchmarks/results/engine_warmup_*.md``), in every process. :class:`TuningTable` is the process's table of choices (a dict, keyed by shape, dtype and
tier) that also reads and writes ``$XDG_CACHE_HOME/hf_rstitch/gemv_tuning.json``
(``~/.cache/hf_rstitch/...``, or ``$HF_RSTITCH_TUNING_CACHE``; ``off`` keeps it in memory).

An entry counts only for the machine and code that chose it: the GPU (name, multiprocessors,
memory), torch and Triton versions, and a hash of the kernels' source files and candidate lists
(:func:`identity`). Anything else -- another GPU, a MIG slice, new candidates -- tunes afresh and adds
its own entries. Unreadable or foreign files are ignored (with a warning), never fatal: the table then
lives in memory as before. Several processes may write at once (each merges, then replaces the file);
one may lose another's new entries, which are tuned again next time.

Shipped choices: the package carries tables of the same format for the GPUs it was measured on
(``hf_rstitch/assets/gemv_tuning/<gpu>.json``, the common model shapes; :data:`SHIPPED_DIR`), read when
this machine's file has no entry for a key. Their keys hold the same identity, so they count only for the
same GPU, torch, Triton and kernel code -- a kernel or candidate change misses them, and the shape is timed as
before. ``tools/gemv_tuning_table.py`` regenerates them on a GPU in one command;
``HF_RSTITCH_SHIPPED_TUNING=off`` ignores them.

What it does not do: carry Triton's compiled kernels (Triton's own cache does), or choose across
machines: delete the file (or set ``HF_RSTITCH_TUNING_CACHE=off``) to time everything again.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import tempfile
from pathlib import Path

import torch

from ...resources import ASSETS

ENV = "HF_RSTITCH_TUNING_CACHE"  # a file path, or "off" / "0" / "" for memory only
SHIPPED_ENV = "HF_RSTITCH_SHIPPED_TUNING"  # "off" / "0": ignore the shipped tables
SHIPPED_DIR = ASSETS / "gemv_tuning"  # <gpu>.json: tables measured on that GPU kind, in this module's format
FORMAT = 1
OFF = ("", "0", "off", "false", "no")

log = logging.getLogger("hf_rstitch.fast")


def default_path() -> Path | None:
    """The file the choices live in (None: memory only, ``HF_RSTITCH_TUNING_CACHE=off``)."""
    setting = os.environ.get(ENV)
    if setting is not None:
        return None if setting.strip().lower() in OFF else Path(setting).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hf_rstitch" / "gemv_tuning.json"


def shipped_paths() -> list[Path]:
    """The shipped tables (:data:`SHIPPED_DIR`), none with ``HF_RSTITCH_SHIPPED_TUNING=off``."""
    if os.environ.get(SHIPPED_ENV, "on").strip().lower() in OFF or not SHIPPED_DIR.is_dir():
        return []
    return sorted(SHIPPED_DIR.glob("*.json"))


@functools.lru_cache(maxsize=1)
def _code_hash() -> str:
    """The kernels' source files and candidate lists (their search spaces; not :mod:`.shortlist`, which only
    decides what a lane times): a change to either is a new tuning."""
    from . import gated, gemv, triton_support

    digest = hashlib.sha256()
    for module in (gemv, gated, triton_support):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:16]


CODE_IN_KEY = re.compile(r"\|code ([0-9a-f]+)")  # an encoded key's kernel-code part (:func:`identity`)


def key_codes(keys) -> set[str]:
    """The kernel-code hashes that encoded table keys name."""
    return {m.group(1) for key in keys for m in [CODE_IN_KEY.search(key)] if m}


def freshness(table: Path) -> str:
    """Whether a shipped table's keys name this package's kernel code (:func:`_code_hash`): ``"current"``,
    ``"stale"`` (a kernel or search space changed since: its shapes are timed again on a fresh machine), or
    ``"unknown"`` (no entry names a code, or the file cannot be read as a table)."""
    try:
        entries = json.loads(table.read_text()).get("entries", {})
    except (OSError, ValueError, AttributeError):
        return "unknown"
    codes = key_codes(entries)
    return "unknown" if not codes else "current" if codes == {_code_hash()} else "stale"


def hardware(device: str) -> str:
    """``device``'s GPU as the keys name it: name, compute capability, multiprocessors, memory (a MIG slice or
    another card of the same name differs); the device type off CUDA."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return dev.type
    p = torch.cuda.get_device_properties(dev)
    return f"{p.name}|sm{p.major}{p.minor}|{p.multi_processor_count}sm|{p.total_memory >> 20}MiB"


@functools.lru_cache(maxsize=16)
def identity(device: str) -> str:
    """What an entry chosen on ``device`` holds for: the GPU, torch, Triton and the kernels' code."""
    import triton

    return f"{hardware(device)}|torch {torch.__version__}|triton {triton.__version__}|code {_code_hash()}"


def _encode_key(key: tuple, kept: tuple) -> str | None:
    """A table key ``([name,] shape, dtype, has_bias, device, rows)`` as text, its device as its identity;
    None for a device whose type is not in ``kept`` (off CUDA nothing is timed: nothing worth keeping)."""
    *head, shape, dtype, bias, device, rows = key
    if torch.device(device).type not in kept:
        return None
    return json.dumps([*head, list(shape), str(dtype), bool(bias), identity(device), rows])


def _encode_value(value) -> dict | None:
    return None if value is None else {"type": type(value).__name__, **dataclasses.asdict(value)}


def _decode_value(value):
    from .gemv import GemvConfig

    if value is None:
        return None
    fields = {k: v for k, v in value.items() if k != "type"}
    if value.get("type") != GemvConfig.__name__:
        raise ValueError(f"unknown configuration type {value.get('type')!r}")
    return GemvConfig(**fields)


class TuningTable(dict):
    """The tuner's table (``key -> GemvConfig | None``), backed by a JSON file (see the module docstring).

    ``key in table`` also finds choices an earlier process wrote for this machine and code, then those of the
    ``shipped`` tables (default: :func:`shipped_paths`); setting a key writes it to the file. Only keys of the
    device types in :attr:`kept` go to the file."""

    kept = ("cuda",)

    def __init__(self, path: Path | None | str = "default", shipped: list | str = "default"):
        super().__init__()
        self.path = default_path() if path == "default" else (Path(path) if path is not None else None)
        self.shipped = shipped_paths() if shipped == "default" else [Path(p) for p in shipped]
        self._disk: dict[str, dict | None] | None = None  # encoded key -> encoded value, read on first use
        self._shipped: dict[str, dict | None] | None = None  # the shipped tables' entries, merged
        self.from_shipped = 0  # keys found in a shipped table
        self._warned: set[str] = set()

    def __contains__(self, key) -> bool:
        return super().__contains__(key) or self._load(key)

    def __getitem__(self, key):
        if not super().__contains__(key) and not self._load(key):
            raise KeyError(key)
        return super().__getitem__(key)

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        encoded = _encode_key(key, self.kept) if self.path is not None else None
        if encoded is not None:
            self._entries()[encoded] = _encode_value(value)
            self._save(encoded)

    # ---- the file -------------------------------------------------------------------------------
    def _load(self, key) -> bool:
        """Put the file's choice for ``key`` in memory, else a shipped table's; False when neither has one."""
        encoded = _encode_key(key, self.kept) if self.path is not None or self.shipped else None
        if encoded is None:
            return False
        for entries, where in ((self._entries() if self.path is not None else {}, self.path),
                               (self._shipped_entries(), "a shipped tuning table")):
            if encoded not in entries:
                continue
            try:
                value = _decode_value(entries[encoded])
            except (TypeError, ValueError) as err:
                self._warn("entry", f"an entry of {where} is not a configuration ({err}); tuning that shape again")
                return False
            super().__setitem__(key, value)
            self.from_shipped += entries is self._shipped
            return True
        return False

    def _shipped_entries(self) -> dict:
        if self._shipped is None:
            self._shipped = {}
            for path in self.shipped:
                self._shipped.update(self._read(warn=True, path=path))
        return self._shipped

    def _entries(self) -> dict:
        if self._disk is None:
            self._disk = self._read(warn=True)
        return self._disk

    def _read(self, warn: bool, path: Path | None = None) -> dict:
        """The entries of the file (or of ``path``): {} when there is none, or it is unreadable or foreign (a
        warning if ``warn``)."""
        path = path or self.path
        try:
            data = json.loads(path.read_text())
        except (FileNotFoundError, NotADirectoryError):  # none yet (the write says if it cannot be made)
            return {}
        except (OSError, ValueError) as err:
            if warn:
                self._warn(f"read {path}", f"cannot read {path} ({err}); tuning again"
                           + (" and writing a new one" if path == self.path else ""))
            return {}
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
            if warn:
                self._warn(f"read {path}", f"{path} is not a tuning table of format {FORMAT}; tuning again"
                           + (" and replacing it" if path == self.path else ""))
            return {}
        return dict(data["entries"])

    def _save(self, encoded: str) -> None:
        """Merge this process's new entry into the file as it is now, then replace it in one step."""
        try:
            current = self._read(warn=False)  # as another process may have left it
            current[encoded] = self._disk[encoded]
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump({"format": FORMAT, "entries": current}, f, indent=0)
            os.replace(tmp, self.path)
        except OSError as err:
            self._warn("write", f"cannot write {self.path} ({err}); the choices stay in this process. Set {ENV} to a "
                       "writable file, or to 'off'.")

    def _warn(self, kind: str, message: str) -> None:
        """One warning of each kind a table (a file that cannot be written would warn on every tuned shape)."""
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("hf_rstitch: %s", message)
