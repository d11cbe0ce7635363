"""Compiled Triton kernels shipped in the package: an archive per GPU kind that seeds Triton's cache directory.

Why: on a fresh machine a lane's first build compiles every Triton kernel it launches (~46 for the Qwen2 7B / 1.5B
pair: ~30 s of compiles, ~8 s of the first call with 16 threads) and builds their launchers with the host's C
compiler -- most of the first call (``benchmarks/results/engine_warmup_*.md``). The package therefore carries,
for the GPUs it was measured on, Triton's own cache entries for the kernels of the common model shapes
(``hf_rstitch/assets/triton_kernels/<gpu>.tar.gz``, with ``<gpu>.json`` saying what it holds: :data:`SHIPPED_DIR`).
Before a lane builds its first kernel (:func:`seed`), the entries of the archive whose identity is exactly this
machine's -- GPU (name, compute capability, multiprocessors, memory), torch and Triton versions -- are copied
into Triton's cache directory (``TRITON_CACHE_DIR``, else ``~/.triton/cache``) where it has none of the same
name; Triton then loads them as if it had compiled them itself.

Why this is safe: Triton names each entry by a hash of everything the compile depended on (the kernel's source
and the sources it calls, its specialisation, compile options, Triton's version and backend; for a launcher its
C source, compiler flags, include paths and platform). A kernel whose code changed since the archive was made
looks for another name and is compiled as before; entries nobody asks for cost only disk. Entries keep only
what Triton reads back (metadata and the GPU binary, launchers' shared objects), not the intermediate IRs.

The same cache holds markers (:func:`steps_marker`): a lane that built the kernels of its steps ahead
(:mod:`hf_rstitch.fast.lane_ahead`) notes it there for its machine, kernel code and signature, so that a later
lane of the same signature skips that work; archives carry them like Triton's entries.

Why an archive goes stale: Triton's entry names also hash each kernel's first line number, so an edit anywhere
in a kernel's module above it (host code too) renames its entries, and the archive's markers name the kernel
code as a whole (:func:`kernels_hash`). The index therefore records the kernel code it was made from
(``kernel_sources``); :func:`freshness` compares it with this package's, ``tools/check_assets.py`` reports it
and the GEMV tuning tables' state (``make check-assets``), and :func:`seed` warns once where it differs: a fresh
machine then builds kernels in its first call until the archive is made again. On an H200 the first call took
60.7 s with both this archive and the tuning table stale, against 3.6 s with both current
(``benchmarks/results/engine_shapes_nvidia_h200_qwen2_policies.md``).

What it does not do: touch a cache Triton does not keep in plain files (``TRITON_CACHE_MANAGER`` set: remote
or custom caches), overwrite an entry, or seed off CUDA. ``HF_RSTITCH_SHIPPED_KERNELS=off`` turns it off.
``tools/triton_kernels_asset.py`` writes the archive on a GPU in one command.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import os
import shutil
import tarfile
import tempfile
import uuid
from pathlib import Path

import torch

from ...resources import ASSETS

ENV = "HF_RSTITCH_SHIPPED_KERNELS"  # "off" / "0": never seed Triton's cache
SHIPPED_DIR = ASSETS / "triton_kernels"  # <gpu>.json (identity, archive name) + <gpu>.tar.gz
FORMAT = 1
OFF = ("", "0", "off", "false", "no")
KEPT_SUFFIXES = (".json", ".cubin", ".hsaco", ".so")  # what Triton reads back: metadata, binaries, launchers
GROUP = "__grp__"  # Triton's index of an entry's files (absolute paths, rewritten when seeding)

log = logging.getLogger("hf_rstitch.fast")


@functools.lru_cache(maxsize=16)
def identity(device: str) -> str:
    """The machine an archive made on ``device`` holds for: the GPU, torch and Triton (not the kernels' code:
    Triton's entry names hash it, see the module docstring)."""
    import triton

    from .tuning_cache import hardware

    return f"{hardware(device)}|torch {torch.__version__}|triton {triton.__version__}"


def enabled() -> bool:
    return os.environ.get(ENV, "on").strip().lower() not in OFF


def cache_dir() -> Path | None:
    """Triton's cache directory as its next compile will use it, or None where it keeps no plain files there
    (a custom or remote cache manager) or this Triton has no ``knobs``."""
    try:
        from triton import knobs
    except ImportError:
        return None
    if os.environ.get("TRITON_CACHE_MANAGER") or getattr(knobs.cache, "manager_class", None) is not None:
        return None
    path = knobs.cache.dir
    return Path(path) if path else None


def indices(shipped: Path | None = None) -> list[tuple[Path, dict]]:
    """Every readable archive index under ``shipped`` (default :data:`SHIPPED_DIR`), with its path."""
    shipped = SHIPPED_DIR if shipped is None else shipped
    found = []
    for index in sorted(shipped.glob("*.json")) if shipped.is_dir() else []:
        try:
            about = json.loads(index.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(about, dict) and about.get("format") == FORMAT:
            found.append((index, about))
    return found


def archive_for(machine: str, shipped: Path | None = None) -> tuple[Path, list[str], dict] | None:
    """The archive under ``shipped`` (default :data:`SHIPPED_DIR`) made on ``machine`` (an :func:`identity`), the
    entries its index lists and the index, or None: only an exact match counts."""
    for index, about in indices(shipped):
        if about.get("identity") == machine:
            archive = index.with_name(str(about.get("archive", "")))
            return (archive, list(about.get("entries", [])), about) if archive.is_file() else None
    return None


def freshness(about: dict) -> str:
    """Whether an archive's index was made from this package's kernel code: ``"current"``, ``"stale"`` (its
    entries and markers name other code: kernels are built again), or ``"unknown"`` (an index that does not say)."""
    made_from = about.get("kernel_sources")
    return "unknown" if not made_from else "current" if made_from == kernels_hash() else "stale"


_SEEDED: dict[str, int] = {}  # machine -> entries seeded by this process (once each)


def seed(device: torch.device | str) -> int:
    """Copy the shipped archive of this machine into Triton's cache, once a process: call before the first
    Triton compile. Returns how many entries it added (0: off, no archive for this machine, or all there)."""
    device = torch.device(device)
    if device.type != "cuda" or not enabled():
        return 0
    try:
        machine = identity(str(device))
    except ImportError:  # no Triton: nothing compiles, nothing to seed
        return 0
    if machine not in _SEEDED:
        target, found = cache_dir(), archive_for(machine)
        _SEEDED[machine] = 0
        if target is not None and found is not None:
            archive, listed, about = found
            if freshness(about) == "stale":
                log.warning("hf_rstitch: the shipped Triton kernels for this GPU (%s) were made from other kernel "
                            "code than this package's: a first call may build its kernels (up to a minute on an "
                            "H200) unless Triton's cache holds them. In a checkout of the repository, "
                            "`make check-assets` lists the stale assets and `bash benchmarks/gpu_assets.sh` makes "
                            "them again on this GPU.", archive.name)
            missing = not listed or not all((target / name).is_dir() for name in listed)
            _SEEDED[machine] = seed_from(archive, target) if missing else 0  # all there: the archive stays shut
    return _SEEDED[machine]


def seeded() -> int:
    """Entries this process put into Triton's cache from the shipped archive (:func:`seed`)."""
    return sum(_SEEDED.values())


def seed_from(archive: Path, target: Path) -> int:
    """Put each entry of ``archive`` that ``target`` lacks into it (whole entries, each moved in with one
    rename, so a concurrent process or Triton never sees half of one); unreadable archives or an unwritable
    ``target`` cost a warning. Returns how many entries it added."""
    try:
        target.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(dir=target, prefix=f"tmp.hf_rstitch_{os.getpid()}_"))
    except OSError as err:
        log.warning("hf_rstitch: cannot write Triton's cache %s (%s): kernels are compiled, not taken from the "
                    "shipped ones. Set TRITON_CACHE_DIR to a writable directory, or %s=off.", target, err, ENV)
        return 0
    added = 0
    try:
        with tarfile.open(archive, "r:*") as tar:
            entries = _entries(tar)
            for name, members in entries.items():
                if (target / name).exists():
                    continue
                added += _move_in(tar, name, members, scratch, target)
    except (OSError, tarfile.TarError, ValueError) as err:
        log.warning("hf_rstitch: cannot read the shipped Triton kernels %s (%s): they are compiled instead.",
                    archive, err)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if added:
        log.info("hf_rstitch: %d shipped Triton cache entries put in %s", added, target)
    return added


def _entries(tar: tarfile.TarFile) -> dict[str, list[tarfile.TarInfo]]:
    """The archive's files by entry (``<entry>/<file>``, plain files only); anything else is refused."""
    entries: dict[str, list[tarfile.TarInfo]] = {}
    for member in tar.getmembers():
        parts = member.name.split("/")
        if not member.isfile() or len(parts) != 2 or not all(parts) or parts[0].startswith(".") or ".." in parts:
            raise ValueError(f"unexpected member {member.name!r} (expected <entry>/<file>)")
        entries.setdefault(parts[0], []).append(member)
    return entries


def _move_in(tar: tarfile.TarFile, name: str, members, scratch: Path, target: Path) -> int:
    """Write one entry under ``scratch`` (its group indices pointing at ``target / name``), then rename it into
    ``target``; 0 when another process put one there first."""
    staged = scratch / f"{name}.{uuid.uuid4().hex}"
    staged.mkdir()
    final = target / name
    for member in members:
        data = tar.extractfile(member).read()
        file = member.name.split("/")[1]
        if file.startswith(GROUP):  # child name -> absolute path, as Triton's FileCacheManager reads it
            children = json.loads(data)["child_paths"]
            data = json.dumps({"child_paths": {c: str(final / c) for c in children}}).encode()
        (staged / file).write_bytes(data)
    try:
        os.rename(staged, final)
    except OSError:  # there now (another process), or a file of that name
        return 0
    return 1


# ---- markers: a lane's steps' kernels are in this cache (lane_ahead._steps_ahead) ----------------------------
STEPS = "hf_rstitch_steps_"  # entry name prefix of a marker (packed and seeded like Triton's entries)


CACHES = ("triton_cache.py", "tuning_cache.py")  # this package's modules that hold no kernel code: the caches'


@functools.lru_cache(maxsize=1)
def kernels_hash() -> str:
    """The Triton kernels' code (every module of this package but the caches', :data:`CACHES`: the kernels and the
    host code that picks their launches): a change is a new marker, and makes a shipped archive made before it
    stale (:func:`freshness`)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(__file__).parent.glob("*.py") if p.name not in CACHES):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def steps_marker(device: torch.device | str, signature: str) -> Path | None:
    """The marker file saying that every kernel the steps of a lane of ``signature`` launch (its shapes, plan,
    cache length, ...) is in Triton's cache, for this machine and kernel code; None where Triton's cache is not
    plain files (nothing is skipped then)."""
    target = cache_dir()
    if target is None or torch.device(device).type != "cuda":
        return None
    key = f"{identity(str(device))}|{kernels_hash()}|{signature}"
    return target / f"{STEPS}{hashlib.sha256(key.encode()).hexdigest()[:32]}" / "steps.json"


def mark(marker: Path, signature: str) -> None:
    """Write ``marker`` (whole, with one rename; an existing one stays); a cache that cannot be written costs
    nothing but the next process's steps built ahead again."""
    root = marker.parent.parent
    try:
        root.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(dir=root, prefix=f"tmp.hf_rstitch_{os.getpid()}_"))
    except OSError:
        return
    try:
        (staged / marker.name).write_text(json.dumps({"signature": signature}) + "\n")
        os.rename(staged, marker.parent)
    except OSError:  # there already (another process), or the cache cannot be written
        shutil.rmtree(staged, ignore_errors=True)


# ---- making an archive (tools/triton_kernels_asset.py) --------------------------------------------------
def pack(source: Path, machine: str, stem: str, out_dir: Path | None = None, about: dict | None = None) -> dict:
    """Write ``<stem>.tar.gz`` and ``<stem>.json`` under ``out_dir`` from the Triton cache directory ``source``
    (a cache a process filled from empty): every entry, with only what Triton reads back, group indices holding
    child names instead of ``source``'s paths; ``about``: more for the index (what made it). Returns the index it
    wrote (plus the archive's bytes)."""
    out_dir = SHIPPED_DIR if out_dir is None else out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    archive = out_dir / f"{stem}.tar.gz"
    kernels = launchers = 0
    names = []
    with tarfile.open(archive, "w:gz", compresslevel=9) as tar:  # gzip: a few times faster to read back than xz
        for entry in sorted(p for p in source.iterdir() if p.is_dir() and not p.name.startswith("tmp.")):
            files = sorted(f for f in entry.iterdir() if f.is_file() and f.suffix in KEPT_SUFFIXES)
            groups = [f for f in files if f.name.startswith(GROUP)]
            for group in groups:
                children = json.loads(group.read_text())["child_paths"]
                kept = {c: c for c in children if Path(c).suffix in KEPT_SUFFIXES}
                _add(tar, f"{entry.name}/{group.name}", json.dumps({"child_paths": kept}).encode())
            for f in files:
                if f not in groups:
                    _add(tar, f"{entry.name}/{f.name}", f.read_bytes())
            kernels += bool(groups)
            launchers += any(f.suffix == ".so" for f in files)
            names += [entry.name] if files else []
    about = {"format": FORMAT, "identity": machine, "archive": archive.name, "kernel_sources": kernels_hash(),
             **(about or {}), "kernels": kernels,
             "shared_objects": launchers, "entries": names}
    (out_dir / f"{stem}.json").write_text(json.dumps(about, indent=1) + "\n")
    return {**about, "bytes": archive.stat().st_size}


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))
