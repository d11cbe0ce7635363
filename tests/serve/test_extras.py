"""`pip install "hf-rstitch[serve]"` installs every package `rstitch serve` imports.

Every module of ``hf_rstitch/serve`` imports in a process where only the distributions that the
``serve`` extra or the core dependencies name, or that one of those requires (fastapi brings starlette and
pydantic). The files that import Ray are the ``serve-ray`` extra's. A module the extra missed is what made a bare
machine fail at the server's start (uvicorn without ``[standard]`` has no httptools, which the connection guard
imports).
"""

import json
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _with_requirements(names: set[str]) -> set[str]:
    """``names`` and every distribution they require, installed ones followed (extras' requirements left out)."""
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [_name(r) for r in requires if "extra ==" not in r]
    return seen


BLOCKER = """
import importlib, importlib.machinery, json, sys
blocked = set(json.loads(sys.argv[1]))


class Absent(importlib.machinery.PathFinder):  # finds nothing of a blocked distribution, as on a bare machine
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            return None
        return importlib.machinery.PathFinder.find_spec(name, path, target)


sys.meta_path = [Absent if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
for module in sys.argv[2:]:
    importlib.import_module(module)
"""


def _modules(extra: str) -> list[str]:
    """The modules of hf_rstitch/serve that an install with ``extra`` runs (Ray's files need serve-ray)."""
    files = sorted((ROOT / "hf_rstitch" / "serve").glob("*.py"))
    ray = {p for p in files if re.search(r"^\s*(import ray|from ray)", p.read_text(), re.M)}
    chosen = [p for p in files if extra == "serve-ray" or p not in ray]
    return [f"hf_rstitch.serve.{p.stem}" for p in chosen if p.stem != "__init__"]


@pytest.mark.slow  # ~11 s: a fresh Python imports torch and transformers
@pytest.mark.parametrize("extra", ["serve"])
def test_the_serve_extra_installs_every_module_the_server_imports(extra):
    """Every module of ``hf_rstitch/serve`` imports, in a process where the distributions that neither the core
    dependencies nor the extra bring in (nor what they require) are absent."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(r) for r in project["dependencies"]} | {_name(r) for r in project["optional-dependencies"][extra]}
    allowed = _with_requirements(wanted) | {"hf-rstitch"}
    blocked = sorted(module for module, dists in metadata.packages_distributions().items()
                     if module.isidentifier() and not {d.lower().replace("_", "-") for d in dists} & allowed)
    run = subprocess.run([sys.executable, "-c", BLOCKER, json.dumps(blocked), *_modules(extra)],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, f"pip install 'hf-rstitch[{extra}]' misses a package: {run.stderr[-1500:]}"
