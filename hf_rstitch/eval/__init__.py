"""Evaluation harness: benchmark problems x decoding methods -> records -> paper-style tables.

    from hf_rstitch.eval import EvalConfig, evaluate
    summary = evaluate(EvalConfig(llm="...", slm="...", data=["aime24.jsonl"], thresholds=[0.02]))

Modules: ``data`` (JSONL / Hub problems, chat prompts), ``grading`` (answer extraction and
math-aware equivalence), ``methods`` (LLM-only, SLM-only, SpecDec, R-Stitch, random routing,
learned router), ``runner`` (timed runs, resumable JSONL records), ``report`` / ``plots``
(tables, JSON summary, figures), ``api`` (:func:`evaluate`), ``batched`` (:func:`sweep` and
:func:`batched_records`: accuracy and token counts from batched ``generate`` calls, the same records
and grader). The CLI is ``rstitch eval``.
Heavy imports (torch, transformers, matplotlib) happen only when used.
"""

from __future__ import annotations

from typing import Any

from .config import EvalConfig

__all__ = ["EvalConfig", "batched_records", "evaluate", "sweep"]


def __getattr__(name: str) -> Any:
    if name == "evaluate":
        from .api import evaluate

        return evaluate
    if name in ("sweep", "batched_records"):
        from . import batched

        return getattr(batched, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:  # tab completion and dir() show the lazy names too
    return sorted(set(globals()) | set(__all__))
