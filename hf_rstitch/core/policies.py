"""Routing policies: who decodes the next position.

A policy is asked twice per stitched step at most, always with tensors over the batch:

* after an SLM forward -- :meth:`RoutingPolicy.hand_to_llm`: ``True`` discards the SLM's
  proposal and lets the LLM decode the same position;
* after an LLM forward (its token is always kept) -- :meth:`RoutingPolicy.hand_to_slm`:
  ``True`` gives control back to the SLM for the next position.

Adding a routing scheme means adding a class here (or anywhere) with these two methods;
the decode loop never changes. This is where every switch decision is made.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import torch

from .roles import Role


@dataclass(frozen=True)
class StepView:
    """What a policy may look at for one decision.

    Attributes:
        index: position of the token being decided among the new tokens (0-based).
        entropy: ``[B]`` normalized entropy of the model that just ran.
        hidden: ``[B, D]`` last hidden state of that model at this position, only when the
            policy sets ``needs_hidden``; else ``None``.
        rows: ``[B]`` long (CPU), the caller's row index of each row here. Rows that finish
            leave the batch, so row ``i`` of these tensors is caller row ``rows[i]``.
            ``None`` means ``arange(B)``.
        logits: ``[B, V]`` raw next-token logits of the model that just ran (every row is up to
            date in every lane call, so every row's are meaningful); ``None`` where a caller has none.
        tokens: ``[B, T]`` the sequence the position is decoded after (prompt and new tokens,
            left-padded), on the models' device; ``None`` where a caller has none.
    """

    index: int
    entropy: torch.Tensor
    hidden: torch.Tensor | None = None
    rows: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    tokens: torch.Tensor | None = None

    def row_ids(self) -> torch.Tensor:
        return self.rows if self.rows is not None else torch.arange(self.entropy.shape[0])


@runtime_checkable
class RoutingPolicy(Protocol):
    """Interface shared by every routing scheme."""

    needs_hidden: bool

    def reset(self) -> None:
        """Called once before each generation (replay cursors, RNG state...)."""

    def hand_to_llm(self, step: StepView) -> torch.Tensor:
        """``[B]`` bool: discard the SLM's proposal and let the LLM decode this position."""

    def hand_to_slm(self, step: StepView) -> torch.Tensor:
        """``[B]`` bool: after this kept LLM token, the SLM decodes the next position."""


def check_threshold(tau: float, name: str = "stitch_threshold") -> float:
    """Validate a normalized-entropy threshold and return it as a float (a Python, numpy or
    one-element tensor number is accepted)."""
    if getattr(tau, "shape", None) is not None and getattr(tau, "ndim", 0) == 0 and hasattr(tau, "item"):
        tau = tau.item()  # numpy scalar or 0-d array / tensor
    if isinstance(tau, bool) or not isinstance(tau, numbers.Real):
        raise TypeError(
            f"`{name}` must be a number in [0, 1] (normalized entropy), got {type(tau).__name__} {tau!r}. "
            "Typical values are 0.001 - 0.05, e.g. stitch_threshold=0.02."
        )
    tau = float(tau)
    if not math.isfinite(tau) or not 0.0 <= tau <= 1.0:
        raise ValueError(
            f"`{name}` must be a finite number in [0, 1] (normalized entropy), got {tau!r}. "
            "0 sends every uncertain step to the LLM, 1 keeps the SLM throughout; typical values are 0.001 - 0.05."
        )
    return tau


class EntropyPolicy:
    """R-Stitch (Algorithm 1): SLM -> LLM when H_slm > tau; LLM -> SLM when H_llm <= tau."""

    needs_hidden = False

    def __init__(self, threshold: float):
        self.threshold = check_threshold(threshold)

    def reset(self) -> None:
        pass

    def hand_to_llm(self, step: StepView) -> torch.Tensor:
        return step.entropy > self.threshold

    def hand_to_slm(self, step: StepView) -> torch.Tensor:
        return step.entropy <= self.threshold

    def __repr__(self) -> str:
        return f"EntropyPolicy(threshold={self.threshold})"


class RandomPolicy:
    """Random routing baseline: each SLM step goes to the LLM with probability ``p``.

    The LLM gives control back by the entropy rule with ``return_threshold``; the default 1.0
    returns after every LLM token, so the LLM decodes only the positions the coin picked.
    """

    needs_hidden = False

    def __init__(self, p: float, return_threshold: float = 1.0, seed: int = 0):
        self.p = check_threshold(p, name="p")
        self.return_threshold = check_threshold(return_threshold, name="return_threshold")
        self.seed = seed
        self._gen = torch.Generator()

    def reset(self) -> None:
        self._gen.manual_seed(self.seed)

    def hand_to_llm(self, step: StepView) -> torch.Tensor:
        draw = torch.rand(step.entropy.shape, generator=self._gen)
        return draw < self.p  # on the host: the loop reads decisions there

    def hand_to_slm(self, step: StepView) -> torch.Tensor:
        return step.entropy <= self.return_threshold

    def __repr__(self) -> str:
        return f"RandomPolicy(p={self.p}, return_threshold={self.return_threshold}, seed={self.seed})"


class ReplayPolicy:
    """Replays recorded routes: ``route[i]`` is the model that must emit new token ``i``.

    Give one route for every row, or a list of routes (one per row of the batch). Used to
    measure speed on random-weight models, whose entropies are meaningless. Past the end of a
    route its last entry repeats.

    Decisions come back on the host, so a loop never waits for the device to read them. With
    ``device`` they come back on that device instead, as an entropy policy's do on a GPU: the same
    routes at the cost of the real thing's device-to-host reads.
    """

    needs_hidden = False

    def __init__(self, route: Sequence[Role | str] | Sequence[Sequence[Role | str]], device=None):
        routes = [route] if len(route) == 0 or isinstance(route[0], (str, Role)) else list(route)
        if not routes or any(len(r) == 0 for r in routes):
            raise ValueError("ReplayPolicy needs non-empty routes (lists of 'slm'/'llm', one entry per new token).")
        try:
            self.routes = [[Role(x) for x in r] for r in routes]
        except ValueError as err:
            raise ValueError(f"ReplayPolicy route entries must be 'slm' or 'llm': {err}") from None
        self.route = self.routes[0]
        width = max(len(r) for r in self.routes)
        table = torch.tensor([[x is Role.LLM for x in r] + [r[-1] is Role.LLM] * (width - len(r)) for r in self.routes])
        self._llm = table  # [R, N] bool: row r's token i is the LLM's
        self._on_device = table.to(device) if device is not None else None
        self._share = float(table.float().mean())  # for repr, which each request's trace takes: once, not per request

    def reset(self) -> None:
        pass

    def _llm_at(self, step: StepView, index: int) -> torch.Tensor:
        rows = step.row_ids() if len(self.routes) > 1 else torch.zeros(step.entropy.shape[0], dtype=torch.long)
        if int(rows.max()) >= len(self.routes):
            raise ValueError(f"ReplayPolicy has {len(self.routes)} routes but the batch has row {int(rows.max())}.")
        col = min(index, self._llm.shape[1] - 1)
        if self._on_device is None:
            return self._llm[rows, col]  # on the host: no device round trip
        n = len(rows)
        if len(self.routes) == 1:
            return self._on_device[0, col].expand(n)
        if rows.tolist() == list(range(n)):  # rows in order: no copy of the row ids to the device
            return self._on_device[:n, col]
        return self._on_device[rows.to(self._on_device.device, non_blocking=True), col]  # a blocking copy would
        # wait for every kernel queued (a lane call run ahead)

    def hand_to_llm(self, step: StepView) -> torch.Tensor:
        return self._llm_at(step, step.index)

    def hand_to_slm(self, step: StepView) -> torch.Tensor:
        return ~self._llm_at(step, step.index + 1)

    def __repr__(self) -> str:
        return f"ReplayPolicy(routes={len(self.routes)}, len={self._llm.shape[1]}, llm_share={self._share:.2f})"


class RowEntropyPolicy:
    """R-Stitch with one threshold per row id (``StepView.rows``): requests of a served batch
    each bring their own tau. ``thresholds[row_id]`` must be set before the row's first step."""

    needs_hidden = False

    def __init__(self):
        self.thresholds: dict[int, float] = {}
        self._tensors: dict = {}  # the rows' taus as device tensors (see _on_device)

    def reset(self) -> None:
        pass

    def _tau(self, step: StepView) -> torch.Tensor:
        taus = tuple(self.thresholds[r] for r in step.row_ids().tolist())
        return _on_device(self._tensors, taus, step.entropy.dtype, step.entropy.device)

    def hand_to_llm(self, step: StepView) -> torch.Tensor:
        return step.entropy > self._tau(step)

    def hand_to_slm(self, step: StepView) -> torch.Tensor:
        return step.entropy <= self._tau(step)

    def __repr__(self) -> str:
        return "RowEntropyPolicy()"


class PinnedRoles:
    """Wraps a policy; rows pinned to one model never leave it (``pins[row_id]``), e.g. an
    LLM-only or SLM-only request served next to stitched ones. A row pinned to the LLM must
    start under its control (the caller sets that); one pinned to the SLM is never handed over."""

    def __init__(self, base: RoutingPolicy):
        self.base = base
        self.pins: dict[int, Role] = {}
        self._tensors: dict = {}

    @property
    def needs_hidden(self) -> bool:
        return self.base.needs_hidden

    def reset(self) -> None:
        self.base.reset()

    def start_rows(self, rows) -> None:
        """Rows joining a running batch: passed on to the base policy if it keeps per-row state."""
        start = getattr(self.base, "start_rows", None)
        if start is not None:
            start(rows)

    def holds(self, role: Role) -> bool:
        """Whether some row is pinned to ``role``: that model keeps a row whatever it decides."""
        return role in self.pins.values()

    def _free(self, step: StepView, role: Role, device) -> torch.Tensor:
        """``[B]`` bool: rows not pinned to ``role``."""
        free = tuple(self.pins.get(r) is not role for r in step.row_ids().tolist())
        return _on_device(self._tensors, free, torch.bool, device)

    def hand_to_llm(self, step: StepView) -> torch.Tensor:
        decision = self.base.hand_to_llm(step)
        return decision & self._free(step, Role.SLM, decision.device) if self.pins else decision

    def hand_to_slm(self, step: StepView) -> torch.Tensor:
        decision = self.base.hand_to_slm(step)
        return decision & self._free(step, Role.LLM, decision.device) if self.pins else decision

    def __repr__(self) -> str:
        return f"PinnedRoles({self.base!r})"


def as_decisions(value, step: StepView, owner: object, method: str) -> torch.Tensor:
    """A policy's answer as the ``[B]`` bool tensor the loop expects.

    Bool tensors pass as they are; a list, array or number tensor holding only 0 / 1 is
    converted; anything else (scores, probabilities, a wrong shape) raises an error that says
    what came back and what to return instead."""
    n = int(step.entropy.shape[0])
    where = f"{type(owner).__name__}.{method}"
    if not isinstance(value, torch.Tensor):
        try:
            value = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"{where} must return a [{n}] bool tensor (True = hand over), got "
                            f"{type(value).__name__} {value!r}.") from None
    if tuple(value.shape) != (n,):
        raise ValueError(f"{where} returned shape {tuple(value.shape)}; expected [{n}], one decision per row of the "
                         "batch (StepView.entropy has that shape).")
    if value.dtype == torch.bool:
        return value
    if not value.is_complex() and bool(((value == 0) | (value == 1)).all()):
        return value != 0
    raise TypeError(f"{where} must return a [{n}] bool tensor (True = hand over), got {value.dtype} values "
                    f"{value[:4].tolist()}. Compare scores with a cut-off, e.g. `return probs > 0.5`.")


class CheckedPolicy:
    """Wraps a policy from outside hf_rstitch: its decisions go through :func:`as_decisions`.
    Every other attribute is the wrapped policy's."""

    def __init__(self, policy: RoutingPolicy):
        self.policy = policy

    def __getattr__(self, name: str):
        return getattr(self.policy, name)

    @property
    def needs_hidden(self) -> bool:
        return bool(self.policy.needs_hidden)

    def reset(self) -> None:
        self.policy.reset()

    def hand_to_llm(self, step: StepView) -> torch.Tensor:
        return as_decisions(self.policy.hand_to_llm(step), step, self.policy, "hand_to_llm")

    def hand_to_slm(self, step: StepView) -> torch.Tensor:
        return as_decisions(self.policy.hand_to_slm(step), step, self.policy, "hand_to_slm")

    def __repr__(self) -> str:
        return repr(self.policy)


def checked(policy: RoutingPolicy) -> RoutingPolicy:
    """``policy`` itself if hf_rstitch defines its class, else wrapped in :class:`CheckedPolicy`."""
    return policy if type(policy).__module__.startswith("hf_rstitch.") else CheckedPolicy(policy)


def _on_device(cache: dict, values: tuple, dtype: torch.dtype, device) -> torch.Tensor:
    """``values`` as a tensor on ``device``, reused while they stay the same: a served batch's rows
    change only when requests join or leave, so most steps copy nothing to the device."""
    key = (values, dtype, device)
    if key not in cache:
        if len(cache) > 8:
            cache.clear()
        cache[key] = torch.tensor(values, dtype=dtype).to(device, non_blocking=True)  # queued: no wait for the device
    return cache[key]
