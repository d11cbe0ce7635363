"""Files that ship inside the package: the trained toy pair, its test split and the R-Stitch+ router.

``hf_rstitch.shipped("llm")`` is the local folder of the shipped LLM wherever hf-rstitch is
installed (a clone, an editable install, a wheel in any venv), so code and docs never depend on
the current folder. ``stitch_router="shipped"`` and the CLI's ``shipped:NAME`` references resolve
through :func:`resolve`. This module only finds files; it loads nothing.
"""

from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"

# name -> path under hf_rstitch/assets
SHIPPED = {
    "llm": "pair/llm",  # 9.7M-parameter Llama, verbose and accurate
    "slm": "pair/slm",  # 0.9M-parameter Llama, concise and fast; same tokenizer
    "router": "router",  # R-Stitch+ router trained for this SLM/LLM pair
    "pair": "pair",  # the folder holding llm/, slm/ and test.jsonl
    "test": "pair/test.jsonl",  # 600 held-out problems (id, problem, answer, ...)
    "latency": "router/latency.json",  # latency profile the router was trained with
}
PREFIX = "shipped:"


def shipped(name: str) -> Path:
    """Local path of a shipped asset: ``"llm"``, ``"slm"``, ``"router"``, ``"pair"``, ``"test"`` or ``"latency"``.

    >>> llm = AutoModelForCausalLM.from_pretrained(hf_rstitch.shipped("llm"))
    """
    if name not in SHIPPED:
        raise ValueError(f"no shipped asset {name!r}; choose one of {sorted(SHIPPED)}.")
    path = ASSETS / SHIPPED[name]
    if not path.exists():
        raise FileNotFoundError(
            f"shipped asset {name!r} is missing at {path}: this install of hf-rstitch lacks its package data. "
            "Reinstall from a full clone (pip install .) or a wheel built from one (pip wheel . -w dist)."
        )
    return path


def reference(source) -> str:
    """A path (str or ``Path``) as the string to store in a saved config: ``"shipped:NAME"`` for a shipped
    asset (an absolute path into this install would break in any other venv), else the path as given."""
    text = str(source)
    try:
        here = Path(text).expanduser().resolve()
    except (OSError, RuntimeError):
        return text
    for name, rel in SHIPPED.items():
        if here == (ASSETS / rel).resolve():
            return PREFIX + name
    return text


def resolve(ref):
    """``"shipped:NAME"`` -> the local path of that asset (a string); anything else is returned unchanged."""
    if isinstance(ref, str) and ref.startswith(PREFIX):
        return str(shipped(ref[len(PREFIX):]))
    return ref
