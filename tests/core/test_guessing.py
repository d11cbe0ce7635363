"""When the generate loop guesses a step before its decision reaches the host (hf_rstitch.core.guessing)."""

import pytest

from hf_rstitch.core.guessing import GuessGate
from hf_rstitch.core.roles import Role


def test_gate_guesses_while_misses_stay_rare():
    """Hand values: the running share of misses (weight 1/8) against the bounds (SLM 0.1, LLM 0.02)."""
    gate = GuessGate()
    assert gate.pays(Role.SLM) and gate.pays(Role.LLM)  # nothing seen: guess
    gate.saw(Role.SLM, False)
    assert gate.pays(Role.SLM)
    gate.saw(Role.SLM, True)  # 0.125
    assert gate.misses[Role.SLM] == pytest.approx(0.125) and not gate.pays(Role.SLM)
    for _ in range(2):
        gate.saw(Role.SLM, False)  # 0.125 * (7/8)^2 = 0.0957
    assert gate.misses[Role.SLM] == pytest.approx(0.125 * 49 / 64) and gate.pays(Role.SLM)
    gate.saw(Role.LLM, True)
    assert not gate.pays(Role.LLM) and gate.pays(Role.SLM)
