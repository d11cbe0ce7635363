"""When the LLM runs in a batch, and when waiting requests join it: the request engine's two timing rules.

Pure decision logic, no tensors. Both rest on one fact: a batched forward reads the model's weights once whatever
the number of rows it serves, so at batch sizes of a few to a few dozen rows a call for one row costs nearly as
much as a call for eight.

**The LLM's calls.** Stitching leaves a freedom plain decoding has not: a row whose next token is the LLM's may
*wait* (gain no token this step) while the rows the SLM serves go on; a later LLM call then serves the waiting rows
together. Outputs do not change -- a waiting row's token is decided by the same model on the same prefix, one step
later -- only the number of LLM calls and when each row's tokens arrive. A schedule answers one question per step,
asked only when some row needs the LLM (see :func:`hf_rstitch.decode.step.run_step`): run the LLM now?

* :class:`Immediate` -- always (the seed paper's Algorithm 1, one row at a time; the default).
* :class:`GatherForLLM` -- once ``min_rows`` rows need it, or one of them has waited
  ``max_wait`` steps, or no row has a token to gain from the SLM this step.

Measured (``benchmarks/results/engine_schedule_*.md``, docs/howto/batching.md): with a 7B / 1.5B pair it
makes fewer LLM calls but loses throughput at every batch size, so ``Immediate`` stays the default.

**Joins.** Each step that admits waiting requests prefills their prompts in a join call per model (one weight read
each, beside the step's own). Under load a row ends nearly every step, so nearly every step pays one.
:class:`JoinPacing` lets free rows stay empty a few steps so that joiners come in groups, one join call for the
group: the scheduler (:mod:`hf_rstitch.batching.scheduler`) asks it each step where a request waits and a row is
free. A request's tokens do not depend on when it joins, so outputs do not change; its first token may come up to
``join_wait`` steps later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class LLMDemand:
    """What a schedule sees at a step where some row needs the LLM."""

    need: int  # rows whose next token is the LLM's (just handed over, or in an LLM run)
    rows: int  # rows in the batch
    waited: int  # the most steps any of the ``need`` rows has already waited

    @property
    def slm_only(self) -> int:
        """Rows the SLM serves this step (they gain a token whether or not the LLM runs)."""
        return self.rows - self.need


@runtime_checkable
class LLMSchedule(Protocol):
    def run_now(self, demand: LLMDemand) -> bool:
        """True: run the LLM this step for every row that needs it; False: they all wait one step."""
        ...


@dataclass(frozen=True)
class Immediate:
    """The LLM runs at every step where a row needs it: no row ever waits."""

    def run_now(self, demand: LLMDemand) -> bool:
        return True


@dataclass(frozen=True)
class GatherForLLM:
    """Rows that need the LLM wait until enough of them have gathered.

    Args:
        max_wait: most steps a row waits for the LLM (>= 1).
        min_rows: rows that make an LLM call worth running at once. None: a quarter of the batch's
            rows, at least 2.
    """

    max_wait: int = 2
    min_rows: int | None = None

    def __post_init__(self):
        if isinstance(self.max_wait, bool) or not isinstance(self.max_wait, int) or self.max_wait < 1:
            raise ValueError(f"GatherForLLM(max_wait=...) must be an integer >= 1 (steps a row may wait), "
                             f"got {self.max_wait!r}; use Immediate() for no waiting.")
        if self.min_rows is not None and (isinstance(self.min_rows, bool) or not isinstance(self.min_rows, int)
                                          or self.min_rows < 1):
            raise ValueError(f"GatherForLLM(min_rows=...) must be an integer >= 1 or None, got {self.min_rows!r}")

    def gather(self, rows: int) -> int:
        """Rows that run the LLM at once in a batch of ``rows``."""
        return self.min_rows if self.min_rows is not None else max(2, rows // 4)

    def run_now(self, demand: LLMDemand) -> bool:
        return (demand.need >= self.gather(demand.rows)  # enough rows to share the call
                or demand.waited >= self.max_wait  # someone waited long enough
                or demand.slm_only == 0)  # waiting would stall every row


def parse_schedule(spec: str | None) -> LLMSchedule:
    """A schedule from its command-line form: ``"now"`` (or None), ``"gather"``, ``"gather:K"`` or
    ``"gather:K:M"`` (wait at most K steps, run at once from M rows)."""
    if spec is None or spec == "now":
        return Immediate()
    head, *rest = spec.split(":")
    if head != "gather" or len(rest) > 2:
        raise ValueError(f"schedule {spec!r}: use 'now', 'gather', 'gather:K' (wait at most K steps) or "
                         "'gather:K:M' (and run the LLM at once when M rows need it).")
    try:
        nums = [int(x) for x in rest]
    except ValueError:
        raise ValueError(f"schedule {spec!r}: K and M must be integers, e.g. 'gather:2:8'.") from None
    return GatherForLLM(*nums)


@dataclass(frozen=True)
class JoinDemand:
    """What join pacing sees at a step where a waiting request could take a free row."""

    joinable: int  # waiting requests that would join now (free rows and KV blocks allowing), >= 1
    running: int  # rows decoding
    waited: int  # steps in a row that joinable requests have been held back so far


@dataclass(frozen=True)
class JoinPacing:
    """Waiting requests join in groups: at once when ``join_group`` of them can, when they have been held back
    ``join_wait`` steps, or when the batch decodes fewer than ``join_group`` rows (nearly empty: at low load joins
    are rare, so a wait would gather no one and only delay the request -- a lone request joins at once).

    Args:
        join_wait: steps a free row may stay empty while requests wait (0: join at once, at every step).
            Trade-off: a request's first token up to ``join_wait`` steps later, against one join call (a weight
            read of each model) per group instead of per step.
        join_group: joiners worth a join call at once (8: one group of the fast lane's join call,
            :data:`hf_rstitch.fast.joins.JOIN_ROWS`); also the size below which a batch counts as nearly empty.
    """

    join_wait: int = 0
    join_group: int = 8

    def __post_init__(self):
        for name, low in (("join_wait", 0), ("join_group", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{name} ({flag}) must be an integer >= {low}, got {value!r}; "
                                 + ("0 joins waiting requests at once." if low == 0 else
                                    "8 fills one join call of the fast engine."))

    @property
    def paces(self) -> bool:
        """Whether it ever holds a request back (``join_wait`` > 0)."""
        return self.join_wait > 0

    def join_now(self, demand: JoinDemand) -> bool:
        """True: the joinable requests join at this step; False: they wait one more step."""
        return (not self.paces
                or demand.joinable >= self.join_group  # a group worth its join call
                or demand.waited >= self.join_wait  # held back long enough
                or demand.running < self.join_group)  # nearly empty: waiting would gather no one
