"""The request engine's side of a paged KV pool: how many waiting requests may join, and which rows leave when
the running rows outgrow the pool (the decisions are :class:`~.kv_budget.KVBudget`'s; this is the plumbing).

A mixin over :class:`~hf_rstitch.serving.requests.RequestEngine`'s state: ``kv`` (the budget, None for caches
that are not paged), ``_rows`` (running, oldest first), ``_waiting``, ``_seq``, ``_lock``, ``_drop`` and
``_finish``. A preempted request goes back to the head of the queue (status ``WAITING``) with its prompt and
the tokens it has written as its new input, and resumes where it stopped: its events go on, its
``max_new_tokens`` counts what it wrote before. Its route resumes as a fresh row's does (the SLM writes
first unless it is pinned to the LLM), so a stitched request preempted inside an LLM run may differ from an
uninterrupted run from there on. A row that does not fit the pool even alone ends with an ``error`` event
whose ``error_code`` is :data:`~.request_types.KV_FULL` (a server answers 503).
"""

from __future__ import annotations

import dataclasses
import logging

from .request_types import KV_FULL, Event, RequestStatus

log = logging.getLogger("hf_rstitch.serving")


class Preemption:
    """``_check_fits``, ``_admit_limit`` and ``_make_room`` of a RequestEngine."""

    def _check_fits(self, r) -> None:
        """Refuse (ValueError) a request whose prompt and whole budget the KV pool could never hold."""
        if self.kv is not None and not self.kv.fits(len(r.input_ids) + r.max_new_tokens - 1):
            raise ValueError(f"prompt ({len(r.input_ids)} tokens) + max_new_tokens ({r.max_new_tokens}) exceeds the "
                             f"engine's KV memory ({self.kv.blocks * self.kv.block} tokens a lane); shorten the "
                             "request or build the engine with a larger kv_tokens.")

    def _admit_limit(self, waiting: list) -> int:
        """How many of ``waiting`` (states, in order) the KV pool lets join now (all of them without a budget)."""
        if self.kv is None:
            return len(waiting)
        return self.kv.admit([row.n_tokens for row in self._rows], [s.n_tokens for s in waiting])

    def _make_room(self) -> list[Event]:
        """Before a step: the newest rows leave while the running rows' blocks (this step's column and a
        run-ahead's included) would not fit the pool; they are requeued, or fail when one alone does not fit."""
        if self.kv is None or not self._rows:
            return []
        requeue, fail = self.kv.preempt([row.n_tokens for row in self._rows])
        if not requeue and not fail:
            return []
        events = [self._finish(self._rows[i], "error", code=KV_FULL, error=(
            f"the request holds {self._rows[i].n_tokens} tokens, more than the KV memory's "
            f"{self.kv.blocks * self.kv.block} for one row; retry with a shorter prompt or max_tokens, or run the "
            "server with more KV memory")) for i in fail]
        back = []
        for i in requeue:
            state = self._rows[i]
            ids = self._seq[i, state.pad:].tolist()  # its prompt and output so far (one read, on preemption only)
            back.append((state, ids))
        self._drop(sorted(requeue + fail))
        with self._lock:
            for state, ids in reversed(back):  # the oldest of them first in the queue
                state.request = dataclasses.replace(state.request, input_ids=ids)
                state.replayed, state.held, state.pad = state.trace.n_tokens, None, 0
                state.status = RequestStatus.WAITING
                self._waiting.appendleft(state)
        self.stats["preempted"] += len(back)
        log.info("KV memory full: %d row(s) requeued, %d failed", len(back), len(fail))
        return events
