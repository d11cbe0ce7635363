"""``generate`` output carrying the stitch trace."""

from __future__ import annotations

from dataclasses import dataclass

from transformers.generation.utils import GenerateDecoderOnlyOutput

from ..core.trace import StitchTrace


@dataclass
class StitchedGenerateOutput(GenerateDecoderOnlyOutput):
    """:class:`GenerateDecoderOnlyOutput` plus ``stitch``: per-token provenance and per-call costs.

    ``stitch`` is a :class:`~hf_rstitch.core.trace.StitchTrace`: ``stitch.roles`` (which model
    wrote each new token), ``stitch.entropies``, ``stitch.switches``, ``stitch.llm_tokens``,
    ``stitch.slm_tokens``, ``stitch.partial_prefill_tokens(Role.SLM)``, ``stitch.calls``...
    """

    stitch: StitchTrace | list[StitchTrace] | None = None  # a list, one per row, when batch > 1
