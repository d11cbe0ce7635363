"""The stitched decode loop (the seed paper's Algorithm 1), batch size 1.

Per new position:

1. If the SLM is in control, it runs (partial prefill + next-token logits) and the policy
   decides whether to keep its proposal or discard it (hand-over to the LLM).
2. If the LLM is in control (or just took over), it runs; its token is always kept, and the
   policy decides whether control returns to the SLM for the next position.
3. The writer's logits go through the logits processor; a token is picked; stopping
   criteria are checked.

Where a switch is decided: the two ``policy.hand_to_*`` calls below, nowhere else.
"""

from __future__ import annotations

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
    sequences: torch.Tensor  # [B, T_prompt + new]
    trace: StitchTrace
    scores: list[torch.Tensor] = field(default_factory=list)  # per new token, [B, V] processed
    logits: list[torch.Tensor] = field(default_factory=list)  # per new token, [B, V] raw


def stitch_loop(
    lanes: dict[Role, Lane],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    policy: RoutingPolicy,
    process: Processor,
    should_stop: Stopper,
    do_sample: bool = False,
    on_token: Callable[[torch.Tensor], None] | None = None,
    keep_scores: bool = False,
    keep_logits: bool = False,
) -> StitchResult:
    """Decode until ``should_stop`` says so, alternating the SLM and LLM lanes.

    Args:
        lanes: ``{Role.SLM: Lane, Role.LLM: Lane}``, fresh (nothing seen yet).
        input_ids: ``[1, T]`` prompt ids.
        attention_mask: ``[1, T]`` prompt mask.
        policy: decides the hand-overs (see :mod:`hf_rstitch.core.policies`).
        process: logits processor applied to the writer's raw logits.
        should_stop: stopping rule on (sequence, processed scores).
        do_sample: sample instead of argmax.
        on_token: called with each new token ``[B]`` (streamers).
        keep_scores / keep_logits: keep processed scores / raw logits per new token.
    """
    seq, mask = input_ids, attention_mask
    trace = StitchTrace(policy=repr(policy))
    result = StitchResult(seq, trace)
    entropies, slm_entropies = [], []
    active = Role.SLM
    policy.reset()
    while True:
        index = trace.n_tokens
        last = trace.roles[-1] if trace.roles else None
        handover, slm_h = False, None
        if active is Role.SLM:
            logits, hidden, call = lanes[Role.SLM].advance(
                seq, mask, resumed=last is Role.LLM, want_hidden=policy.needs_hidden
            )
            trace.calls.append(call)
            entropy = normalized_entropy(logits)
            if bool(policy.hand_to_llm(StepView(index, entropy, hidden))[0]):
                handover, slm_h, active = True, entropy, Role.LLM  # discard the SLM's proposal
        writer = active
        if writer is Role.LLM:
            logits, _, call = lanes[Role.LLM].advance(seq, mask, resumed=last is Role.SLM)
            trace.calls.append(call)
            entropy = normalized_entropy(logits)
            if bool(policy.hand_to_slm(StepView(index, entropy))[0]):
                active = Role.SLM  # the LLM's token is kept; the SLM takes the next position

        scores = process(seq, logits)
        token = pick_tokens(scores, do_sample)  # [B]
        seq = torch.cat([seq, token[:, None]], dim=-1)
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=-1)

        trace.roles.append(writer)
        trace.handovers.append(handover)
        entropies.append(entropy[0])
        slm_entropies.append(slm_h[0] if slm_h is not None else (entropy[0] if writer is Role.SLM else None))
        if keep_scores:
            result.scores.append(scores)
        if keep_logits:
            result.logits.append(logits)
        if on_token is not None:
            on_token(token)
        if bool(should_stop(seq, scores).all()):
            break

    trace.entropies = torch.stack(entropies).tolist()
    trace.slm_entropies = [None if h is None else float(h) for h in slm_entropies]
    result.sequences = seq
    return result
