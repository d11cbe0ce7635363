"""When the LLM runs in a batch: as soon as any row needs it, or once a few rows have gathered.

Pure decision logic, no tensors. A batched LLM call reads the LLM's weights once whatever the
number of rows it serves, so at batch sizes of a few to a few dozen rows a call for one row costs
nearly as much as a call for eight. Stitching leaves a freedom plain decoding has not: a row whose
next token is the LLM's may *wait* (gain no token this step) while the rows the SLM serves go on;
a later LLM call then serves the waiting rows together. Outputs do not change -- a waiting row's
token is decided by the same model on the same prefix, one step later -- only the number of LLM
calls and when each row's tokens arrive.

A schedule answers one question per step, asked only when some row needs the LLM (see
:func:`hf_rstitch.decode.step.run_step`): run the LLM now?

* :class:`Immediate` -- always (the seed paper's Algorithm 1, one row at a time; the default).
* :class:`GatherForLLM` -- once ``min_rows`` rows need it, or one of them has waited
  ``max_wait`` steps, or no row has a token to gain from the SLM this step.

Measured (``benchmarks/results/engine_schedule_*.md``, docs/howto/batching.md): with a 7B / 1.5B pair it
makes fewer LLM calls but loses throughput at every batch size, so ``Immediate`` stays the default.
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
