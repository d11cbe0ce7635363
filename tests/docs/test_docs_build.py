"""The docs site builds strictly (broken links, bad mkdocstrings references and docstring warnings
fail), every page is in the navigation, and the README's links point at files that exist."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
    pytest.importorskip("material", reason="the docs extra is not installed: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings_handlers.python", reason="the docs extra is not installed")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    api = (tmp_path / "site" / "api" / "hf" / "index.html").read_text()
    assert "stitched_decode" in api and "hand_to_llm" in (tmp_path / "site" / "api" / "core" / "index.html").read_text()


def _nav_pages(nav) -> set[str]:
    pages: set[str] = set()
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        if isinstance(value, list):
            pages |= _nav_pages(value)
        else:
            pages.add(value)
    return pages


def test_every_docs_page_is_in_the_nav():
    yaml = pytest.importorskip("yaml")

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    nav = _nav_pages(config["nav"])
    assert pages - nav == set(), "add these pages to mkdocs.yml's nav"
    assert nav - pages == set(), "the nav names pages that do not exist"


def test_readme_links_exist():
    readme = (ROOT / "README.md").read_text()
    targets = [t for t in re.findall(r"\]\(([^)\s]+)\)", readme) if not t.startswith(("http", "#"))]
    assert targets, "the README links no local file"
    missing = [t for t in targets if not (ROOT / t.split("#")[0]).exists()]
    assert missing == []
    for nb in re.findall(r"colab\.research\.google\.com/github/[^/]+/[^/]+/blob/main/([^)\s]+\.ipynb)", readme):
        assert (ROOT / nb).is_file(), f"the README's Colab badge points at {nb}, which does not exist"
