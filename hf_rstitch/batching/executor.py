"""The executor: runs a step plan on the pair's built engine (its lanes) and hands back the step's outputs.

:meth:`Executor.execute` applies the plan to the :class:`~.batch.Batch` (joining rows, preempted rows leaving),
then runs one stitched step for every row (:func:`hf_rstitch.decode.step.run_step`, the same switch point as
``generate``), picks each row's token (greedy, or from the request's own generator), appends it on the device and
queues the step's values' one copy to the host (page-locked memory and an event on CUDA:
:mod:`hf_rstitch.decode.step_values`). Where the algorithm allows, it then queues the next step's first lane call
(run-ahead: :func:`hf_rstitch.decode.loop.run_ahead`) before anyone reads the copy, and returns a
:class:`StepRun` at once: the host reads the step's values (:meth:`StepRun.wait`, which waits for this step's
kernels only) and turns them into events while the device runs that call.

Where every row was the LLM's and its hand-back decisions are still on the device, the next call is the LLM's when
some row is pinned to it (``Request.role``: it keeps that row whatever it decides), else on a guess (it keeps some
row), where its lane allows it (``ahead_of_decisions``, gated by a :class:`~hf_rstitch.core.guessing.GuessGate`
where None) and undone (a position reset) when the values show it handed every row back (:meth:`StepRun.wait`).
Where nothing ran ahead for that reason, :meth:`StepRun.wait` queues the next call as soon as it has read the
values, where no row ends with them (:meth:`Executor._after_read`: the host knows the lane then), so that the call
runs while the host makes the step's events, hands them on and plans the next step: only the read and that call's
launch stand between two device calls. Where a waiting request would join at the next step (the scheduler's
``admissible``), it joins now, before the host reads the step's values (``join_ahead``: the scheduler takes it into
a row free now; :meth:`join` queues each lane's prefill of it behind the step), and the next call runs ahead over it
too -- the SLM's, where it starts with the SLM. The run-ahead is left out where the next step depends on what the
host has not read: rows held for the LLM (a schedule), a row whose sampling failed, or joins that wait for the
step's values (a group read in chunks). Nothing here makes the host wait for the device but :meth:`StepRun.wait`
(``tests/fast/test_fast_gpu.py`` runs steps under torch's sync debug mode "error"). The executor knows no request's
life, no queue and no HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Callable

import torch

from ..core.guessing import GuessGate
from ..core.roles import Role
from ..core.trace import ForwardCall
from ..decode.loop import on_device, run_ahead, settle_ahead
from ..decode.step import Ahead, StepOut
from ..decode.step_values import receive_values, send_values
from .batch import Batch
from .request_types import RequestState


@dataclass
class StepOutput:
    """One step's outcome for each row of the plan (``[b]`` host lists), as :meth:`StepRun.wait` reads it."""

    tokens: list[int]
    entropy: list[float]  # the writer's normalized entropy
    slm_entropy: list[float | None]  # the SLM's where it ran
    writer_llm: list[bool]  # the LLM wrote the row's token
    handed: list[bool]  # the SLM's proposal was discarded
    held: set[int]  # rows that gained no token (waiting for the LLM)
    failed: dict[int, str]  # rows whose own sampling failed, with the reason (their token is a placeholder)
    calls: list[tuple[int, ForwardCall]]  # (row, forward call) for every accounted row


class StepRun:
    """A step queued on the device; :meth:`wait` reads its values once their copy is on the host."""

    def __init__(self, out: StepOut, held: set[int], failed: dict[int, str], pending, batch: Batch,
                 gate: GuessGate, stats: dict, after_read: Callable[..., None] | None = None):
        self.out, self.held, self.failed, self.pending, self.batch = out, held, failed, pending, batch
        self.gate, self.stats = gate, stats
        self.after_read = after_read  # called with (out, the decisions read, the tokens read) once they are read

    def wait(self) -> StepOutput:
        """The step's values on the host (one copy, queued before any early call of the next step); the routing of
        the rows after it (the LLM's hand-back decisions are among the values). An LLM call run ahead on a guess is
        undone where the LLM handed every row back (:func:`~hf_rstitch.decode.loop.settle_ahead`)."""
        out, b, batch = self.out, len(self.out.writer_llm), self.batch
        tokens, entropy, slm_h, back = receive_values(self.pending)
        guessed, batch.ahead = batch.ahead, settle_ahead(batch.lanes, out, back, batch.ahead, self.gate)
        self.stats["undone"] += guessed is not None and batch.ahead is None
        batch.routing.after(out.writer_llm, back, out.held, out.no_llm)
        picked = tokens.tolist()
        if self.after_read is not None:
            self.after_read(out, back, picked)
        handed = out.handed.tolist() if out.handed is not None else [False] * b
        slm = slm_h.tolist() if slm_h is not None else [None] * b  # per-row values: one conversion each
        return StepOutput(picked, entropy.tolist(), slm, out.writer_llm.tolist(), handed, self.held, self.failed,
                          out.calls)


class Executor:
    """Runs step plans over a :class:`~.batch.Batch` (see the module docstring). What the request engine calls:
    :attr:`ran_ahead`, :meth:`execute`, :meth:`leave`, :meth:`forget` and :meth:`check` (a stand-in provides these).

    Args:
        batch: the rows on the device and their lanes.
        vocab: ids the pair shares (a vocabulary past 2**24 sends its ids as float64).
        schedule: when the LLM runs for the rows that need it (None: at once).
        stats: the engine's counters (``steps``, ``slm_calls``, ``llm_calls``, ``held``, ``ahead``, ``undone``: LLM
            calls run ahead on a guess and undone; ``ahead_after_read``: next calls queued once a step's values were
            read, :meth:`_after_read`; ``joined_ahead``: rows that joined ahead of a step), updated here.
        step, sample: the stitched step and the sampler it runs (:func:`~hf_rstitch.decode.step.run_step`,
            :func:`~hf_rstitch.core.sampling.sample_one`; a test may stand either in).
        hold_trim: held rows grow the shared padding; it is trimmed once every row has this much (one copy a row).
        join_ahead: where a waiting request would join at the next step, takes the joiners at once (the scheduler's
            :meth:`~.scheduler.Scheduler.join_ahead`), so that their rows join and the next call still runs ahead;
            None (or it returns None): the next call waits for the step's values and the joins.
    """

    def __init__(self, batch: Batch, vocab: int, schedule, stats: dict, step: Callable, sample: Callable,
                 hold_trim: int, join_ahead: Callable | None = None):
        self.batch, self.vocab, self.schedule, self.stats = batch, vocab, schedule, stats
        self.step, self.sample, self.hold_trim, self.join_ahead = step, sample, hold_trim, join_ahead
        self.index = 0  # StepView.index of the next step
        self.gate = GuessGate()  # whether the LLM's next call is queued before its hand-back decisions are read
        self.after_read = True  # where none ran ahead, the next call is queued right after a step's values are read
        # (:meth:`_after_read`); False: at the next step, as a benchmark's comparison sets it (engine_variants.py)

    @property
    def ran_ahead(self) -> bool:
        """The lanes have read the next column for the running rows only (a run-ahead): no row may join now."""
        return self.batch.ahead is not None

    def leave(self, rows: list[RequestState], index: list[int]) -> None:
        """The rows ``index`` of ``rows`` (every row, before) leave the batch (finished or cancelled)."""
        self.batch.drop(rows, index)

    def forget(self, rows: list[RequestState]) -> None:
        """Every row leaves after a failed step; where the lanes themselves are broken, the host forgets them."""
        try:
            self.batch.drop(rows, list(range(len(rows))))
        except Exception:  # noqa: BLE001 -- the lanes are reset when the next request joins the empty batch
            self.batch.clear()

    def check(self, rows: list[RequestState]) -> None:
        """Assert the batch holds ``rows`` (the scheduler's running rows, in order)."""
        self.batch.check(rows)

    def apply(self, plan) -> None:
        """The plan's moves of the batch: its joins (into an empty batch: fresh columns and caches), then the rows
        it preempts leave."""
        if plan.join:
            if len(plan.joined) == len(plan.join):
                self.batch.start_afresh()
            self.join(plan.joined, plan.join, plan.staged)
        self.batch.drop(plan.joined, plan.leave)

    def join(self, rows: list[RequestState], new: list[RequestState], staged: list[int] | None = None) -> None:
        """The rows of ``new`` (the last of ``rows``, every row after) join the batch: each lane prefills them."""
        self.batch.join(rows, new, staged)

    def execute(self, plan, admissible: Callable[[], bool]) -> StepRun | None:
        """Run ``plan``: its moves, then one token for every row of ``plan.rows`` (None when no row is left).
        ``admissible()`` says whether a waiting request would join at the next step (then it joins ahead of it,
        :meth:`_queue_next`, or no call runs ahead)."""
        self.apply(plan)
        if not plan.rows:
            return None
        batch = self.batch
        ahead, batch.ahead = batch.ahead, None
        out = self.step(batch.lanes, batch.seq, batch.mask, batch.routing, batch.policy, self.index, batch.slots,
                        schedule=self.schedule, ahead=ahead)
        self.index += 1
        held = set(out.held.nonzero().flatten().tolist()) if out.held is not None else set()  # rows without a token
        self._count(out, held)
        picked, failed = self._pick(plan.rows, out.logits, held, out.greedy)  # [b] on the device
        batch.append(plan.rows, picked, held, self.hold_trim)
        pending = send_values(picked, out.entropy, out.slm_entropy, out.back, self.vocab >= 1 << 24)  # before an early call
        if held or failed or self.schedule is not None:
            return StepRun(out, held, failed, pending, batch, self.gate, self.stats)
        self._queue_next(out, admissible)
        # the LLM's decisions on the device: where nothing runs ahead once they are read (none did, or a guess was
        # undone), the lane they name is known then
        after = partial(self._after_read, plan.rows, admissible) if self.after_read and on_device(out.back) else None
        return StepRun(out, held, failed, pending, batch, self.gate, self.stats, after)

    def _after_read(self, rows: list[RequestState], admissible: Callable[[], bool], out: StepOut,
                    back: torch.Tensor, tokens: list[int]) -> None:
        """Where no call ran ahead of a step's values because the LLM wrote every row and its hand-back decisions were
        on the device (or its guess was undone once read): the next step's first call, queued once
        :meth:`StepRun.wait` has read them (the lane they name, no guess). Not where a guess of the LLM's was kept, a
        row ends with these tokens (its call would be wasted and its row re-laid first) or a waiting request would
        join (the next step's admission places it)."""
        batch = self.batch
        if batch.ahead is not None or any(row.ending(t) for row, t in zip(rows, tokens)) or admissible():
            return
        # no guess: the host has read the decisions (a lane told to guess, ahead_of_decisions=True, would guess anyway)
        batch.ahead = self._run_ahead(replace(out, back=back), None)
        self.stats["ahead_after_read"] += batch.ahead is not None

    def _queue_next(self, out: StepOut, admissible: Callable[[], bool]) -> None:
        """The next step's first lane call, queued now where the host knows it, or where the LLM's lane may guess
        it (:meth:`_run_ahead`, the loop's gate deciding). Where a waiting request would join at the next step, the
        joiners are taken now (``join_ahead``) and join first -- their prefill queued behind this step's calls, their
        first token read in that call -- else nothing is queued."""
        batch, joined = self.batch, []
        if admissible():
            taken = self.join_ahead() if self.join_ahead is not None else None
            if taken is None:
                return
            rows, joined = taken
            if joined:
                self.join(rows, joined)
                self.stats["joined_ahead"] += len(joined)
        batch.ahead = self._run_ahead(out, self.gate, joined)
        self.stats["ahead"] += batch.ahead is not None

    def _run_ahead(self, out: StepOut, gate: GuessGate | None, joined: list[RequestState] = ()) -> Ahead | None:
        """:func:`run_ahead` over the batch after ``out`` (``joined``: rows that joined after its calls)."""
        batch = self.batch
        return run_ahead(batch.lanes, out, batch.seq, batch.mask, batch.policy.needs_hidden, gate,
                         llm_keeps=batch.policy.holds(Role.LLM),
                         slm_joined=any(s.request.role is not Role.LLM for s in joined))

    def _count(self, out: StepOut, held: set[int]) -> None:
        st = self.stats
        st["steps"] += 1
        st["slm_calls"] += out.slm_entropy is not None
        st["llm_calls"] += out.back is not None
        st["held"] += len(held)

    def _pick(self, rows: list[RequestState], logits: torch.Tensor, held: set[int], greedy: torch.Tensor | None
              ) -> tuple[torch.Tensor, dict[int, str]]:
        """Greedy argmax per row (``greedy``: the lanes found it reading the logits out); rows that sample draw from
        their own generator (held rows draw nothing). Also the rows whose sampling raised, with the reason: they
        fail alone (their token is a placeholder)."""
        sampled = any(row.request.do_sample for row in rows)
        tokens = logits.argmax(dim=-1) if greedy is None else greedy.clone() if sampled else greedy
        failed = {}
        for i, row in enumerate(rows):
            r = row.request
            if r.do_sample and i not in held:
                try:
                    tokens[i] = self.sample(logits[i], r.temperature, r.top_p, row.generator)
                except Exception as err:  # noqa: BLE001 -- e.g. NaN logits in this row: this request alone fails
                    failed[i] = f"sampling failed for this request ({type(err).__name__}: {err})"
        return tokens, failed
