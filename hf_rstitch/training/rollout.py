"""Rollouts for router training: one batched stitched ``generate`` call per batch of groups.

Every prompt is repeated ``G`` times (left-padded to a common length), decoded with
``llm.generate(..., assistant_model=slm, stitch_policy=RouterPolicy(sample=True), do_sample=True)``
and each row becomes a :class:`Trajectory`: its graded answer, the latency the latency model
predicts for its trace (ms, not wall-clock), its LLM-token share and the router decisions it
took (states, actions, log-probabilities). Nothing here computes a loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..core.trace import StitchTrace
from ..eval.batched import left_pad  # noqa: F401  (re-exported: the rollouts' batch layout)
from ..router.policy import RouterPolicy, RowDecisions, assign_rows

Grader = Callable[[str, str], bool]  # (completion text, reference answer) -> correct


@dataclass
class Trajectory:
    group: int  # index of its prompt in the batch
    correct: bool
    latency_ms: float
    new_tokens: int
    llm_tokens: int
    decisions: RowDecisions
    text: str = ""


def default_grader(text: str, answer: str) -> bool:
    from ..eval.grading import grade

    return grade(text, str(answer)).correct


def encode_prompts(tokenizer: Any, problems: list[str], instruction: str = "") -> list[list[int]]:
    from ..eval.data import prompt_ids

    return [prompt_ids(tokenizer, p, instruction) for p in problems]


@torch.no_grad()
def rollout(llm, slm, tokenizer, router, prompts: list[list[int]], answers: list[str], *, group_size: int,
            threshold: float, latency_model, max_new_tokens: int, do_sample: bool = True, temperature: float = 1.0,
            top_p: float = 1.0, grader: Grader = default_grader,
            generator: torch.Generator | None = None) -> list[list[Trajectory]]:
    """Sample ``group_size`` routed trajectories for each prompt; returns one list per prompt.

    Args:
        prompts: token ids of each prompt (no padding); answers: their references.
        threshold: tau; the router is consulted on SLM steps above it.
        latency_model: :class:`~hf_rstitch.latency.LatencyModel` with ``slm`` and ``llm`` profiles.
        do_sample / temperature / top_p: token sampling (the router always samples).
    """
    rows = [p for p in prompts for _ in range(group_size)]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids, mask = left_pad(rows, pad)
    device = next(llm.parameters()).device
    policy = RouterPolicy(router, threshold, sample=True, generator=generator)
    gen: dict[str, Any] = {"do_sample": do_sample}
    gen.update(temperature=temperature, top_p=top_p, top_k=None) if do_sample else gen.update(
        temperature=None, top_p=None, top_k=None)
    out = llm.generate(ids.to(device), attention_mask=mask.to(device), assistant_model=slm, stitch_policy=policy,
                       max_new_tokens=max_new_tokens, pad_token_id=pad, return_dict_in_generate=True, **gen)
    traces: list[StitchTrace] = out.stitch_traces
    decisions = assign_rows(policy.consults, traces)
    new = out.sequences[:, ids.shape[1]:].cpu()
    groups: list[list[Trajectory]] = [[] for _ in prompts]
    for r, (trace, dec) in enumerate(zip(traces, decisions)):
        text = tokenizer.decode(new[r, : trace.n_tokens], skip_special_tokens=True)
        g = r // group_size
        groups[g].append(Trajectory(g, bool(grader(text, answers[g])), latency_model.predict_trace(trace),
                                    trace.n_tokens, trace.llm_tokens, dec, text))
    return groups
