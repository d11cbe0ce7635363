"""What goes in and out of :class:`~hf_rstitch.batching.requests.RequestEngine`: requests, events, completions;
a request's life (:class:`RequestStatus`) and the engine's record of it (:class:`RequestState`), built by
:func:`prepare` -- everything a request needs (its generator, eos set, threshold) is made and checked
before it touches the engine's rows, so a bad request fails at ``submit`` and never inside a step.
Importing it loads no torch (the server's driver uses its exceptions)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from enum import Enum

from typing import TYPE_CHECKING, Any

from ..core.roles import Role
from ..core.trace import StitchTrace

if TYPE_CHECKING:
    import torch

FINISH_REASONS = ("stop", "length", "cancelled", "error")
KV_FULL = "kv_cache_full"  # Event.error_code of a request the KV memory could not hold (a server answers 503)
SEED_RANGE = (-2**63, 2**64)  # what torch.Generator.manual_seed takes: [low, high)


@dataclass
class Request:
    """One generation request (prompt already tokenized, chat template applied). The engine never edits it
    (``submit`` only fills in ``request_id`` when it is None)."""

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
    stitch_policy: Any = None  # this request's own RoutingPolicy object (core.policies_rows); None: the threshold's


class RequestStatus(str, Enum):
    """Where a request is in its life; the engine keeps one on each request it holds."""

    WAITING = "waiting"  # submitted, no row yet
    RUNNING = "running"  # has a row in the batch
    FINISHED_STOPPED = "finished_stopped"  # an EOS token
    FINISHED_LENGTH = "finished_length"  # its max_new_tokens
    FAILED = "failed"  # an error while decoding it (the event says which)
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self not in (RequestStatus.WAITING, RequestStatus.RUNNING)

    @classmethod
    def of(cls, finish_reason: str) -> "RequestStatus":
        return {"stop": cls.FINISHED_STOPPED, "length": cls.FINISHED_LENGTH, "cancelled": cls.CANCELLED,
                "error": cls.FAILED}[finish_reason]


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
    error_code: str | None = None  # with an error: KV_FULL when the KV memory could not hold the request


@dataclass
class Completion:
    """A finished request, as :meth:`RequestEngine.run` returns it."""

    request_id: str
    tokens: list[int]
    finish_reason: str
    trace: StitchTrace


class QueueFull(RuntimeError):
    """The engine holds as many requests as it may (``max_batch`` rows + ``max_waiting``); retry later."""


class StepFailed(RuntimeError):
    """A step failed for the whole batch (e.g. a model call raised). The engine has already ended every
    running request with an ``error`` event (``events``, with any other events of the step) and is back to
    a consistent empty batch; waiting requests stay queued."""

    def __init__(self, cause: BaseException, events: list[Event]):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause, self.events = cause, events


@dataclass
class RequestState:
    """The engine's record of a request from ``submit`` to its end (internal to the engine)."""

    request: Request  # the engine's own checked copy
    eos: frozenset[int]
    trace: StitchTrace
    generator: torch.Generator | None = None
    status: RequestStatus = RequestStatus.WAITING
    held: tuple[bool, float | None] | None = None  # waiting for the LLM: (handed over?, the SLM's entropy)
    pad: int = 0  # its left-padding columns in the shared sequence (the mask's, kept on the host: no device read)
    replayed: int = 0  # tokens of its own output in request.input_ids (a preempted request resumes with them)
    output: list[int] = dataclasses.field(default_factory=list)  # every token it wrote (a preempted row requeues with them)

    @property
    def n_tokens(self) -> int:
        """Tokens its row holds: prompt and output so far."""
        return len(self.request.input_ids) + len(self.trace.roles) - self.replayed  # trace.n_tokens, inlined: the
        # scheduler counts every running row a few times a step

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def ending(self, token: int) -> str | None:
        """Why ``token``, written next, ends the request: ``"stop"`` (one of its end ids), ``"length"`` (its
        ``max_new_tokens`` reached), or None (it goes on)."""
        if token in self.eos:
            return "stop"
        return "length" if len(self.trace.roles) + 1 >= self.request.max_new_tokens else None


def prepare(r: Request, *, vocab: int, max_length: int | None, default_eos: frozenset[int],
            routes_per_request: bool) -> Request:
    """Check ``r`` and return the engine's normalized copy (``r`` itself is left as it is). Raises
    ``ValueError`` / ``TypeError`` saying what was wrong."""
    from ..core.policies import check_threshold

    if not isinstance(r, Request):
        raise TypeError(f"submit() takes a Request, got {type(r).__name__}")
    ids = r.input_ids
    if not isinstance(ids, (list, tuple)) or not ids or not all(_is_int(t) for t in ids):
        raise ValueError("Request.input_ids must be a non-empty list of token ids (ints); tokenize the prompt first.")
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"Request.input_ids holds id {bad[0]}, outside the vocabulary both models share "
                         f"(0..{vocab - 1}); tokenize with the pair's tokenizer.")
    if not _is_int(r.max_new_tokens) or r.max_new_tokens < 1:
        raise ValueError(f"Request.max_new_tokens must be an integer >= 1, got {r.max_new_tokens!r}")
    if max_length is not None and len(ids) + r.max_new_tokens > max_length:
        raise ValueError(f"prompt ({len(ids)} tokens) + max_new_tokens ({r.max_new_tokens}) exceeds the fast "
                         f"engine's max_length {max_length}; shorten the request or build the engine with "
                         "a larger max_length.")
    tau = r.stitch_threshold
    if r.stitch_policy is not None and tau is not None:
        raise ValueError("Request.stitch_policy routes the request by its own rule: drop stitch_threshold.")
    if tau is not None:
        if not routes_per_request:
            raise ValueError("this engine routes every request with one policy; drop Request.stitch_threshold "
                             "or build the engine without `policy=`.")
        tau = check_threshold(tau)
    eos = r.eos_token_id
    if eos is not None and (not isinstance(eos, (list, tuple, set, frozenset)) or not all(_is_int(t) for t in eos)):
        raise ValueError(f"Request.eos_token_id must be a list of token ids or None, got {eos!r}")
    if r.do_sample:
        _check_sampling(r)
    return dataclasses.replace(r, input_ids=list(ids), stitch_threshold=tau, role=None if r.role is None else Role(r.role),
                               eos_token_id=None if eos is None else list(eos))


def generator_for(r: Request) -> torch.Generator | None:
    """The request's own random generator (sampled requests with a seed), or None."""
    import torch

    return torch.Generator().manual_seed(r.seed) if r.do_sample and r.seed is not None else None


def _check_sampling(r: Request) -> None:
    t, p = r.temperature, r.top_p
    if not (_is_real(t) and math.isfinite(t) and t > 0 and _is_real(p) and 0 < p <= 1):
        raise ValueError(f"sampling needs a finite temperature > 0 and 0 < top_p <= 1, got {t!r}, {p!r}")
    if r.seed is not None and not (_is_int(r.seed) and SEED_RANGE[0] <= r.seed < SEED_RANGE[1]):
        raise ValueError(f"Request.seed must be an integer in [-2**63, 2**64), got {r.seed!r}")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)
