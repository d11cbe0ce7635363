"""Chunked prefill of joins: prompts that join a decoding batch are read a bounded chunk a step before their rows join.

Without it (:class:`~hf_rstitch.batching.requests.RequestEngine` ``prefill_chunk=None``) the requests admitted in a
step prefill whole before that step decodes (batched: :mod:`hf_rstitch.fast.joins`), so a long prompt stalls every
decoding row for its whole prefill. With a budget, :class:`ChunkedPrefill` (the scheduler's: :mod:`.scheduler`)
takes up to ``stage_room`` waiting requests as one group, lays their prompts out in each lane's stage
(``stage_rows``) and, each step before the batch decodes, has each lane read at most ``prefill_chunk`` tokens of
them (rows x columns, padding included: a group of ``g`` rows reads ``prefill_chunk // g`` columns, at least one,
see :func:`hf_rstitch.fast.joins.chunk_columns`); the step a group's prompts are read to their last token its rows
join the batch (``add_rows(..., staged=...)``) and decode with it. A step's prefill work is so bounded by
``prefill_chunk`` tokens a lane, whatever the prompts' lengths. Requests of a group wait (``WAITING``) until it
joins; an empty batch takes its requests at once (nothing decodes that a prefill would stall).

Each chunk after a group's first is read ahead (:meth:`ChunkedPrefill.read_ahead`, the scheduler's
``read_ahead``): once a step's calls are queued on the device and before the host reads that step's values, so
the device reads it while the host reads the step, updates the requests and plans the next step, instead of after.
A group is taken then too, from the rows free at that moment (a row the step frees is filled one step later).

Lanes without stages (the eager engine's) join whole, as without a budget (logged once).

The group's keys and values equal those of a whole prefill (same positions; slots are moved by a copy), so a
greedy request's tokens are the same with or without chunks (tested).
"""

from __future__ import annotations

import logging
from typing import Callable

log = logging.getLogger("hf_rstitch.batching")


class ChunkedPrefill:
    """The request engine's group of joining requests whose prompts are read in chunks (one group at a time)."""

    def __init__(self, lanes: dict, prefill_chunk: int):
        if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be None or a positive number of tokens, got {prefill_chunk!r}")
        self.lanes, self.budget = lanes, prefill_chunk
        self.group: list[tuple[int, object]] = []  # (stage row, request state), in order of arrival
        self.steps = 0  # steps that read a chunk
        self.done = False  # the group's prompts are read to their last token in every lane
        self.ahead = False  # the coming step's chunk was read ahead (read_ahead)

    @classmethod
    def for_lanes(cls, lanes: dict, prefill_chunk: int | None) -> "ChunkedPrefill | None":
        """Chunked prefill for ``lanes`` when a budget is given and every lane has stages; else None (joins whole)."""
        if prefill_chunk is None:
            return None
        if not all(hasattr(lane, "stage_rows") for lane in lanes.values()):
            log.info("prefill_chunk=%s ignored: these lanes (%s) read joining prompts whole", prefill_chunk,
                     ", ".join(type(lane).__name__ for lane in lanes.values()))
            return None
        return cls(lanes, prefill_chunk)

    @property
    def room(self) -> int:
        return min(lane.stage_room for lane in self.lanes.values())

    def __len__(self) -> int:
        return len(self.group)

    def step(self, take: Callable[[int], list]) -> list:
        """This step's chunk of the group's prompts in every lane, unless :meth:`read_ahead` read it already (a new
        group from ``take(n)``, at most ``n`` waiting requests, when none is staged). Returns ``(stage rows,
        states)`` of the group once read to the end (their rows join now), else ``([], [])``."""
        if self.ahead:
            self.ahead = False
        else:
            self._read(take)
        if not self.group or not self.done:
            return [], []
        return self.release(done=True)

    def read_ahead(self, take: Callable[[int], list]) -> None:
        """The next step's chunk, read now: called once a step's calls are queued and before its values are read,
        so the device reads it while the host reads that step and schedules the next (which then reads no chunk of
        its own: one chunk a step either way)."""
        self._read(take)
        self.ahead = bool(self.group)

    def _read(self, take: Callable[[int], list]) -> None:
        if not self.group:
            new = take(self.room)
            if not new:
                return
            self.group = list(enumerate(new))
            for lane in self.lanes.values():
                lane.stage_rows([s.request.input_ids for s in new])
        self.steps += 1
        done = [lane.prefill_staged(self.budget) for lane in self.lanes.values()]  # every lane reads its chunk
        self.done = all(done)

    def release(self, done: bool = False) -> tuple[list[int], list]:
        """Empty the group: its stage rows and states (``done``: the lanes keep the stages until the rows have
        joined; else they forget them and the requests are admitted afresh)."""
        group, self.group, self.done, self.ahead = self.group, [], False, False
        if not done:
            for lane in self.lanes.values():
                lane.unstage()
        return [j for j, _ in group], [s for _, s in group]

    def cancel(self, ids: set[str]) -> list:
        """Take the group's requests named in ``ids`` out of it (their stage rows are left unread); their states."""
        gone = [s for _, s in self.group if s.request_id in ids]
        self.group = [(j, s) for j, s in self.group if s.request_id not in ids]
        return gone
