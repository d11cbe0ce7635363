"""The one vocabulary for "which model": :class:`Role.SLM` and :class:`Role.LLM`."""

from __future__ import annotations

import enum


class Role(str, enum.Enum):
    """Which of the two stitched models did something."""

    SLM = "slm"
    LLM = "llm"

    @property
    def other(self) -> "Role":
        return Role.LLM if self is Role.SLM else Role.SLM

    def __str__(self) -> str:  # "slm" rather than "Role.SLM" in tables and JSON
        return self.value
