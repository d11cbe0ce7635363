"""How to install an optional part, in a form that works: hf-rstitch is on no package index, so
``pip install`` of the package by name with an extra cannot succeed. Messages name the packages themselves (which
pip finds anywhere) and the extra as installed from a clone. :data:`EXTRAS` mirrors
``[project.optional-dependencies]`` in pyproject.toml (a test checks). Cheap to import.
"""

from __future__ import annotations

EXTRAS = {
    "eval": ("math-verify>=0.7", "matplotlib>=3.7", "datasets>=2.19"),
    "notebook": ("math-verify>=0.7", "matplotlib>=3.7", "datasets>=2.19", "ipywidgets>=8"),
    "serve": ("fastapi>=0.110", "uvicorn>=0.29", "httptools>=0.6"),
    "serve-ray": ("fastapi>=0.110", "uvicorn>=0.29", "httptools>=0.6", "ray[serve]>=2.40"),
    "flashinfer": ("flashinfer-python>=0.6",),
    "ui": ("gradio>=5.0",),
}


def install_hint(extra: str, only: tuple[str, ...] | None = None) -> str:
    """``pip install "fastapi>=0.110" "uvicorn>=0.29" (hf-rstitch's serve extra; in a clone: pip install ".[serve]")``.

    ``only`` narrows the packages to those whose names start with one of these (e.g. ``("matplotlib",)``).
    """
    packages = [p for p in EXTRAS[extra] if only is None or p.startswith(only)]
    quoted = " ".join(f'"{p}"' for p in packages)
    return f'pip install {quoted} (hf-rstitch\'s {extra} extra; in a clone of hf-rstitch: pip install ".[{extra}]")'
