"""A Hugging Face Space that serves the page: ``rstitch export-hub-template DIR --space [--llm L --slm S]``.

The folder holds ``app.py`` (builds :func:`hf_rstitch.ui.app` for the pair and launches it), ``requirements.txt``
(the package's dependencies and its ``ui`` extra, from PyPI), ``README.md`` (front matter ``sdk: gradio``) and a copy
of the ``hf_rstitch`` package itself: hf-rstitch is on no package index, and a Space installs its requirements
before the repository is copied in, so neither a package name nor a wheel in the folder could be installed there.
``app.py`` imports the copy beside it (Python puts the script's folder first on ``sys.path``). The shipped pair's
weights are copied only when the Space uses them. This module writes files only.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..extras import EXTRAS

# pyproject.toml's [project] dependencies, then its ui extra (a test checks)
DEPENDENCIES = ("torch>=2.4", "transformers>=5.17,<6", "accelerate>=1.0", "safetensors>=0.4", "huggingface-hub>=0.30",
                "tokenizers>=0.20")
REQUIREMENTS = DEPENDENCIES + EXTRAS["ui"]

APP = '''"""Hugging Face Space: hf-rstitch's page (hf_rstitch.ui) for one SLM/LLM pair.

Written by `rstitch export-hub-template --space` (hf-rstitch {version}); hf_rstitch/ beside this file is the package.
"""

from hf_rstitch.resources import resolve
from hf_rstitch.threads import apply_threads
from hf_rstitch.ui import app

LLM, SLM, ROUTER = {llm!r}, {slm!r}, {router!r}

apply_threads([resolve(LLM), resolve(SLM)])  # one torch thread for tiny models (hf_rstitch/threads.py)
demo = app(LLM, SLM, ROUTER)

if __name__ == "__main__":
    demo.launch()  # a Space sets GRADIO_SERVER_NAME / GRADIO_SERVER_PORT
'''


def _gradio_version() -> str:
    try:
        from importlib.metadata import version

        return version("gradio")
    except Exception:  # noqa: BLE001  (no Gradio here: the Space picks the newest)
        return "5.0.0"


def _copy_package(out: Path, with_pair: bool) -> None:
    package = Path(__file__).resolve().parents[1]
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")

    def ignore(folder: str, names: list[str]) -> set[str]:
        dropped = set(skip(folder, names))
        if not with_pair and Path(folder).resolve() == (package / "assets").resolve():
            dropped.add("pair")
        return dropped

    shutil.copytree(package, out / "hf_rstitch", ignore=ignore, dirs_exist_ok=True)


def export_space(out_dir: str | Path, llm: str | None = None, slm: str | None = None, router: str | None = None,
                 overwrite: bool = False) -> Path:
    """Write the Space to ``out_dir`` (created; must be empty unless ``overwrite``) and return it.

    Args:
        llm, slm: the pair (Hub ids; ``shipped:llm`` / ``shipped:slm``); neither: the shipped pair.
        router: an R-Stitch+ router where the LLM's generation config names none (``"shipped"`` for the shipped pair).
    """
    import hf_rstitch

    from ..hub_template import render

    if bool(llm) != bool(slm):
        raise ValueError("give both --llm and --slm for the Space, or neither (the shipped pair)")
    llm, slm = llm or "shipped:llm", slm or "shipped:slm"
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not overwrite)):
        raise FileExistsError(f"{out} is not an empty folder; pass an empty one, or --overwrite to replace the files.")
    out.mkdir(parents=True, exist_ok=True)
    _copy_package(out, with_pair=any(ref.startswith("shipped:") for ref in (llm, slm)))
    (out / "app.py").write_text(APP.format(version=hf_rstitch.__version__, llm=llm, slm=slm, router=router),
                                encoding="utf-8")
    (out / "requirements.txt").write_text("\n".join(REQUIREMENTS) + "\n", encoding="utf-8")
    (out / "README.md").write_text(render("space_readme.md", gradio_version=_gradio_version(), llm=llm, slm=slm,
                                          version=hf_rstitch.__version__), encoding="utf-8")
    return out
