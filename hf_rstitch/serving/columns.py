"""The batch's shared columns: how rows join, wait and leave one left-padded sequence.

A mixin over :class:`~hf_rstitch.serving.requests.RequestEngine`'s state (``_seq`` / ``_mask`` ``[b, T]`` on the
device, ``_rows`` in batch order, ``_slots``, ``lanes``): every row has seen the same columns. A joining request
is right-aligned with the others -- left-padded to the batch's width, or the batch is padded on the left when the
new prompt is longer -- and each lane prefills the columns it has already seen for it (the step's joins
together); columns that became padding in every row
are trimmed when rows leave. Each lane makes the same moves on its cache (:mod:`hf_rstitch.decode.protocol`).
"""

from __future__ import annotations

import torch

from ..core.policies import checked
from ..core.roles import Role
from ..decode.loop import keep_ahead
from ..decode.step import to_device
from .request_types import Request, RequestState


class Columns:
    def _join(self, new: list[RequestState], slots: list[int], staged) -> None:
        """The rows of ``new`` (already in ``_rows``, in ``slots``) into the columns and every lane."""
        width = max(len(s.request.input_ids) for s in new)
        grow = width - self._seq.shape[1]
        if grow > 0:
            self._seq = torch.nn.functional.pad(self._seq, (grow, 0), value=self.pad_id)
            self._mask = torch.nn.functional.pad(self._mask, (grow, 0), value=0)
            for lane in self.lanes.values():
                lane.pad_left(grow)
            for row in self._rows[:-len(new)]:
                row.pad += grow
        width = self._seq.shape[1]
        seq, mask = self._layout([s.request for s in new], width)
        for lane in self.lanes.values():
            if staged:
                lane.add_rows(seq, mask, staged=staged)
                lane.unstage()
            else:
                lane.add_rows(seq, mask)
        self._seq, self._mask = torch.cat([self._seq, seq]), torch.cat([self._mask, mask])
        self._routing.add([s.request.role is Role.LLM for s in new])
        for slot, state in zip(slots, new):
            r = state.request
            if r.role is not None:
                self.policy.pins[slot] = r.role
            if self.thresholds is not None:
                self.thresholds.thresholds[slot] = state.trace.threshold
            if r.stitch_policy is not None:
                self.per_row.policies[slot] = checked(r.stitch_policy)
            state.pad = width - len(r.input_ids)
        self.policy.start_rows(slots)  # a policy with per-row state (StepPolicy) starts these rows afresh
        self._slots = torch.cat([self._slots, torch.tensor(slots, dtype=torch.long)])

    def _layout(self, new: list[Request], width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The new prompts right-aligned in ``width`` columns: ids ``[k, width]`` and mask."""
        seq = torch.full((len(new), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros(len(new), width, dtype=torch.long)
        for i, r in enumerate(new):
            seq[i, width - len(r.input_ids):] = torch.tensor(r.input_ids)
            mask[i, width - len(r.input_ids):] = 1
        return to_device(seq, self.device), to_device(mask, self.device)

    def _drop(self, index: list[int]) -> None:
        """Remove finished rows from the batch, then trim columns that are padding in every row."""
        if not index:
            return
        gone = set(index)
        keep = torch.tensor([i for i in range(len(self._rows)) if i not in gone], dtype=torch.long)
        for i in index:
            slot = int(self._slots[i])
            self.policy.pins.pop(slot, None)
            if self.per_row is not None:
                self.per_row.policies.pop(slot, None)
            if self.thresholds is not None:
                self.thresholds.thresholds.pop(slot, None)
        self._rows = [row for i, row in enumerate(self._rows) if i not in gone]
        self._ahead = keep_ahead(self._ahead, keep) if self._rows else None  # no rows: the lanes start afresh
        self._slots = self._slots[keep]
        self._routing.keep(keep)
        at = to_device(keep, self.device)
        self._seq, self._mask = self._seq[at], self._mask[at]
        for lane in self.lanes.values():
            lane.keep_rows(keep)
        self._trim()

    def _trim(self, at_least: int = 1) -> None:
        """Drop leading columns that are padding in every row (when there are ``at_least`` of them)."""
        if self._rows:
            n = min(row.pad for row in self._rows)
            if n >= at_least:
                self._seq, self._mask = self._seq[:, n:], self._mask[:, n:]
                for lane in self.lanes.values():
                    lane.trim_left(n)
                for row in self._rows:
                    row.pad -= n
