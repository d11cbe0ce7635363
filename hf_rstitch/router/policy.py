"""``RouterPolicy``: R-Stitch+ routing -- the entropy rule, with a learned router on uncertain SLM steps.

* After an SLM forward: rows whose SLM entropy is ``<= tau`` keep the SLM's token without
  asking the router; rows above ``tau`` are scored by the router, which keeps the SLM
  (``slm``) or hands the position to the LLM (``llm``) -- by argmax, or sampled when
  ``sample=True`` (RL rollouts).
* After an LLM forward: control returns to the SLM when the LLM's entropy is ``<= tau``
  (the R-Stitch rule; the router is not consulted on LLM steps).

In sampling mode every consultation is recorded (step index, the caller's rows, the hidden
states, the actions and their log-probabilities); :func:`assign_rows` matches them with the
decode traces and keeps only rows the SLM really controlled while they were still generating.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..core.policies import StepView, check_threshold
from .model import LLM_ACTION, Router


@dataclass
class Consult:
    """One router call during a generation (``n`` rows above the threshold)."""

    index: int  # step index (position among the new tokens)
    rows: torch.Tensor  # [n] the caller's row of each consulted row, CPU long
    hidden: torch.Tensor  # [n, D] SLM hidden states (router dtype, CPU)
    actions: torch.Tensor  # [n] 0 = slm, 1 = llm, CPU long
    logp: torch.Tensor  # [n] log pi_old(action | state), CPU float32


@dataclass
class RowDecisions:
    """The router decisions of one trajectory (one caller row), in step order."""

    steps: torch.Tensor  # [k] step indices
    hidden: torch.Tensor  # [k, D]
    actions: torch.Tensor  # [k]
    logp: torch.Tensor  # [k]

    def __len__(self) -> int:
        return int(self.actions.numel())


class RouterPolicy:
    """R-Stitch+ routing policy (implements :class:`~hf_rstitch.core.policies.RoutingPolicy`).

    Args:
        router: a :class:`~hf_rstitch.router.model.Router`.
        threshold: tau; the router is consulted only on SLM steps with entropy above it.
        sample: sample the router's decisions (and record them) instead of taking the argmax.
        generator: RNG for sampled decisions (on the router's device; default: torch's global RNG).
        record: record consultations also when not sampling (e.g. to count router calls).
    """

    needs_hidden = True

    def __init__(self, router: Router, threshold: float, sample: bool = False,
                 generator: torch.Generator | None = None, record: bool | None = None):
        self.router = router
        self.threshold = check_threshold(threshold)
        self.sample, self.generator = sample, generator
        self.record = sample if record is None else record
        self.consults: list[Consult] = []
        self.router_calls, self.router_seconds = 0, 0.0

    kind = "router"  # what a request names to route by this server's router (core.policies_rows.ServerRouter)

    def with_threshold(self, threshold: float) -> "RouterPolicy":
        """The same router (its weights shared) at another tau: a served request's own threshold."""
        return RouterPolicy(self.router, threshold, sample=self.sample, generator=self.generator, record=self.record)

    def reset(self) -> None:
        self.consults = []

    @torch.no_grad()
    def hand_to_llm(self, step: StepView) -> torch.Tensor:
        ask = step.entropy > self.threshold  # [B] low-entropy rows never reach the router
        out = torch.zeros_like(ask)
        if step.hidden is None:
            raise ValueError("RouterPolicy needs the SLM's hidden states (needs_hidden=True); "
                             "the decode loop passed none.")
        if not (self.sample or self.record or ask.device.type == "cpu"):  # on the host, reading `ask` costs nothing
            return self._on_device(step, ask)
        if not bool(ask.any()):
            return out
        start = time.perf_counter()
        hidden = step.hidden[ask].to(self.router.head.weight.device)
        logp = self.router.log_probs(hidden)  # [n, 2]
        if self.sample:
            actions = torch.multinomial(logp.exp(), 1, generator=self.generator).squeeze(1)
        else:
            actions = logp.argmax(dim=-1)
        self.router_calls += 1
        self.router_seconds += time.perf_counter() - start
        out[ask] = (actions == LLM_ACTION).to(out.device)
        if self.record:
            self.consults.append(Consult(
                step.index, step.row_ids()[ask.cpu()], hidden.detach().to("cpu", self.router.head.weight.dtype),
                actions.cpu(), logp.gather(1, actions[:, None]).squeeze(1).float().cpu()))
        return out

    def _on_device(self, step: StepView, ask: torch.Tensor) -> torch.Tensor:
        """The greedy decisions as device ops, nothing read back: the router scores every row and its vote counts
        where the entropy asked (a row's scores do not depend on the other rows), so the decode loop may learn
        the decisions a step late. ``router_calls`` then counts every SLM step."""
        start = time.perf_counter()
        logp = self.router.log_probs(step.hidden.to(self.router.head.weight.device))  # [B, 2]
        self.router_calls += 1
        self.router_seconds += time.perf_counter() - start
        return ask & (logp.argmax(dim=-1) == LLM_ACTION).to(ask.device)

    def hand_to_slm(self, step: StepView) -> torch.Tensor:
        return step.entropy <= self.threshold

    def __repr__(self) -> str:
        return f"RouterPolicy(threshold={self.threshold}, sample={self.sample}, hidden_size={self.router.hidden_size})"


def assign_rows(consults: list[Consult], traces: list) -> list[RowDecisions]:
    """Map recorded consultations to the caller's rows (one :class:`RowDecisions` per trace).

    Steps where the row was not under SLM control (no SLM entropy in its trace) or had already
    finished (no token there) are dropped; the kept decisions are checked against the trace's
    hand-over flags.
    """
    per_row: list[list[tuple[int, torch.Tensor, int, float]]] = [[] for _ in traces]
    for c in consults:
        for j, row in enumerate(c.rows.tolist()):
            trace = traces[row]
            if c.index >= trace.n_tokens or trace.slm_entropies[c.index] is None:  # finished, or the LLM's step
                continue
            action = int(c.actions[j])
            if trace.handovers[c.index] != (action == LLM_ACTION):
                raise RuntimeError(f"router decision at step {c.index} of row {row} disagrees with the trace; "
                                   "was the policy shared between two generate calls?")
            per_row[row].append((c.index, c.hidden[j], action, float(c.logp[j])))
    out = []
    dim = consults[0].hidden.shape[-1] if consults else 0
    for items in per_row:
        if items:
            steps, hidden, actions, logp = zip(*items)
            out.append(RowDecisions(torch.tensor(steps), torch.stack(hidden), torch.tensor(actions),
                                    torch.tensor(logp)))
        else:
            out.append(RowDecisions(torch.zeros(0, dtype=torch.long), torch.zeros(0, dim), torch.zeros(0, dtype=torch.long),
                                    torch.zeros(0)))
    return out


def policy_from_router(router, slm, threshold: float | None = None, flag: str = "stitch_router"):
    """``generate(stitch_router=...)`` glue: a greedy :class:`RouterPolicy` from a router object,
    local folder or Hub id, checked against ``slm``; ``threshold`` defaults to the router's own. ``flag`` names
    the argument in errors. An R2R router (:mod:`hf_rstitch.router.r2r`: its ``.pt`` file, a folder or Hub id
    of one) gives an :class:`~hf_rstitch.router.r2r.R2RPolicy`, ``threshold`` then being its probability cut-off."""
    from .model import load_router
    from .r2r import R2RPolicy, load_r2r

    r2r = load_r2r(router, slm, threshold)  # R2R's published format (thu-nics/R2R), else ours
    if r2r is not None:
        return R2RPolicy(r2r, threshold)
    router = load_router(router, slm=slm, flag=flag)
    return RouterPolicy(router, router.threshold if threshold is None else threshold)
