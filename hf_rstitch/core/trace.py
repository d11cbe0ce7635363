"""The decode trace: what happened during one stitched generation.

Every consumer (``out.stitch``, the latency model, RL rollouts, the evaluation harness, the
demo) reads this record instead of re-deriving it. It has two views:

* per emitted token -- which model wrote it, that model's entropy, and whether an SLM
  proposal was discarded (a hand-over) at that position;
* per forward call -- which model ran, how many tokens it processed (``n_inf``) and how many
  its cache held before the call (``n_kv``), the call kind and, when timing was asked for,
  its wall-clock seconds (device-synchronised).
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any

from .roles import Role


class CallKind(str, enum.Enum):
    PREFILL = "prefill"  # the lane's first call: the whole prompt
    RESUME = "resume"  # partial prefill: the other model wrote the latest token(s); read all unseen ones
    DECODE = "decode"  # this lane wrote the latest token; read just that one

    def __str__(self) -> str:
        return self.value


@dataclass
class ForwardCall:
    """One forward pass of one model."""

    role: Role
    kind: CallKind
    n_inf: int  # tokens processed in this call
    n_kv: int  # tokens in this model's cache before the call
    seconds: float | None = None


def solo_calls(role: Role, total: int, taking: list[bool], solo_seen: list[int], pad: list[int],
               resumed: list[bool], seconds: float | None = None) -> dict[int, ForwardCall]:
    """The one accounting of a lane call, shared by every engine: per taking-part row, the call a
    solo run of that row would make -- real tokens read (``n_inf``) and held before (``n_kv``).

    Rows share left-padded columns: row ``r`` has ``pad[r]`` padding columns, a solo lane would
    have read ``solo_seen[r]`` columns, and this call brings it to ``total``. Padding is on the
    left only, so the real tokens among columns ``[a, b)`` are ``b - max(a, pad)``. Plain Python
    over ints: a few rows, and each tensor op would cost more than the arithmetic.
    """
    calls = {}
    for r, (take, seen, p, back) in enumerate(zip(taking, solo_seen, pad, resumed)):
        if not take:
            continue
        kv = max(seen - p, 0)
        kind = CallKind.PREFILL if kv == 0 else (CallKind.RESUME if back else CallKind.DECODE)
        calls[r] = ForwardCall(role, kind, total - max(seen, p), kv, seconds)
    return calls


@dataclass
class StitchTrace:
    """Provenance of every new token plus every forward call (batch row 0 for B = 1)."""

    roles: list[Role] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    handovers: list[bool] = field(default_factory=list)  # SLM proposal discarded here
    slm_entropies: list[float | None] = field(default_factory=list)  # SLM's H where it was consulted
    calls: list[ForwardCall] = field(default_factory=list)
    threshold: float | None = None
    policy: str = ""
    drafted_tokens: int = 0  # SLM drafts the LLM verified (stitch_speculate; hf_rstitch.decode.speculate)
    accepted_drafts: int = 0  # of those, the drafts kept (the LLM's own token there)

    # ---- summaries -------------------------------------------------------------------------
    @property
    def n_tokens(self) -> int:
        return len(self.roles)

    def tokens(self, role: Role) -> int:
        return sum(r is role for r in self.roles)

    @property
    def llm_tokens(self) -> int:
        return self.tokens(Role.LLM)

    @property
    def slm_tokens(self) -> int:
        return self.tokens(Role.SLM)

    @property
    def switches(self) -> int:
        """Control transfers between consecutive emitted tokens (either direction)."""
        return sum(a is not b for a, b in zip(self.roles, self.roles[1:]))

    @property
    def discarded_slm_tokens(self) -> int:
        return sum(self.handovers)

    def processed_tokens(self, role: Role, kind: CallKind | None = None) -> int:
        """Tokens a model ran forward over, optionally only in calls of one kind."""
        return sum(c.n_inf for c in self.calls if c.role is role and (kind is None or c.kind is kind))

    def partial_prefill_tokens(self, role: Role) -> int:
        return self.processed_tokens(role, CallKind.RESUME)

    def forward_calls(self, role: Role) -> int:
        return sum(c.role is role for c in self.calls)

    def summary(self) -> dict[str, Any]:
        """Flat numbers for tables and JSON records."""
        out: dict[str, Any] = {
            "new_tokens": self.n_tokens,
            "llm_tokens": self.llm_tokens,
            "slm_tokens": self.slm_tokens,
            "switches": self.switches,
            "discarded_slm_tokens": self.discarded_slm_tokens,
        }
        for role in Role:
            out[f"{role}_forward_calls"] = self.forward_calls(role)
            out[f"{role}_prefill_tokens"] = self.processed_tokens(role, CallKind.PREFILL)
            out[f"{role}_partial_prefill_tokens"] = self.partial_prefill_tokens(role)
        if self.drafted_tokens:
            out["drafted_tokens"], out["accepted_drafts"] = self.drafted_tokens, self.accepted_drafts
        timed = [c.seconds for c in self.calls if c.seconds is not None]
        if timed:
            out["forward_seconds"] = sum(timed)
        return out

    # ---- (de)serialisation -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["roles"] = [str(r) for r in self.roles]
        d["calls"] = [{**asdict(c), "role": str(c.role), "kind": str(c.kind)} for c in self.calls]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StitchTrace":
        calls = [
            ForwardCall(Role(c["role"]), CallKind(c["kind"]), int(c["n_inf"]), int(c["n_kv"]), c.get("seconds"))
            for c in d.get("calls", [])
        ]
        return cls(
            roles=[Role(r) for r in d.get("roles", [])],
            entropies=list(d.get("entropies", [])),
            handovers=list(d.get("handovers", [])),
            slm_entropies=list(d.get("slm_entropies", [])),
            calls=calls,
            threshold=d.get("threshold"),
            policy=d.get("policy", ""),
            drafted_tokens=int(d.get("drafted_tokens", 0)),
            accepted_drafts=int(d.get("accepted_drafts", 0)),
        )

    def __repr__(self) -> str:
        return (
            f"StitchTrace(new_tokens={self.n_tokens}, llm={self.llm_tokens}, slm={self.slm_tokens}, "
            f"switches={self.switches}, calls={len(self.calls)}, policy={self.policy!r})"
        )
