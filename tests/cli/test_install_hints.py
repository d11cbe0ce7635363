"""Install hints that can succeed: hf-rstitch is on no package index, so no message or page may tell a user
to ``pip install 'hf-rstitch[extra]'``; the extras named are those of pyproject.toml."""

import re
import sys
from pathlib import Path

import pytest

from hf_rstitch.extras import EXTRAS, install_hint

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib")
def test_extras_mirror_pyproject():
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra, packages in EXTRAS.items():
        assert tuple(declared[extra]) == packages, extra


def test_no_page_or_message_names_an_uninstallable_package():
    unreachable = re.compile(r"""pip install ['"]?hf-rstitch\[""")
    files = [*ROOT.joinpath("hf_rstitch").rglob("*.py"), *ROOT.joinpath("docs").rglob("*.md"), ROOT / "README.md",
             *ROOT.joinpath("examples").glob("*.*")]
    offenders = [str(f.relative_to(ROOT)) for f in files if unreachable.search(f.read_text(encoding="utf-8"))]
    assert offenders == []


def test_hint_names_packages_pip_can_find_and_the_clone_form():
    hint = install_hint("serve")
    assert hint.startswith('pip install "fastapi>=0.110" "uvicorn>=0.29"') and '".[serve]"' in hint
