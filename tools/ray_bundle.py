"""Build a Ray Serve bundle small enough to carry to a GPU machine that has no Ray and no network.

Ray's wheel is ~80 MB, most of it a Java jar and unstripped binaries. This script rebuilds it for one Python
version without what Ray Serve never loads -- the Java jar, the dashboard's web front end, RLlib, Data, Tune,
Train, Ray LLM -- with its three native binaries stripped of symbols, stores it uncompressed in the wheel and
xz-compresses the whole file (one solid stream compresses far better than a zip's per-file deflate). Beside it
go the wheels of the few packages that Ray and the server need and that the GPU image lacks (``DEPS``), and an
``install.sh`` that installs everything with ``pip --no-index --target`` (default ``/tmp/site``):

    python tools/ray_bundle.py --out .ray                     # Python 3.12 (the GPU image's), into .ray/
    python tools/ray_bundle.py --out /tmp/b311 --python 3.11  # the same for this machine's Python, to test it
    bash .ray/install.sh /tmp/site && export PYTHONPATH=/tmp/site

On the GPU machine: carry ``.ray`` and start the command with ``bash .ray/install.sh && export
PYTHONPATH=/tmp/site:$PYTHONPATH``. It needs only ``python3`` with pip and the lzma module.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

RAY = "2.60.0"
# what Ray Serve never imports (Java workers, the dashboard's browser app, the other Ray libraries)
DROP = ("ray/jars/", "ray/dashboard/client/build/", "ray/rllib/", "ray/data/", "ray/tune/", "ray/train/",
        "ray/llm/", "ray/serve/llm/")
STRIP = ("ray/_raylet.so", "ray/core/src/ray/gcs/gcs_server", "ray/core/src/ray/raylet/raylet")
# packages Ray (+ Serve) or `rstitch serve` import that the GPU image (KINDS.md's list) lacks, and the gRPC pair
# whose generated code checks versions at import (grpcio-reflection 1.85 needs grpcio >= 1.85.1, protobuf >= 7.35.1):
# shipped together, as tested, rather than trusting the image's versions
DEPS = ("fastapi==0.165.0", "starlette==1.10.0", "uvicorn==0.54.0", "pydantic==2.13.4", "pydantic-core==2.46.4",
        "annotated-types==0.7.0", "typing-inspection==0.4.2", "typing-extensions==4.16.0", "annotated-doc==0.0.7",
        "opentelemetry-api==1.45.2", "jsonschema==4.26.0", "jsonschema-specifications==2025.9.1",
        "referencing==0.37.0", "rpds-py==0.30.0", "grpcio==1.85.3", "grpcio-reflection==1.85.1", "protobuf==7.36.2")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")

INSTALL = """#!/usr/bin/env bash
# Installs the Ray Serve bundle beside this script into ${1:-/tmp/site} (pip --no-index --target).
# Made by tools/ray_bundle.py (Ray %(ray)s, Python %(python)s). Then: export PYTHONPATH=${1:-/tmp/site}:$PYTHONPATH
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
site="${1:-/tmp/site}"
tmp="$(mktemp -d)"
for x in "$here"/*.whl.xz; do
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \\
    "$x" "$tmp/$(basename "${x%%.xz}")"
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \\
  "$tmp"/*.whl "$here"/deps/*.whl
rm -rf "$tmp"
PYTHONPATH="$site" python3 -c 'import ray, ray.serve, fastapi; print("ray", ray.__version__, "from", ray.__file__)'
"""


def download(spec: str, python: str, dest: Path) -> Path:
    """The wheel of ``spec`` (``name==version``) for CPython ``python`` on x86-64 Linux: from ``dest`` when there,
    else from the package index."""
    name, version = spec.split("==")
    prefix = f"{name.replace('-', '_').lower()}-{version}-"
    dest.mkdir(parents=True, exist_ok=True)
    tag = "cp" + python.replace(".", "")

    def found():
        return [p for p in dest.iterdir() if p.name.lower().startswith(prefix) and p.suffix == ".whl"
                and (f"-{tag}-" in p.name or "-py3-none-" in p.name or "-abi3-" in p.name)]

    if not found():
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
               python, "--implementation", "cp", "-d", str(dest), spec]
        for p in PLATFORMS:
            cmd[-1:-1] = ["--platform", p]
        subprocess.run(cmd, check=True)
    if not found():
        raise SystemExit(f"pip download {spec} left no wheel named {prefix}* for {tag} in {dest}; check the spelling")
    return found()[0]


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _stripped(name: str, data: bytes) -> bytes:
    """``data`` of the ELF file ``name`` without its symbol tables (``strip --strip-unneeded``)."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / Path(name).name
        path.write_bytes(data)
        subprocess.run(["strip", "--strip-unneeded", str(path)], check=True)
        return path.read_bytes()


def slim_wheel(src: Path, dst: Path) -> dict[str, int]:
    """Rewrite Ray's wheel ``src`` as ``dst`` (stored, not deflated) without ``DROP``, ``STRIP`` stripped, and a
    RECORD that matches; returns byte counts (kept, dropped)."""
    kept, dropped, record, record_name = 0, 0, [], None
    can_strip = shutil.which("strip") is not None
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            name = info.filename
            if name.endswith(".dist-info/RECORD"):
                record_name = name
                continue
            if name.startswith(DROP) or name.endswith(".js.map"):
                dropped += info.file_size
                continue
            data = zin.read(info)
            if name in STRIP and can_strip:
                data = _stripped(name, data)
            out = zipfile.ZipInfo(name, info.date_time)
            out.external_attr = info.external_attr  # keeps the binaries executable
            zout.writestr(out, data)
            record.append(_record_line(name, data))
            kept += len(data)
        if record_name is None:
            raise SystemExit(f"{src} has no .dist-info/RECORD: is it a wheel?")
        zout.writestr(record_name, "\n".join(record + [f"{record_name},,"]) + "\n")
    return {"kept": kept, "dropped": dropped}


def xz(src: Path, dst: Path) -> None:
    """``src`` xz-compressed (preset 9, extreme) as ``dst``; the xz tool when present (threads), else Python's lzma."""
    if shutil.which("xz"):
        with open(dst, "wb") as f:
            subprocess.run(["xz", "-9e", "-T0", "-c", str(src)], stdout=f, check=True)
        return
    import lzma

    with open(src, "rb") as fin, lzma.open(dst, "wb", preset=9 | lzma.PRESET_EXTREME) as fout:
        shutil.copyfileobj(fin, fout)


def build(out: Path, python: str, ray: str, cache: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for old in list(out.glob("*.whl.xz")) + list(out.glob("deps/*.whl")):
        old.unlink()
    wheel = download(f"ray=={ray}", python, cache / python)
    slim = cache / f"slim-{wheel.name}"
    recipe = hashlib.sha256(repr((DROP, STRIP)).encode()).hexdigest()[:8]
    packed = cache / f"slim-{recipe}-{wheel.name}.xz"
    if not packed.exists():  # xz -9e takes minutes: one per recipe and wheel
        sizes = slim_wheel(wheel, slim)
        xz(slim, packed)
        print(f"{wheel.name}: {wheel.stat().st_size / 2**20:.1f} MiB -> slim {slim.stat().st_size / 2**20:.1f} "
              f"MiB stored ({sizes['dropped'] / 2**20:.1f} MiB dropped) -> {packed.stat().st_size / 2**20:.1f} MiB xz")
    shutil.copy2(packed, out / (wheel.name + ".xz"))
    (out / "deps").mkdir(exist_ok=True)
    for spec in DEPS:
        shutil.copy2(download(spec, python, cache / python), out / "deps")
    (out / "install.sh").write_text(INSTALL % {"ray": ray, "python": python})
    (out / "install.sh").chmod(0o755)
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"bundle {out}: {total / 2**20:.1f} MiB ({len(DEPS)} dependency wheels beside Ray)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the bundle's folder (e.g. .ray, ignored by git)")
    ap.add_argument("--python", default="3.12", help="the target's Python version (the GPU image: 3.12)")
    ap.add_argument("--ray", default=RAY, help="Ray's version")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "ray_bundle",
                    help="where downloaded and slimmed wheels are kept")
    args = ap.parse_args(argv)
    build(args.out, args.python, args.ray, args.cache)
    return 0


if __name__ == "__main__":
    sys.exit(main())
