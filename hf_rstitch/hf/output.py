"""``generate`` output carrying the stitch trace."""

from __future__ import annotations

from dataclasses import dataclass

from transformers.generation.utils import GenerateDecoderOnlyOutput

from ..core.trace import StitchTrace


@dataclass
class StitchedGenerateOutput(GenerateDecoderOnlyOutput):
    """:class:`GenerateDecoderOnlyOutput` plus the per-token provenance and per-call costs.

    ``stitch_traces`` is always a list of :class:`~hf_rstitch.core.trace.StitchTrace`, one per
    row of the batch: ``t.roles`` (which model wrote each new token), ``t.entropies``,
    ``t.switches``, ``t.llm_tokens``, ``t.slm_tokens``, ``t.partial_prefill_tokens(Role.SLM)``,
    ``t.calls``... Batched callers read it. ``stitch`` is the single-prompt shorthand: the trace
    itself at batch size 1, the same list as ``stitch_traces`` at batch size > 1.
    """

    stitch: StitchTrace | list[StitchTrace] | None = None  # a list, one per row, when batch > 1

    @property
    def stitch_traces(self) -> list[StitchTrace]:
        """One trace per row, whatever the batch size (empty when no trace was recorded)."""
        if self.stitch is None:
            return []
        return [self.stitch] if isinstance(self.stitch, StitchTrace) else list(self.stitch)
