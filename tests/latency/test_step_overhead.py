import pytest

from hf_rstitch.core.roles import Role
from hf_rstitch.core.trace import CallKind, ForwardCall, StitchTrace
from hf_rstitch.latency import LatencyModel, LatencyProfileError, calibrate_step_ms


def test_calibration_recovers_a_known_per_token_overhead():
    forward = [100.0, 250.0, 40.0]
    tokens = [10, 30, 4]
    wall = [f + 0.5 * n for f, n in zip(forward, tokens)]
    assert calibrate_step_ms(forward, wall, tokens) == pytest.approx(0.5)
    assert calibrate_step_ms([10.0], [5.0], [3]) == 0.0  # never negative


def test_calibration_rejects_bad_input():
    with pytest.raises(LatencyProfileError, match="equally long"):
        calibrate_step_ms([1.0], [1.0, 2.0], [1])
    with pytest.raises(LatencyProfileError, match="new tokens"):
        calibrate_step_ms([1.0], [2.0], [0])


def test_step_ms_adds_per_token_and_round_trips(tmp_path):
    import json
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "latency_qwen2_1.5b.json"
    assert src.exists(), f"{src} is the measured profile this test reads; it is part of the repository"
    base = LatencyModel.from_profiles(slm=src)
    model = LatencyModel(base.profiles, step_ms=0.25)
    trace = StitchTrace(roles=[Role.SLM] * 4, calls=[ForwardCall(Role.SLM, CallKind.PREFILL, 8, 0)] +
                        [ForwardCall(Role.SLM, CallKind.DECODE, 1, 8 + i) for i in range(3)])
    assert model.predict_trace(trace) == pytest.approx(base.predict_trace(trace) + 1.0)
    assert model.predict_trace(trace.to_dict()) == pytest.approx(model.predict_trace(trace))
    assert model.predict_trace([(c.role, c.n_inf, c.n_kv) for c in trace.calls]) == base.predict_trace(trace)
    path = tmp_path / "lm.json"
    model.save(path)
    assert LatencyModel.load(path).step_ms == 0.25 and json.loads(path.read_text())["step_ms"] == 0.25
    with pytest.raises(LatencyProfileError, match="step_ms"):
        LatencyModel(base.profiles, step_ms=-1.0)
