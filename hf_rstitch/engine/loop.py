"""The stitched decode loop (the seed paper's Algorithm 1), every row routed on its own.

Per step, every unfinished row gains one token:

1. Rows the SLM controls run the SLM (partial prefill + next-token logits); the policy decides
   per row whether to keep its proposal or discard it (hand-over to the LLM).
2. Rows the LLM controls -- or that were just handed over -- run the LLM; its token is always
   kept, and the policy decides per row whether control returns to the SLM for the next step.
3. Each row's writer logits go through the logits processor; a token is picked; stopping
   criteria are checked; finished rows are dropped from both lanes.

Where a switch is decided: the two ``policy.hand_to_*`` calls below, nowhere else.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..core.entropy import normalized_entropy
from ..core.policies import RoutingPolicy, StepView
from ..core.roles import Role
from ..core.sampling import pick_tokens
from ..core.trace import StitchTrace
from .lane import Lane

# (sequence [B, T], raw logits [B, V]) -> processed scores [B, V]
Processor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# (sequence [B, T], processed scores [B, V]) -> done [B] bool
Stopper = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class StitchResult:
    sequences: torch.Tensor  # [B, T_prompt + new], finished rows padded with pad_token_id
    traces: list[StitchTrace]  # one per row
    scores: list[torch.Tensor] = field(default_factory=list)  # per step, [B, V] processed (-inf: finished)
    logits: list[torch.Tensor] = field(default_factory=list)  # per step, [B, V] raw (-inf: finished)


class _Rows:
    """Bookkeeping that maps the live (unfinished) batch back to the caller's rows."""

    def __init__(self, batch: int, keep_scores: bool, keep_logits: bool):
        self.live = torch.arange(batch)  # caller's row index of each live row
        self.batch = batch
        self.keep_scores, self.keep_logits = keep_scores, keep_logits
        self.scores: list[torch.Tensor] = []
        self.logits: list[torch.Tensor] = []
        self.done: dict[int, torch.Tensor] = {}  # caller's row -> final sequence (1-D)

    def _full(self, part: torch.Tensor) -> torch.Tensor:
        full = part.new_full((self.batch, part.shape[-1]), float("-inf"))
        full[self.live.to(part.device)] = part
        return full

    def record(self, scores: torch.Tensor, logits: torch.Tensor) -> None:
        if self.keep_scores:
            self.scores.append(self._full(scores))
        if self.keep_logits:
            self.logits.append(self._full(logits))

    def finish(self, seq: torch.Tensor, finished: torch.Tensor) -> torch.Tensor:
        """Store finished rows; return the CPU index of the rows still live."""
        for i in finished.nonzero().flatten().tolist():
            self.done[int(self.live[i])] = seq[i]
        keep = (~finished).nonzero().flatten()
        self.live = self.live[keep]
        return keep

    def sequences(self, pad_id: int) -> torch.Tensor:
        rows = [self.done[r] for r in range(self.batch)]
        length = max(len(r) for r in rows)
        return torch.stack([torch.nn.functional.pad(r, (0, length - len(r)), value=pad_id) for r in rows])


def stitch_loop(
    lanes: dict[Role, Lane],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    policy: RoutingPolicy,
    process: Processor,
    should_stop: Stopper,
    do_sample: bool = False,
    pad_token_id: int = 0,
    on_token: Callable[[torch.Tensor], None] | None = None,
    keep_scores: bool = False,
    keep_logits: bool = False,
) -> StitchResult:
    """Decode until ``should_stop`` says so for every row, alternating the SLM and LLM lanes.

    Args:
        lanes: ``{Role.SLM: Lane, Role.LLM: Lane}``, fresh (nothing seen yet), sized for the batch.
        input_ids: ``[B, T]`` prompt ids (left-padded when rows differ in length).
        attention_mask: ``[B, T]`` prompt mask.
        policy: decides the hand-overs (see :mod:`hf_rstitch.core.policies`).
        process: logits processor applied to each row's writer logits.
        should_stop: stopping rule on (sequence, processed scores) -> ``[B]`` done.
        do_sample: sample instead of argmax.
        pad_token_id: appended to rows that finished before the longest one.
        on_token: called with each step's tokens ``[B]`` (pad for finished rows), e.g. streamers.
        keep_scores / keep_logits: keep processed scores / raw logits of every step.
    """
    batch = input_ids.shape[0]
    seq, mask = input_ids, attention_mask
    rows = _Rows(batch, keep_scores, keep_logits)
    traces = [StitchTrace(policy=repr(policy)) for _ in range(batch)]
    pending: list[tuple[list[int], torch.Tensor, torch.Tensor | None]] = []  # entropies read at the end
    llm_on = torch.zeros(batch, dtype=torch.bool)  # [B] the LLM controls the row (CPU)
    last_llm = torch.zeros(batch, dtype=torch.bool)  # [B] the LLM wrote the row's latest token
    policy.reset()
    for index in itertools.count():
        slm_rows = ~llm_on
        slm_h = handed = slm_logits = None
        if slm_rows.any():
            slm_logits, hidden, calls = lanes[Role.SLM].advance(
                seq, mask, slm_rows, resumed=last_llm, want_hidden=policy.needs_hidden
            )
            _add_calls(traces, rows.live, calls)
            slm_h = normalized_entropy(slm_logits)
            handed = policy.hand_to_llm(StepView(index, slm_h, hidden, rows.live)).cpu() & slm_rows  # discard proposals
            llm_on = llm_on | handed
        llm_h = back = llm_logits = None
        if llm_on.any():
            llm_logits, _, calls = lanes[Role.LLM].advance(seq, mask, llm_on, resumed=~last_llm)
            _add_calls(traces, rows.live, calls)
            llm_h = normalized_entropy(llm_logits)
            back = policy.hand_to_slm(StepView(index, llm_h, rows=rows.live))  # read with `finished` below

        writer_llm = llm_on  # never changed in place: the next line that changes llm_on rebinds it
        logits = _by_writer(writer_llm, llm_logits, slm_logits)  # [B, V] of the model that writes each row
        entropy = _by_writer(writer_llm, llm_h, slm_h)  # [B]
        scores = process(seq, logits)
        tokens = pick_tokens(scores, do_sample)  # [B]
        seq = torch.cat([seq, tokens[:, None]], dim=-1)
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=-1)
        live = rows.live.tolist()
        _add_tokens(traces, live, writer_llm, handed)
        pending.append((live, entropy, slm_h))
        rows.record(scores, logits)
        if on_token is not None:
            full = torch.full((batch,), pad_token_id, dtype=tokens.dtype, device=tokens.device)
            full[rows.live.to(tokens.device)] = tokens
            on_token(full)
        last_llm = writer_llm

        finished, back = _to_host(should_stop(seq, scores), back)  # the step's one wait for the device
        if back is not None:
            llm_on = llm_on & ~back  # from the next step; this step's LLM token is kept either way
        if finished.any():
            keep = rows.finish(seq, finished)
            if len(keep) == 0:
                break
            seq, mask = seq[keep.to(seq.device)], mask[keep.to(mask.device)]
            llm_on, last_llm = llm_on[keep], last_llm[keep]
            for lane in lanes.values():
                lane.keep_rows(keep)
    _add_entropies(traces, pending)
    return StitchResult(rows.sequences(pad_token_id), traces, rows.scores, rows.logits)


def _by_writer(writer_llm: torch.Tensor, llm_value: torch.Tensor | None, slm_value: torch.Tensor | None):
    """Per row, the LLM's value where it writes and the SLM's elsewhere (either may be absent).

    ``writer_llm`` is ``[B]`` bool on the host; when every row has the same writer no mask goes to
    the device (a host-to-device copy would wait for every queued kernel).
    """
    if llm_value is None or slm_value is None:
        return slm_value if llm_value is None else llm_value
    if bool(writer_llm.all()):
        return llm_value
    if not bool(writer_llm.any()):
        return slm_value
    pick = writer_llm.to(llm_value.device)
    return torch.where(pick.view(-1, *[1] * (llm_value.dim() - 1)), llm_value, slm_value)


def _to_host(finished: torch.Tensor, back: torch.Tensor | None):
    """``finished`` (and the LLM's hand-back decision, when it is on the same device) in one copy."""
    if back is None or back.device != finished.device:
        return finished.cpu(), (back.cpu() if back is not None else None)
    both = torch.stack([finished.bool(), back.bool()]).cpu()
    return both[0], both[1]


def _add_calls(traces, live, calls) -> None:
    for r, call in calls.items():
        traces[int(live[r])].calls.append(call)


def _add_tokens(traces, live: list[int], writer_llm, handed) -> None:
    """Append one step's routing (already on the host) to each live row's trace."""
    handed = handed.tolist() if handed is not None else [False] * len(live)
    for r, llm, hand in zip(live, writer_llm.tolist(), handed):
        traces[r].roles.append(Role.LLM if llm else Role.SLM)
        traces[r].handovers.append(hand)


def _add_entropies(traces, pending) -> None:
    """Fill entropies after decoding: one device-to-host copy for the whole generation."""
    if not pending:
        return
    flat = torch.cat([h for _, h, _ in pending] + [s for _, _, s in pending if s is not None]).cpu().tolist()
    n_writer = sum(len(live) for live, _, _ in pending)
    writer, slm = iter(flat[:n_writer]), iter(flat[n_writer:])
    seen = [0] * len(traces)
    for live, _, slm_h in pending:
        slm_values = [next(slm) for _ in live] if slm_h is not None else [None] * len(live)
        for r, h, sh in zip(live, writer, slm_values):
            t, k = traces[r], seen[r]
            t.entropies.append(h)
            # the SLM's own entropy where it was consulted: it wrote the token, or handed it over
            t.slm_entropies.append(sh if (t.roles[k] is Role.SLM or t.handovers[k]) else None)
            seen[r] += 1
