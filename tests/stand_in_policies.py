"""Routing policies that stand in for real ones in tests of the decode loop and the request engine."""

from __future__ import annotations


class Flip:
    """A hand-over at every step: every SLM proposal goes to the LLM, every LLM row comes back (device ops:
    comparisons of the entropies, as the entropy rule's)."""

    needs_hidden = False

    def reset(self) -> None:
        pass

    def hand_to_llm(self, step):
        return step.entropy >= 0

    def hand_to_slm(self, step):
        return step.entropy >= 0
