"""The scheduler: the one place that decides which requests run -- admission, preemption, the KV budget, the joins'
chunks -- and each request's life (:class:`~.request_types.RequestStatus`).

It holds every request the engine has not finished: ``waiting`` (in order of arrival), the group whose prompts are
being read in chunks (:mod:`.chunked_prefill`), and ``running`` (the batch's rows, in batch order). Each step,
:meth:`Scheduler.schedule` returns a :class:`StepPlan` for the executor (:mod:`.executor`):

1. **admission**: waiting requests join free rows, in order of arrival, while their prompts' KV blocks are free
   (:meth:`~.kv_budget.KVBudget.admit`) -- taken at the end of the step before, once its calls are queued and
   before the host reads its values (:meth:`Scheduler.join_ahead`, so that the next call still runs ahead), or at
   a step's start where no call ran ahead --
   at the steps the join pacing picks (:class:`~hf_rstitch.core.scheduling.JoinPacing`: at once by default, or in
   groups, free rows held empty a few steps); with ``prefill_chunk`` and rows decoding, a group of them is read a
   chunk a step first and joins once read;
2. **preemption** (paged KV memory): while the running rows' blocks (this step's column and a run-ahead's
   included) would not fit the pool, the newest rows leave (:meth:`~.kv_budget.KVBudget.preempt`): each goes back
   to the head of the queue (``WAITING``) with its prompt and the tokens it has written as its new input, and
   resumes where it stopped (its events go on; its ``max_new_tokens`` counts what it wrote before; its route resumes
   as a fresh row's, so a stitched request preempted inside an LLM run may differ from an uninterrupted run from
   there on). A row that does not fit the pool even alone ends with an ``error`` event whose ``error_code`` is
   :data:`~.request_types.KV_FULL` (a server answers 503).

Every decision is made on the host from what the scheduler keeps (each row's token count and output): nothing is
read from the device. The one device work it queues is a joining group's chunk, in the lanes' join twins, never
in the batch's caches. Requests end here too (:meth:`finish`): cancelled, finished by the update, or failed with
the batch (:meth:`fail_running`).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
from collections import deque
from dataclasses import dataclass

from ..core.scheduling import JoinDemand, JoinPacing
from .chunked_prefill import ChunkedPrefill
from .kv_budget import KVBudget
from .request_types import KV_FULL, Event, RequestState, RequestStatus

log = logging.getLogger("hf_rstitch.batching")


@dataclass
class StepPlan:
    """What one step runs: the batch's moves, then one token for every row of ``rows``."""

    join: list[RequestState]  # requests whose rows join the batch (the last rows of ``joined``)
    staged: list[int] | None  # their stage rows when their prompts were read in chunks; None: prefilled whole
    joined: list[RequestState]  # every row once they joined (an empty batch before: fresh columns and caches)
    leave: list[int]  # rows of ``joined`` that leave before the step (preempted for KV memory, or failed)
    rows: list[RequestState]  # the rows the step decodes, in batch order
    events: list[Event]  # requests the plan ended (a row the KV memory cannot hold)


class Scheduler:
    """Admission, preemption and the requests' lives (see the module docstring).

    Args:
        max_batch: rows decoded together at most.
        kv: the paged KV pool's budget (None: caches that are not paged; nothing is preempted).
        chunks: the joins' chunked prefill (None: the step's joins prefill whole).
        stats: the engine's counters, counted here: ``preempted``; ``joins`` (steps whose plan admits rows: a join
            call a lane, whose groups are the lane's), ``joined`` (rows admitted), ``paced`` (steps joinable
            requests waited under a join pacing that holds requests back: held by it, or a call ran ahead).
        pacing: when waiting requests join (None: at once, at every step a row is free).
    """

    def __init__(self, max_batch: int, kv: KVBudget | None, chunks: ChunkedPrefill | None, stats: dict,
                 pacing: JoinPacing | None = None):
        self.max_batch, self.kv, self.chunks, self.stats = max_batch, kv, chunks, stats
        self.pacing = pacing or JoinPacing()
        self.waited = 0  # steps in a row that joinable requests have waited (JoinDemand.waited)
        for key in ("preempted", "joins", "joined", "paced"):
            stats.setdefault(key, 0)
        self.running: list[RequestState] = []  # RUNNING, in batch order
        self.waiting: deque[RequestState] = deque()  # WAITING, in order of arrival
        self.states: dict[str, RequestState] = {}  # every request not finished yet, by id
        self.cancelled: set[str] = set()
        self.lock = threading.Lock()  # submit and cancel come from other threads

    # ---- requests coming and going --------------------------------------------------------------
    def check_fits(self, r) -> None:
        """Refuse (ValueError) a request whose prompt and whole budget the KV pool could never hold."""
        if self.kv is not None and not self.kv.fits(len(r.input_ids) + r.max_new_tokens - 1):
            raise ValueError(f"prompt ({len(r.input_ids)} tokens) + max_new_tokens ({r.max_new_tokens}) exceeds the "
                             f"engine's KV memory ({self.kv.blocks * self.kv.block} tokens a lane); shorten the "
                             "request or build the engine with a larger kv_tokens.")

    def add(self, state: RequestState) -> None:
        """Queue a request (under :attr:`lock`); its id must be new."""
        self.states[state.request_id] = state
        self.waiting.append(state)

    def take_cancelled(self) -> tuple[list[Event], list[int]]:
        """Cancelled requests end: their events, and the running rows that leave (indices, before)."""
        with self.lock:
            if not self.cancelled:  # the common step: no scan of the queue or the rows
                return [], []
            cancel, self.cancelled = self.cancelled, set()
            waiting = [s for s in self.waiting if s.request_id in cancel]
            self.waiting = deque(s for s in self.waiting if s.request_id not in cancel)
        if self.chunks is not None:
            waiting += self.chunks.cancel(cancel)
        events = [self.finish(s, "cancelled") for s in waiting]
        gone = [i for i, row in enumerate(self.running) if row.request_id in cancel]
        return events + [self.finish(self.running[i], "cancelled") for i in gone], gone

    def leave(self, index: list[int]) -> None:
        """The running rows ``index`` are gone from the batch."""
        gone = set(index)
        self.running = [row for i, row in enumerate(self.running) if i not in gone]

    def finish(self, state: RequestState, reason: str, token: int | None = None, error: str | None = None,
               code: str | None = None) -> Event:
        """End a request: its status, its finishing event; the scheduler forgets it."""
        state.status = RequestStatus.of(reason)
        with self.lock:
            self.states.pop(state.request_id, None)
        role = state.trace.roles[-1] if token is not None else None
        return Event(state.request_id, token, role, True, reason, error=error, trace=state.trace, error_code=code)

    def fail_running(self, message: str) -> list[Event]:
        """Every running request ends with an error (the rows are forgotten); a group being read goes back to the
        front of the queue, and waiting requests stay."""
        events = [self.finish(row, "error", error=f"the engine failed while decoding this batch ({message})")
                  for row in self.running]
        self.running = []
        if self.chunks is not None:
            back = self.chunks.release()[1]
            with self.lock:
                self.waiting.extendleft(reversed(back))
        return events

    # ---- one step's plan ------------------------------------------------------------------------
    def schedule(self, admit: bool = True) -> StepPlan:
        """This step's plan: admission (when ``admit``), then preemption (module docstring)."""
        join = self._joins_now(admit)
        new, staged = self._admit(join) if admit else ([], None)
        self._start(new)
        joined = list(self.running)
        leave, events = self._make_room()
        return StepPlan(new, staged, joined, leave, list(self.running), events)

    def join_ahead(self) -> tuple[list[RequestState], list[RequestState]] | None:
        """Requests that join before the next step, taken now -- once a step's calls are queued, before the host reads
        its values -- where :meth:`admissible` says some would join at the next step: ``(every running row, the new
        ones, the last of them)``. They take the rows free now (a row this step frees is filled a step later), in
        order of arrival, while their prompts' KV blocks fit beside the running rows' with the column this step
        writes. None: joins wait for the step's values (a group read in chunks joins at a step's start)."""
        if self.chunks is not None:
            return None
        new = self._take_waiting(self.max_batch, written=1)
        if new:
            self.waited = 0
        self._start(new)
        return list(self.running), new

    def _start(self, new: list[RequestState]) -> None:
        """``new`` join the running rows (at the end, in order)."""
        if new:
            self.stats["joins"] += 1
            self.stats["joined"] += len(new)
        for state in new:  # the host's record first: a lane that fails to take them fails these rows with the batch
            state.status = RequestStatus.RUNNING
        self.running += new

    def read_ahead(self) -> None:
        """The joining group's next chunk, queued right after a step's calls and before the host reads that step
        (:meth:`~.chunked_prefill.ChunkedPrefill.read_ahead`); a new group is taken from the rows free now when the
        join pacing would let requests join."""
        if self.chunks is None or not self.running:
            return
        with self.lock:
            join = not self.pacing.paces or self.pacing.join_now(self._demand())
        self.chunks.read_ahead(self._take_waiting if join else _no_one)

    def admissible(self) -> bool:
        """Whether a waiting request would take a free row at the next step."""
        with self.lock:
            if self.chunks:
                return True
            if not self.pacing.paces:
                room = bool(self.waiting) and len(self.running) < self.max_batch
                return room and self._admit_limit([self.waiting[0]]) > 0  # and its prompt's KV blocks
            demand = self._demand()
            return demand.joinable > 0 and self.pacing.join_now(demand)

    def _joins_now(self, admit: bool) -> bool:
        """Whether waiting requests may join at this step: ``admit`` (no call ran ahead) and the join pacing says so.
        Counts the steps joinable requests wait (a step without admission counts too: their rows stayed empty)."""
        if not self.pacing.paces:
            return admit
        with self.lock:
            demand = self._demand()
        if demand.joinable == 0:
            self.waited = 0
            return admit
        if admit and self.pacing.join_now(demand):
            self.waited = 0
            return True
        self.waited += 1
        self.stats["paced"] += 1
        return False

    def _demand(self) -> JoinDemand:
        """What the join pacing sees now (under :attr:`lock`)."""
        free = self.max_batch - len(self.running) - (len(self.chunks) if self.chunks is not None else 0)
        joinable = self._admit_limit(list(itertools.islice(self.waiting, max(0, free))))
        return JoinDemand(joinable, len(self.running), self.waited)

    def _admit(self, join: bool) -> tuple[list[RequestState], list[int] | None]:
        """Who joins at this step (``join``: waiting requests may; a group being read in chunks goes on either way)."""
        take = self._take_waiting if join else _no_one
        staged = None
        if self.chunks is not None and self.running:  # rows decode: joining prompts are read a chunk a step
            staged, new = self.chunks.step(take)
        else:
            if not join:
                return [], None
            new = self.chunks.release()[1] if self.chunks is not None else []  # an empty batch: join at once
            new += take(self.max_batch - len(new))
        return new, staged

    def _take_waiting(self, n: int, written: int = 0) -> list[RequestState]:
        """Up to ``n`` waiting requests, in order of arrival, and no more than the free rows and KV blocks
        (``written``: tokens each running row has written beyond its count, in a step not read yet)."""
        with self.lock:
            free = self.max_batch - len(self.running) - (len(self.chunks) if self.chunks is not None else 0)
            free = self._admit_limit(list(itertools.islice(self.waiting, max(0, min(n, free)))), written)
            return [self.waiting.popleft() for _ in range(min(free, len(self.waiting)))]

    def _admit_limit(self, waiting: list[RequestState], written: int = 0) -> int:
        """How many of ``waiting`` (in order) the KV pool lets join now (all of them without a budget)."""
        if self.kv is None or not waiting:  # no one to weigh: no count of the running rows' tokens
            return len(waiting)
        return self.kv.admit([row.n_tokens + written for row in self.running], [s.n_tokens for s in waiting])

    def _make_room(self) -> tuple[list[int], list[Event]]:
        """Rows to take out before the step so that the rest fit the KV pool: requeued (oldest first at the head of
        the queue, with what they wrote), or failed when one alone does not fit. Their indices, and the events."""
        if self.kv is None or not self.running:
            return [], []
        requeue, fail = self.kv.preempt([row.n_tokens for row in self.running])
        if not requeue and not fail:
            return [], []
        rows = self.running
        events = [self.finish(rows[i], "error", code=KV_FULL, error=(
            f"the request holds {rows[i].n_tokens} tokens, more than the KV memory's {self.kv.blocks * self.kv.block} "
            "for one row; retry with a shorter prompt or max_tokens, or run the server with more KV memory"))
            for i in fail]
        back = [rows[i] for i in requeue]
        self.leave(requeue + fail)
        with self.lock:
            for state in reversed(back):  # the oldest of them first in the queue
                ids = state.request.input_ids + state.output[state.replayed:]  # its prompt and output so far
                state.request = dataclasses.replace(state.request, input_ids=ids)
                state.replayed, state.held, state.pad = state.trace.n_tokens, None, 0
                state.status = RequestStatus.WAITING
                self.waiting.appendleft(state)
        self.stats["preempted"] += len(back)
        log.info("KV memory full: %d row(s) requeued, %d failed", len(back), len(fail))
        return sorted(requeue + fail), events

    def check(self) -> None:
        """Assert each request's status matches where it is, and every request held is known. Raises AssertionError."""
        with self.lock:
            waiting, states = list(self.waiting), dict(self.states)
        assert all(r.status is RequestStatus.RUNNING for r in self.running), [r.status for r in self.running]
        assert all(w.status is RequestStatus.WAITING for w in waiting), [w.status for w in waiting]
        staged = self.chunks.group if self.chunks is not None else []
        assert all(s.status is RequestStatus.WAITING for _, s in staged), [s.status for _, s in staged]
        held = [s.request_id for s in self.running + waiting + [s for _, s in staged]]
        assert sorted(held) == sorted(states), f"requests held {held} vs known {sorted(states)}"


def _no_one(n: int) -> list[RequestState]:
    return []
