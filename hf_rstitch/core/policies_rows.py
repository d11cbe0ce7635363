"""Routing policies by name, and one policy per row: how a served request brings its own routing rule.

* :func:`policy_from_spec` builds a policy from a name and its parameters (``{"name": "step", "threshold":
  0.3}``), the form an HTTP request carries (``rstitch serve``'s ``stitch_policy`` field). The names ``router``
  and ``r2r`` ask for the server's own router at the request's threshold (:class:`ServerRouter`), which the
  request engine resolves against the router it was built with (no weights travel with a request).
* :class:`RowPolicies` answers for a batch whose rows follow different policies: each row id may have its
  own; the others follow ``default``. Each policy sees the rows it routes, as a batch of their own
  (:meth:`StepView` sliced), so a policy with per-row state keeps it by the same row ids.
"""

from __future__ import annotations

from typing import Any

import torch

from .policies import EntropyPolicy, RandomPolicy, RoutingPolicy, StepView, check_threshold
from .policies_step import StepPolicy


class ServerRouter:
    """A request's ``{"name": "router" | "r2r", "threshold": t}``: the server's own router (R-Stitch+'s, or an R2R
    router: ``kind``) at this request's threshold. Not a policy yet: the request engine replaces it with its router
    policy's ``with_threshold(t)`` (:meth:`hf_rstitch.batching.requests.RequestEngine.submit`), and refuses it
    where the engine routes with no router of that kind."""

    needs_hidden = True

    def __init__(self, kind: str, threshold: float):
        self.kind, self.threshold = kind, check_threshold(threshold, f"stitch_policy {kind!r} threshold")

    def hand_to_llm(self, step: StepView) -> torch.Tensor:
        raise TypeError(f"{self!r} routes nothing itself: the request engine resolves it against its router")

    hand_to_slm = hand_to_llm

    def reset(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"ServerRouter({self.kind!r}, threshold={self.threshold})"

# name -> (class, the parameters it takes, the ones it needs)
POLICY_NAMES: dict[str, tuple[type, tuple[str, ...], tuple[str, ...]]] = {
    "rstitch": (EntropyPolicy, ("threshold",), ("threshold",)),
    "step": (StepPolicy, ("threshold", "delimiter"), ("threshold",)),
    "random": (RandomPolicy, ("p", "return_threshold", "seed"), ("p",)),
    "router": (ServerRouter, ("threshold",), ("threshold",)),  # the server's R-Stitch+ router (rstitch serve --router)
    "r2r": (ServerRouter, ("threshold",), ("threshold",)),  # the server's R2R router (--router an R2R checkpoint)
}


def policy_from_spec(spec: dict[str, Any], tokenizer=None) -> RoutingPolicy:
    """A policy from ``{"name": ..., **parameters}`` (:data:`POLICY_NAMES`); ``tokenizer`` for text delimiters."""
    spec = dict(spec)
    name = spec.pop("name", None)
    if name not in POLICY_NAMES:
        raise ValueError(f"unknown stitch_policy name {name!r}; expected one of {sorted(POLICY_NAMES)}, e.g. "
                         '{"name": "step", "threshold": 0.3}.')
    cls, known, needed = POLICY_NAMES[name]
    spec = {k: v for k, v in spec.items() if v is not None}
    unknown, missing = sorted(set(spec) - set(known)), [k for k in needed if k not in spec]
    if unknown or missing:
        raise ValueError(f"stitch_policy {name!r} takes {', '.join(known)} (needs {', '.join(needed)}); got "
                         f"unknown {unknown} and missing {missing}.")
    if cls is StepPolicy:
        return StepPolicy(spec["threshold"], spec.get("delimiter", "\n\n"), tokenizer)
    if cls is ServerRouter:
        return ServerRouter(name, spec["threshold"])
    return cls(**spec)


def _slice(step: StepView, at: torch.Tensor) -> StepView:
    """The view of the rows ``at`` (host long): every per-row tensor indexed on its own device."""
    pick = lambda t: None if t is None else t.index_select(0, at.to(t.device, non_blocking=True))  # noqa: E731
    return StepView(step.index, pick(step.entropy), pick(step.hidden), step.row_ids()[at], pick(step.logits),
                    pick(step.tokens))


class RowPolicies:
    """Per row id, the policy that routes it (``policies[row_id]``); rows without one follow ``default``."""

    def __init__(self, default: RoutingPolicy):
        self.default = default
        self.policies: dict[int, RoutingPolicy] = {}

    @property
    def needs_hidden(self) -> bool:
        return self.default.needs_hidden or any(p.needs_hidden for p in self.policies.values())

    def reset(self) -> None:
        self.default.reset()
        for p in self.policies.values():
            p.reset()

    def start_rows(self, rows) -> None:
        for p in {id(p): p for p in [self.default, *self.policies.values()]}.values():
            if hasattr(p, "start_rows"):
                p.start_rows(rows)

    def _ask(self, step: StepView, method: str) -> torch.Tensor:
        if not self.policies:  # every row follows the default: no per-row lookup on the step's path
            return getattr(self.default, method)(step)
        ids = step.row_ids().tolist()
        owners = [self.policies.get(r, self.default) for r in ids]
        if all(o is owners[0] for o in owners):  # one policy for the whole batch: no slicing
            return getattr(owners[0], method)(step)
        out = torch.zeros(len(ids), dtype=torch.bool)
        for policy in {id(o): o for o in owners}.values():
            at = torch.tensor([i for i, o in enumerate(owners) if o is policy], dtype=torch.long)
            out[at] = getattr(policy, method)(_slice(step, at)).cpu()
        return out

    def hand_to_llm(self, step: StepView) -> torch.Tensor:
        return self._ask(step, "hand_to_llm")

    def hand_to_slm(self, step: StepView) -> torch.Tensor:
        return self._ask(step, "hand_to_slm")

    def __repr__(self) -> str:
        return f"RowPolicies(default={self.default!r}, rows={len(self.policies)})"
