"""mkdocs hook: serve the committed benchmark plots (``benchmarks/results/**/*.png``) under ``results/``.

The tables are pulled into docs/benchmarks.md with ``--8<--`` snippets; images cannot be, so they are
added to the site's files here instead of being copied into docs/.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def on_files(files, config):
    for png in sorted(RESULTS.rglob("*.png")):
        rel = png.relative_to(RESULTS).as_posix()
        files.append(File.generated(config, f"results/{rel}", abs_src_path=str(png)))
    return files
