"""How a :class:`~hf_rstitch.serving.requests.RequestEngine`'s requests end: finished, cancelled, or with a batch
that failed; and the check of its bookkeeping between steps.

A mixin over the engine's state: ``_rows`` (running), ``_waiting``, ``_states``, ``_cancel``, ``_staging``,
``_lock``, ``_slots``, ``_seq``, ``_mask``, ``_routing``, ``policy``, ``thresholds``, ``lanes`` and ``_drop``.
"""

from __future__ import annotations

import logging
from collections import deque

import torch

from ..decode.step import Routing
from .request_types import Event, RequestState, RequestStatus

log = logging.getLogger("hf_rstitch.serving")


class Endings:
    """``check_consistent``, ``_take_cancelled``, ``_finish`` and ``_fail_batch`` of a RequestEngine."""

    def check_consistent(self) -> None:
        """Assert the bookkeeping between steps: one row per running request in every per-row structure,
        each request's status matching where it is, no slot or id used twice. Raises AssertionError."""
        with self._lock:
            waiting, states = list(self._waiting), dict(self._states)
        b, slots = len(self._rows), self._slots.tolist()
        shapes = {"slots": len(slots), "seq": self._seq.shape[0], "mask": self._mask.shape[0],
                  "routing": self._routing.llm_on.shape[0]}
        assert all(n == b for n in shapes.values()), f"{b} rows but per-row structures of {shapes}"
        assert len(set(slots)) == b, f"a slot used twice: {slots}"
        assert set(self.policy.pins) <= set(slots), f"pins {self.policy.pins} for slots not running {slots}"
        if self.thresholds is not None:
            assert set(self.thresholds.thresholds) == set(slots), f"thresholds {self.thresholds.thresholds} vs {slots}"
        assert all(r.status is RequestStatus.RUNNING for r in self._rows), [r.status for r in self._rows]
        assert all(w.status is RequestStatus.WAITING for w in waiting), [w.status for w in waiting]
        staged = self._staging.group if self._staging is not None else []
        assert all(s.status is RequestStatus.WAITING for _, s in staged), [s.status for _, s in staged]
        held = [s.request_id for s in self._rows + waiting + [s for _, s in staged]]
        assert sorted(held) == sorted(states), f"requests held {held} vs known {sorted(states)}"
        for i, row in enumerate(self._rows):
            assert not self._mask[i, :row.pad].any(), f"row {i} has tokens in its {row.pad} padding columns"

    def _take_cancelled(self) -> list[Event]:
        with self._lock:
            cancel, self._cancel = self._cancel, set()
            waiting = [s for s in self._waiting if s.request_id in cancel]
            self._waiting = deque(s for s in self._waiting if s.request_id not in cancel)
        if self._staging is not None:
            waiting += self._staging.cancel(cancel)
        events = [self._finish(s, "cancelled") for s in waiting]
        gone = [i for i, row in enumerate(self._rows) if row.request_id in cancel]
        events += [self._finish(self._rows[i], "cancelled") for i in gone]
        self._drop(gone)
        return events

    def _finish(self, state: RequestState, reason: str, token: int | None = None, error: str | None = None,
                code: str | None = None) -> Event:
        """End a request: its status, its finishing event; the engine forgets it."""
        state.status = RequestStatus.of(reason)
        with self._lock:
            self._states.pop(state.request_id, None)
        role = state.trace.roles[-1] if token is not None else None
        return Event(state.request_id, token, role, True, reason, error=error, trace=state.trace, error_code=code)

    def _fail_batch(self, message: str) -> list[Event]:
        """Every running request ends with an error; the batch starts afresh (waiting requests stay)."""
        events = [self._finish(row, "error", error=f"the engine failed while decoding this batch ({message})")
                  for row in self._rows]
        if self._staging is not None:  # a group being read goes back to the front of the queue
            back = self._staging.release()[1]
            with self._lock:
                self._waiting.extendleft(reversed(back))
        try:
            self._drop(list(range(len(self._rows))))
        except Exception:  # noqa: BLE001 -- the lanes themselves are broken: forget the rows on the host side
            self.policy.pins.clear()
            if self.thresholds is not None:
                self.thresholds.thresholds.clear()
            self._rows, self._ahead, self._slots = [], None, torch.zeros(0, dtype=torch.long)
            self._seq, self._mask, self._routing = self._seq[:0, :0], self._mask[:0, :0], Routing.start(0)
            for lane in self.lanes.values():  # no rows, so that the next admission's reset starts from none
                try:
                    lane.keep_rows(self._slots)
                except Exception:  # noqa: BLE001
                    log.exception("a lane could not drop its rows after a failed step")
        return events  # the lanes are reset when the next request is admitted into the empty batch

