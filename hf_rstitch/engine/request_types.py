"""What goes in and out of :class:`~hf_rstitch.engine.requests.RequestEngine`: requests, events, completions;
and the engine's record of a running request (:class:`RunningRow`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.roles import Role
from ..core.trace import StitchTrace

FINISH_REASONS = ("stop", "length", "cancelled", "error")


@dataclass
class Request:
    """One generation request (prompt already tokenized, chat template applied)."""

    input_ids: list[int]
    max_new_tokens: int = 256
    stitch_threshold: float | None = None  # None: the engine's default threshold
    eos_token_id: list[int] | None = None  # None: the LLM's generation_config eos ids
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    request_id: str | None = None  # assigned by submit() when None
    role: Role | None = None  # pin the request to one model (LLM alone / SLM alone); None: stitched


@dataclass
class Event:
    """What one step did for one request: a new token, and/or its end."""

    request_id: str
    token: int | None  # the new token (None on an event that only finishes)
    role: Role | None  # which model wrote it
    finished: bool = False
    finish_reason: str | None = None  # one of FINISH_REASONS
    error: str | None = None  # message when finish_reason == "error"
    trace: StitchTrace | None = None  # on the finishing event


@dataclass
class Completion:
    """A finished request, as :meth:`RequestEngine.run` returns it."""

    request_id: str
    tokens: list[int]
    finish_reason: str
    trace: StitchTrace


class QueueFull(RuntimeError):
    """The engine's waiting queue is full (``max_waiting``); retry later."""


@dataclass
class RunningRow:
    """A request while it has a row in the engine's batch (internal to the engine)."""

    request: Request
    eos: frozenset[int]
    trace: StitchTrace
    generator: torch.Generator | None = None
    held: tuple[bool, float | None] | None = None  # waiting for the LLM: (handed over?, the SLM's entropy)
    pad: int = 0  # its left-padding columns in the shared sequence (the mask's, kept on the host: no device read)
