"""The lane protocol: what the stitch loop and the request engine need from one model + its cache.

Two implementations: :class:`hf_rstitch.decode.Lane` (eager, DynamicCache, any device, any
batch) and :class:`hf_rstitch.fast.FastLane` (static cache + CUDA graphs). Both keep one cache
over a shared, left-padded sequence ``seq [B, T]``: every row has seen the same columns.

Verbs (tensors on the host are marked CPU):

* ``advance(seq, mask, rows, resumed, want_hidden=False) -> (logits, hidden, calls)`` -- read the
  columns ``[n_seen, T)`` for *every* row, return the last column's logits ``[B, vocab]`` float32
  on ``seq``'s device (meaningful for ``rows``, ``[B]`` bool CPU), the last hidden state
  ``[B, D]`` when asked, and a :class:`~hf_rstitch.core.trace.ForwardCall` per row in ``rows``,
  counted as if that row ran alone (``resumed`` ``[B]`` bool CPU: the other model wrote the
  row's latest tokens, so the call is a partial prefill).
  A lane may run only the rows a call needs (the fast lane's ``compact``, :mod:`hf_rstitch.fast.lane_compact`):
  then ``advance(..., run=)`` (``[B]`` bool CPU, None: every row) names them, the lane brings those rows up to
  date from the columns each has read, and its ``ran`` (``[B]`` bool CPU) says which rows' logits it returned
  (zeros elsewhere). The step (:func:`hf_rstitch.decode.step.run_step`) passes ``run`` to any lane with a
  ``compact`` attribute.
* ``keep_rows(index)`` -- keep only rows ``index`` (CPU long), in that order.
* ``reset()`` -- forget everything, ready for a new generation.

For continuous batching (:mod:`hf_rstitch.batching.requests`) both lanes also have
``add_rows(seq, mask)`` (append rows laid out in the shared columns; given on the host or the lane's device), ``pad_left(n)`` (prepend
``n`` masked columns to every row), ``trim_left(n)`` (drop leading columns that are padding in
every row) and ``hold_rows(index)`` (rows that gain no token this step move one column right: a
schedule made them wait for the LLM, :mod:`hf_rstitch.core.scheduling`).

Optional verbs, declared on the protocol with what the eager lane answers (the fast lane overrides them):

* ``run_ahead`` (eager: False) -- the lane's ``advance`` only queues work on the device and runs every row of
  its batch whichever take part (the fast engine with CUDA graphs), so the ``generate`` loop may advance it
  one step early, when the host already knows the next step calls it first, with no rows taking part; the
  step that uses the call then asks it for the records with ``account(total, rows, resumed) -> {row:
  ForwardCall}``. A step may likewise queue the LLM's call before it reads the SLM's hand-over decisions
  from the device. See :mod:`hf_rstitch.decode.loop`.
* ``ahead_of_decisions`` (eager: False) -- with ``run_ahead``, the loop may also queue the next step before a
  routing decision reaches the host, guessing that the deciding model keeps control: True always, None where
  the decision is on a device (:func:`hf_rstitch.decode.step.decides_late`). A lane that allows it has
  ``crop(total)``: forget the columns read past ``total`` (the guessed call undone at a hand-over).
* ``capacity`` (eager: None, no bound) -- the longest sequence the lane's cache holds.
* ``entropy(logits) -> [B]`` float32 -- the normalized entropy of its own logits (eager:
  :func:`hf_rstitch.core.entropy.normalized_entropy`; the fast lane: its fused kernels).
* ``greedy(logits) -> [B] long | None`` -- each row's argmax, where the lane found it reading those logits
  (the fast lane's read-out; eager: None); with no logits processor and greedy decoding the loop and the
  request engine take those tokens instead of computing them.

Accounting: every lane reports its calls as ``ForwardCall(role, kind, n_inf, n_kv, seconds)``
-- the quantities of the latency model (paper Eq. 4) -- so traces, the profiler and the
benchmarks count the same way whichever engine ran.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from ..core.roles import Role
from .lane import Lane


@runtime_checkable
class LaneProtocol(Protocol):
    role: Role
    vocab: int

    def advance(self, seq: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor, resumed: torch.Tensor,
                want_hidden: bool = False): ...

    def keep_rows(self, index: torch.Tensor) -> None: ...

    def reset(self) -> None: ...

    run_ahead: bool
    ahead_of_decisions: bool | None
    capacity: int | None

    def entropy(self, logits: torch.Tensor) -> torch.Tensor: ...

    def greedy(self, logits: torch.Tensor) -> torch.Tensor | None: ...


@runtime_checkable
class LaneBuilder(Protocol):
    """What builds a pair's lanes (an :class:`EagerEngine`, a :class:`~hf_rstitch.fast.FastEngine`);
    :func:`hf_rstitch.engine.build` picks one. ``single_device``: the lanes run only on a model on one device."""

    single_device: bool

    def lanes(self, llm, slm, vocab: int, batch: int, capacity: int = 0, timing: bool = False) -> dict: ...


class EagerEngine:
    """Builds the eager lanes of a pair (``generate(..., stitch_engine=EagerEngine())``).

    The default engine; an instance keeps the lanes it built last (``built``), which tests and
    tools read instead of patching constructors.
    """

    single_device = False  # DynamicCache lanes follow any device_map or tensor-parallel plan
    eager = True
    engine_kind = "default"  # the engine a spec of this type names (hf_rstitch.engine.EngineConfig.of)

    def __init__(self, timing: bool = False):
        self.timing = timing
        self.built: dict[Role, object] = {}

    def lanes(self, llm, slm, vocab: int, batch: int, capacity: int = 0, timing: bool = False) -> dict:
        self.built = {Role.LLM: Lane(llm, Role.LLM, vocab, batch, timing=timing or self.timing),
                      Role.SLM: Lane(slm, Role.SLM, vocab, batch, timing=timing or self.timing)}
        return self.built
