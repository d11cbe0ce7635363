"""The running batch on the device: the rows' shared columns, their routing and their lanes' caches.

Every row has seen the same columns of one left-padded sequence (``seq`` / ``mask`` ``[b, T]`` on the device). A
joining request is right-aligned with the others -- left-padded to the batch's width, or the batch is padded on
the left when the new prompt is longer -- and each lane prefills the columns it has already seen for it (the
step's joins together, or a group whose prompts were read in chunks: :mod:`.chunked_prefill`); columns that
became padding in every row are trimmed when rows leave. Each lane makes the same moves on its cache
(:mod:`hf_rstitch.decode.protocol`).

The batch knows its rows by position only; the request states (``rows``, in batch order, the scheduler's
``running``) are handed to each move, which keeps their ``pad`` (left-padding columns, on the host: no device read).
It also holds each row's routing state (who controls it, its pin, threshold or own policy, by slot id: the
``StepView.rows`` the policy sees) and a lane call run a step early (``ahead``: :func:`hf_rstitch.decode.loop.run_ahead`).
"""

from __future__ import annotations

import itertools
import logging

import torch

from ..core.policies import checked
from ..core.roles import Role
from ..decode.loop import keep_ahead
from ..decode.step import Routing, to_device
from .request_types import RequestState

log = logging.getLogger("hf_rstitch.batching")


class Batch:
    """The device side of the running rows (see the module docstring). ``policy`` is the :class:`PinnedRoles`
    the step asks; ``thresholds`` / ``per_row`` the requests' own thresholds and policies (None under one policy)."""

    def __init__(self, lanes: dict, device: torch.device, pad_id: int, policy, thresholds=None, per_row=None):
        self.lanes, self.device, self.pad_id = lanes, device, pad_id
        self.policy, self.thresholds, self.per_row = policy, thresholds, per_row
        self.seq = torch.zeros(0, 0, dtype=torch.long, device=device)  # [b, T] shared columns
        self.mask = torch.zeros(0, 0, dtype=torch.long, device=device)
        self.slots = torch.zeros(0, dtype=torch.long)  # [b] row id of each row (StepView.rows)
        self.routing = Routing.start(0)
        self.ahead = None  # the next step's first lane call, run early; admission waits for it

    def __len__(self) -> int:
        return len(self.slots)

    def start_afresh(self) -> None:
        """An empty batch starts with no columns and fresh caches."""
        for lane in self.lanes.values():
            lane.reset()
        self.seq, self.mask = self.seq[:, :0], self.mask[:, :0]

    def join(self, rows: list[RequestState], new: list[RequestState], staged: list[int] | None) -> None:
        """The rows of ``new`` (the last of ``rows``, every row after the join) into the columns and every lane."""
        width = max(len(s.request.input_ids) for s in new)
        grow = width - self.seq.shape[1]
        if grow > 0:
            self.seq = torch.nn.functional.pad(self.seq, (grow, 0), value=self.pad_id)
            self.mask = torch.nn.functional.pad(self.mask, (grow, 0), value=0)
            for lane in self.lanes.values():
                lane.pad_left(grow)
            for row in rows[:-len(new)]:
                row.pad += grow
        width = self.seq.shape[1]
        seq, mask = self._layout([s.request.input_ids for s in new], width)  # on the host: the lanes read no
        # mask back from the device (a join queued while a step runs does not wait for it)
        for lane in self.lanes.values():
            if staged:
                lane.add_rows(seq, mask, staged=staged)
                lane.unstage()
            else:
                lane.add_rows(seq, mask)
        seq, mask = to_device(seq, self.device), to_device(mask, self.device)
        self.seq, self.mask = torch.cat([self.seq, seq]), torch.cat([self.mask, mask])
        self.routing.add([s.request.role is Role.LLM for s in new])
        slots = self._free_slots(len(new))
        for slot, state in zip(slots, new):
            self._route(slot, state)
            state.pad = width - len(state.request.input_ids)
        self.policy.start_rows(slots)  # a policy with per-row state (StepPolicy) starts these rows afresh
        self.slots = torch.cat([self.slots, torch.tensor(slots, dtype=torch.long)])

    def _route(self, slot: int, state: RequestState) -> None:
        r = state.request
        if r.role is not None:
            self.policy.pins[slot] = r.role
        if self.thresholds is not None:
            self.thresholds.thresholds[slot] = state.trace.threshold
        if r.stitch_policy is not None:
            self.per_row.policies[slot] = checked(r.stitch_policy)

    def _free_slots(self, n: int) -> list[int]:
        used = set(self.slots.tolist())
        return list(itertools.islice((i for i in itertools.count() if i not in used), n))

    def _layout(self, prompts: list[list[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The new prompts right-aligned in ``width`` columns: ids ``[k, width]`` and mask, on the host."""
        seq = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros(len(prompts), width, dtype=torch.long)
        for i, ids in enumerate(prompts):
            seq[i, width - len(ids):] = torch.tensor(ids)
            mask[i, width - len(ids):] = 1
        return seq, mask

    def drop(self, rows: list[RequestState], index: list[int]) -> None:
        """Remove the rows ``index`` of ``rows`` (every row, before), then trim columns that are padding in every row."""
        if not index:
            return
        gone = set(index)
        keep = torch.tensor([i for i in range(len(rows)) if i not in gone], dtype=torch.long)
        for i in index:
            slot = int(self.slots[i])
            self.policy.pins.pop(slot, None)
            if self.per_row is not None:
                self.per_row.policies.pop(slot, None)
            if self.thresholds is not None:
                self.thresholds.thresholds.pop(slot, None)
        left = [row for i, row in enumerate(rows) if i not in gone]
        self.ahead = keep_ahead(self.ahead, keep) if left else None  # no rows: the lanes start afresh
        self.slots = self.slots[keep]
        self.routing.keep(keep)
        at = to_device(keep, self.device)
        self.seq, self.mask = self.seq[at], self.mask[at]
        for lane in self.lanes.values():
            lane.keep_rows(keep)
        self.trim(left)

    def trim(self, rows: list[RequestState], at_least: int = 1) -> None:
        """Drop leading columns that are padding in every row (when there are ``at_least`` of them)."""
        if rows:
            n = min(row.pad for row in rows)
            if n >= at_least:
                self.seq, self.mask = self.seq[:, n:], self.mask[:, n:]
                for lane in self.lanes.values():
                    lane.trim_left(n)
                for row in rows:
                    row.pad -= n

    def append(self, rows: list[RequestState], tokens: torch.Tensor, held: set[int], hold_trim: int) -> None:
        """One new column: each row's token, or, for held rows, a masked column in front (they move right)."""
        self.seq = torch.cat([self.seq, tokens.to(self.seq.device)[:, None]], dim=-1)
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(rows), 1)], dim=-1)
        if not held:
            return
        index = sorted(held)
        at = to_device(index, self.device)
        self.seq[at] = torch.nn.functional.pad(self.seq[at, :-1], (1, 0), value=self.pad_id)
        self.mask[at] = torch.nn.functional.pad(self.mask[at, :-1], (1, 0), value=0)
        for lane in self.lanes.values():
            lane.hold_rows(index)
        for i in index:
            rows[i].pad += 1
        self.trim(rows, hold_trim)

    def clear(self) -> None:
        """Forget every row on the host side (after a failed step: the lanes may be broken); the lanes are told to
        keep none, so that the next admission's reset starts from none."""
        self.policy.pins.clear()
        if self.thresholds is not None:
            self.thresholds.thresholds.clear()
        self.ahead, self.slots = None, torch.zeros(0, dtype=torch.long)
        self.seq, self.mask, self.routing = self.seq[:0, :0], self.mask[:0, :0], Routing.start(0)
        for lane in self.lanes.values():
            try:
                lane.keep_rows(self.slots)
            except Exception:  # noqa: BLE001
                log.exception("a lane could not drop its rows after a failed step")

    def check(self, rows: list[RequestState]) -> None:
        """Assert one row per running request in every per-row structure, no slot used twice, no token in padding."""
        b, slots = len(rows), self.slots.tolist()
        shapes = {"slots": len(slots), "seq": self.seq.shape[0], "mask": self.mask.shape[0],
                  "routing": self.routing.llm_on.shape[0]}
        assert all(n == b for n in shapes.values()), f"{b} rows but per-row structures of {shapes}"
        assert len(set(slots)) == b, f"a slot used twice: {slots}"
        assert set(self.policy.pins) <= set(slots), f"pins {self.policy.pins} for slots not running {slots}"
        if self.thresholds is not None:
            assert set(self.thresholds.thresholds) == set(slots), f"thresholds {self.thresholds.thresholds} vs {slots}"
        for i, row in enumerate(rows):
            assert not self.mask[i, :row.pad].any(), f"row {i} has tokens in its {row.pad} padding columns"
