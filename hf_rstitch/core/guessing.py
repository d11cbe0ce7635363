"""When the ``generate`` loop guesses a step before its routing decision reaches the host, left to itself.

Pure decision logic, no tensors. With a policy that decides on the device, the loop may queue a lane's next step
as if the model that just ran keeps control, and roll it back when the decision says otherwise
(:mod:`hf_rstitch.decode.loop`). Tokens do not change either way, only time: a guess that fails costs the device
one step of the lane that guessed; not guessing costs it the gap while the host reads the decision and queues the
next step. So a guess pays while ``miss rate x lane step < gap``:

* the SLM's (it guesses that no row is handed over): ``miss`` = some row was handed over at a step every row was the
  SLM's; with a ~0.75 ms small-model step and a ~0.05-0.1 ms gap (issue 50's H200 measurements of the read-back:
  +6.5 % a token for the entropy rule, +13 % for the router, at B = 1), it pays below about one miss in ten;
* the LLM's (it guesses that it keeps at least one row): ``miss`` = it handed every row back; a 7-8B step of ~4 ms
  pays only below about one miss in fifty, i.e. LLM stretches of fifty tokens and more.

:class:`GuessGate` tracks each rate as a running average of the steps whose decision it saw (whether or not the
loop guessed there) and answers whether to guess the next one. The bounds are those estimates, not measured per
pair: ``FastConfig(ahead_of_decisions=True)`` guesses always, ``False`` never.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .roles import Role

# the miss rate below which a lane's guess pays (see the module docstring)
BOUNDS = {Role.SLM: 0.1, Role.LLM: 0.02}
WEIGHT = 1 / 8  # weight of the latest step in the running average: about the last eight decisions


@dataclass
class GuessGate:
    """Per role, the running share of decisions that went against a guess; :meth:`pays` while it is below its bound."""

    bounds: dict = field(default_factory=lambda: dict(BOUNDS))
    misses: dict = field(default_factory=lambda: {Role.SLM: 0.0, Role.LLM: 0.0})

    def pays(self, role: Role) -> bool:
        """Whether guessing ``role``'s next step pays, from the decisions seen so far (none: it does)."""
        return self.misses[role] < self.bounds[role]

    def saw(self, role: Role, missed: bool) -> None:
        """One decision of ``role`` read: ``missed``, it went against the guess (whether or not one was made)."""
        self.misses[role] += WEIGHT * (float(missed) - self.misses[role])
