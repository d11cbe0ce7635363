"""What a decode loop keeps of the tokens it emits: the attention mask grown a column a step (:class:`MaskRoom`)
and each caller row's trace (:class:`TraceBook`). Both loops use them: :func:`~hf_rstitch.decode.loop.stitch_loop`
and :func:`~hf_rstitch.decode.speculate.speculative_loop`.

What it does not do: pick tokens or run lanes; it only keeps what the loops hand it.
"""

from __future__ import annotations

import torch

from ..core.roles import Role
from ..core.trace import StitchTrace
from .step import StepOut


class MaskRoom:
    """The attention mask grown by a column of ones a step: views of a buffer with room for :data:`ROOM` more
    columns at a time, so that most steps launch no kernel for it (lanes read the mask, never write it)."""

    ROOM = 256

    def __init__(self, mask: torch.Tensor):
        self.buffer = mask

    def take(self, width: int) -> torch.Tensor:
        """The mask of a sequence ``width`` columns long: the prompt's, then ones."""
        if width > self.buffer.shape[1]:
            ones = self.buffer.new_ones(self.buffer.shape[0], max(self.ROOM, width - self.buffer.shape[1]))
            self.buffer = torch.cat([self.buffer, ones], dim=-1)
        return self.buffer.narrow(1, 0, width)  # one view op, where [:, :width] takes two


class TraceBook:
    """Per caller row, the trace of the tokens it really generated (finished rows add nothing).

    Each step is kept as it came (host lists, device entropies) and written into the traces at the end:
    :meth:`record` does no per-row work and no tensor op while every row of the lanes is accounted."""

    def __init__(self, batch: int, policy: str):
        self.traces = [StitchTrace(policy=policy) for _ in range(batch)]
        self.steps: list[tuple] = []  # (rows, calls, writer, handed, entropy, slm entropy), one per step
        self._rows: tuple[torch.Tensor, list[int]] | None = None  # in_lanes and its list, converted once a change

    def record(self, in_lanes: torch.Tensor, accounted: torch.Tensor, out: StepOut, every: bool) -> None:
        """The step's records; ``every``: every lane row is accounted (``accounted`` is all True)."""
        if self._rows is None or self._rows[0] is not in_lanes:
            self._rows = (in_lanes, in_lanes.tolist())  # in_lanes changes only when rows leave
        caller = self._rows[1]
        calls = [(caller[r], call) for r, call in out.calls]
        writer, handed = out.writer_llm, out.handed
        entropy, slm_h = out.entropy, out.slm_entropy
        if not every:
            take = accounted.nonzero().flatten()
            caller = in_lanes[take].tolist()
            writer, handed = writer[take], handed[take] if handed is not None else None
            entropy = entropy[take.to(entropy.device)]
            slm_h = slm_h[take.to(slm_h.device)] if slm_h is not None else None
        self.steps.append((caller, calls, writer.tolist(), handed.tolist() if handed is not None else None,
                           entropy, slm_h))

    def finish(self) -> list[StitchTrace]:
        """Fill the traces after decoding: one device-to-host copy of the entropies for the whole generation."""
        steps, traces = self.steps, self.traces
        if not steps:
            return traces
        flat = torch.cat([h for *_, h, _ in steps] + [s for *_, s in steps if s is not None]).cpu().tolist()
        n_writer = sum(len(rows) for rows, *_ in steps)
        writer_h, slm = iter(flat[:n_writer]), iter(flat[n_writer:])
        for rows, calls, writer, handed, _, slm_h in steps:
            for r, call in calls:
                traces[r].calls.append(call)
            handed = handed if handed is not None else [False] * len(rows)
            slm_values = [next(slm) for _ in rows] if slm_h is not None else [None] * len(rows)
            for r, llm, hand, h, sh in zip(rows, writer, handed, writer_h, slm_values):
                t = traces[r]
                t.roles.append(Role.LLM if llm else Role.SLM)
                t.handovers.append(hand)
                t.entropies.append(h)
                # the SLM's own entropy where it was consulted: it wrote the token, or handed it over
                t.slm_entropies.append(sh if (not llm or hand) else None)
        return traces
