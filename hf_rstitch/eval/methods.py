"""The decoding methods the harness compares, one small class each.

Every method answers ``run_batch(input_ids, attention_mask) -> [(new_token_ids, counts), ...]``
for a left-padded batch, one pair per row from one ``generate`` call, and ``run(input_ids)`` for
one prompt (batch size 1): ``counts`` holds ``new_tokens``, ``llm_tokens``, ``slm_tokens`` and
``switches`` (plus the trace summary for stitched methods). Methods only call ``generate``;
timing, grading and records belong to the runner (:mod:`.runner` at batch size 1,
:mod:`.batched` for batches). Adding a method is a new class registered in ``METHODS``.

Here: the baselines that call plain ``generate`` (LLM alone, SLM alone, transformers' assisted generation) and
the registry (:data:`METHODS`, :func:`build_methods`). The interface every method implements is
:mod:`hf_rstitch.eval.method_base`'s, the stitched methods are :mod:`hf_rstitch.eval.stitched_methods`'; both are
importable from here too.

Token attribution: LLM-only and speculative decoding count every new token as the LLM's
(speculative decoding emits exactly the LLM's distribution; transformers does not report
accepted drafts), SLM-only as the SLM's, stitched methods read the decode trace.
"""

from __future__ import annotations

import logging
from typing import Any

from .method_base import GenSettings, Method, eos_ids, param_text
from .stitched_methods import (LearnedRouter, R2RRouting, RandomRouting, RStitch, Speculating, StepRouting,
                               StitchedMethod, router_fingerprint)

__all__ = ["METHODS", "STITCHED_KINDS", "GenSettings", "LLMOnly", "LearnedRouter", "Method", "R2RRouting",
           "RStitch", "RandomRouting", "SLMOnly", "SpecDec", "Speculating", "StepRouting", "StitchedMethod",
           "build_methods", "eos_ids", "param_text", "router_fingerprint"]


class LLMOnly(Method):
    kind, label_text = "llm", "LLM"

    def engine_spec(self):
        from hf_rstitch.core.roles import Role

        return {"role": Role.LLM}

    def _generate(self, input_ids, **gen):
        return self.llm.generate(input_ids, **gen)


class SLMOnly(Method):
    kind, label_text = "slm", "SLM"

    def engine_spec(self):
        from hf_rstitch.core.roles import Role

        return {"role": Role.SLM}

    def _generate(self, input_ids, **gen):
        return self.slm.generate(input_ids, **gen)

    def _counts(self, out, row, n_new):
        return {"new_tokens": n_new, "llm_tokens": 0, "slm_tokens": n_new, "switches": 0}


class _AssistantCallNotice(logging.Filter):
    """Drops the deprecation warning transformers' assisted generation raises about its own call: its candidate
    generator calls the assistant's ``generate`` with a ``generation_config`` and length arguments together
    ("Passing `generation_config` together with generation-related arguments ..."); nothing a caller can change."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Passing `generation_config` together with" not in record.getMessage()


_ASSISTANT_CALL_NOTICE = _AssistantCallNotice()


class SpecDec(Method):
    """transformers' assisted generation with the same pair (no stitch arguments)."""

    kind, label_text = "specdec", "SpecDec"
    one_row = True  # transformers' assisted generation: batch size 1 only

    def _generate(self, input_ids, **gen):
        logging.getLogger("transformers.generation.utils").addFilter(_ASSISTANT_CALL_NOTICE)  # once: a set
        return self.llm.generate(input_ids, assistant_model=self.slm, **gen)


METHODS: dict[str, type[Method]] = {
    cls.kind: cls for cls in (LLMOnly, SLMOnly, SpecDec, RStitch, Speculating, RandomRouting, LearnedRouter,
                               StepRouting, R2RRouting)
}
STITCHED_KINDS = frozenset(k for k, cls in METHODS.items() if issubclass(cls, StitchedMethod))


def build_methods(kinds: list[str], llm: Any, slm: Any, settings: GenSettings, *,
                  thresholds: list[float] = (), random_p: list[float] = (), router: Any = None,
                  router_threshold: float | None = None, step_thresholds: list[float] = (),
                  step_delimiter: str = "\n\n", tokenizer: Any = None, r2r_router: Any = None,
                  r2r_thresholds: list[float] = (), speculate_k: int = 4) -> list[Method]:
    """One method object per (kind, parameter): ``rstitch`` expands over ``thresholds``,
    ``random`` over ``random_p``, ``step`` over ``step_thresholds``, ``r2r`` over ``r2r_thresholds``
    (none given: the router's own), ``speculate`` over ``thresholds`` with ``speculate_k`` drafts."""
    variants: dict[str, list[dict[str, Any]]] = {
        "rstitch": [{"threshold": t} for t in thresholds],
        "speculate": [{"threshold": t, "k": speculate_k} for t in thresholds],
        "random": [{"p": p} for p in random_p],
        "router": [{"router": router, "threshold": router_threshold}],
        "step": [{"threshold": t, "delimiter": step_delimiter, "tokenizer": tokenizer} for t in step_thresholds],
        "r2r": [{"router": r2r_router, "threshold": t} for t in (r2r_thresholds or [None])],
    }
    methods: list[Method] = []
    for kind in kinds:
        if kind not in METHODS:
            raise ValueError(f"unknown method {kind!r}; choose from {sorted(METHODS)}.")
        for kw in variants.get(kind, [{}]):
            methods.append(METHODS[kind](llm, slm, settings, **kw))
    return methods
