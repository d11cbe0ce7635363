"""LatencyModel: Eq. 4 fit, trace prediction, JSON round trip and error messages (hand values)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hf_rstitch.core.roles import Role
from hf_rstitch.core.trace import CallKind, ForwardCall, StitchTrace
from hf_rstitch.latency import Coefficients, LatencyModel, LatencyProfileError, ModelProfile, fit, fit_decode
from hf_rstitch.latency.model import grid_is_fittable

TRUE = dict(a=2.7e-5, b=3.1e-5, c=0.045, d=27.0)  # ms; same scale as the paper's 7B row
N_INF = [1, 4, 16, 64, 256, 1024, 2048]
N_KV = [0, 512, 1024, 2048, 4096, 8192]


def eq4(n_inf, n_kv, a, b, c, d):
    return a * n_inf * n_kv + b * n_inf**2 + c * n_inf + d


def synthetic(noise: float = 0.0, seed: int = 0, **coef):
    coef = coef or TRUE
    rng = np.random.default_rng(seed)
    return [(i, k, eq4(i, k, **coef) * (1 + noise * rng.standard_normal())) for i in N_INF for k in N_KV]


def profile(coef=TRUE, **model) -> ModelProfile:
    facts = {"name": "m", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 100, **model}
    return ModelProfile(fit=Coefficients(**coef), model=facts)


# ---- fitting ---------------------------------------------------------------------------------
def test_fit_recovers_exact_coefficients():
    c = fit(synthetic())
    for k, v in TRUE.items():
        assert getattr(c, k) == pytest.approx(v, rel=1e-6)
    assert c.r2 == pytest.approx(1.0) and c.n_points == len(N_INF) * len(N_KV)


@pytest.mark.parametrize("relative", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_fit_recovers_coefficients_under_noise(relative, seed):
    c = fit(synthetic(noise=0.01, seed=seed), relative=relative)  # 1 % multiplicative noise
    assert c.a == pytest.approx(TRUE["a"], rel=0.05)
    assert c.b == pytest.approx(TRUE["b"], rel=0.1)  # b and c trade off against each other
    assert c.c == pytest.approx(TRUE["c"], rel=0.15)
    assert c.d == pytest.approx(TRUE["d"], rel=0.02)
    assert c.r2 > 0.99
    for i in N_INF:  # and the surface itself is within the noise
        assert c(i, 4096) == pytest.approx(eq4(i, 4096, **TRUE), rel=0.02)


def test_decode_fit_is_eq4_at_one_token():
    # Eq. 4 at N_inf = 1 is a*N_kv + (b + c + d), not the paper's Eq. 5 (c*N_kv + d)
    c = fit_decode(synthetic())
    assert c.a == pytest.approx(TRUE["a"], rel=1e-6)
    assert c.d == pytest.approx(TRUE["b"] + TRUE["c"] + TRUE["d"], rel=1e-9)
    assert (c.b, c.c, c.n_points) == (0.0, 0.0, len(N_KV))


def test_grid_is_fittable():
    assert grid_is_fittable(N_INF, N_KV)
    assert not grid_is_fittable([1], N_KV)  # decode only: b, c, d collapse into one intercept
    assert not grid_is_fittable([1, 2, 4], [0])  # no N_kv variation: a is undetermined
    assert not grid_is_fittable([1, 2], [0, 8])  # two N_inf values cannot separate b from c


# ---- prediction --------------------------------------------------------------------------------
def test_predict_call_by_hand():
    lm = LatencyModel({"llm": profile(dict(a=1e-3, b=2e-3, c=0.5, d=10.0))})
    # 1e-3*8*100 + 2e-3*64 + 0.5*8 + 10 = 0.8 + 0.128 + 4 + 10
    assert lm.predict_call(8, 100) == pytest.approx(14.928)
    assert lm.predict_call(8, 100, role=Role.LLM) == pytest.approx(14.928)


def _two_role_model(decode_fit: bool = False) -> LatencyModel:
    slm = profile(dict(a=0.0, b=0.0, c=1.0, d=2.0))
    llm = profile(dict(a=0.01, b=0.0, c=0.0, d=5.0))
    llm.decode_fit = Coefficients(a=0.02, b=0.0, c=0.0, d=4.0)
    return LatencyModel({"slm": slm, "llm": llm}, decode_fit=decode_fit)


CALLS = [("slm", 10, 0), ("slm", 1, 10), ("llm", 12, 0), ("llm", 1, 12), ("slm", 2, 11)]
# slm: 10+2=12, 1+2=3, 2+2=4 ; llm: 0.01*12*0+5=5, 0.01*1*12+5=5.12
BY_HAND = 12 + 3 + 5 + 5.12 + 4
BY_HAND_DECODE_FIT = 12 + 3 + 5 + (0.02 * 12 + 4) + 4


def _trace() -> StitchTrace:
    kinds = [CallKind.PREFILL, CallKind.DECODE, CallKind.PREFILL, CallKind.DECODE, CallKind.RESUME]
    return StitchTrace(calls=[ForwardCall(Role(r), k, i, kv, 0.001) for (r, i, kv), k in zip(CALLS, kinds)])


@pytest.mark.parametrize("form", ["trace", "dict", "json", "tuples", "roles"])
def test_predict_trace_sums_every_call(form):
    trace = {"trace": _trace(), "dict": _trace().to_dict(), "json": json.loads(json.dumps(_trace().to_dict())),
             "tuples": CALLS, "roles": [(Role(r), i, kv) for r, i, kv in CALLS]}[form]
    lm = _two_role_model()
    assert lm.predict_trace(trace) == pytest.approx(BY_HAND)
    assert lm.predict_calls(trace) == pytest.approx([12, 3, 5, 5.12, 4])


def test_predict_trace_with_decode_fit():
    assert _two_role_model(decode_fit=True).predict_trace(CALLS) == pytest.approx(BY_HAND_DECODE_FIT)


def test_empty_trace_costs_nothing():
    assert _two_role_model().predict_trace(StitchTrace()) == 0.0


# ---- JSON ------------------------------------------------------------------------------------
def test_json_round_trip(tmp_path):
    lm = _two_role_model(decode_fit=True)
    lm.profiles["slm"].grid = [{"n_inf": 1, "n_kv": 0, "median_ms": 3.0, "samples_ms": [3.0]}]
    lm.profiles["slm"].meta = {"device": "cpu", "dtype": "float32"}
    path = tmp_path / "lm.json"
    lm.save(path)
    back = LatencyModel.load(path)
    assert back.to_dict() == lm.to_dict()
    assert back.predict_trace(CALLS) == pytest.approx(BY_HAND_DECODE_FIT)
    one = tmp_path / "slm.json"
    one.write_text(json.dumps(lm.profiles["slm"].to_dict()))
    assert LatencyModel.from_profiles(slm=one).profiles["slm"].to_dict() == lm.profiles["slm"].to_dict()


def test_shipped_profiles_load():
    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    files = sorted(results.glob("latency_qwen2_*.json"))
    if len(files) < 2:
        pytest.skip("no measured profiles in benchmarks/results")
    lm = LatencyModel.from_profiles(slm=results / "latency_qwen2_1.5b.json", llm=results / "latency_qwen2_7b.json")
    assert lm.predict_call(1, 1024, role="llm") > 0
    lm.check_models(slm={"hidden_size": 1536, "num_hidden_layers": 28, "vocab_size": 151936},
                    llm={"hidden_size": 3584, "num_hidden_layers": 28, "vocab_size": 152064})


def test_model_module_imports_without_torch():
    path = Path(__file__).resolve().parents[2] / "hf_rstitch" / "latency" / "model.py"
    code = ("import sys, importlib.util; sys.modules['torch'] = None; "
            f"s = importlib.util.spec_from_file_location('m', {str(path)!r}); m = importlib.util.module_from_spec(s); "
            "sys.modules['m'] = m; s.loader.exec_module(m); print(m.fit([(1,0,1),(2,0,2),(4,8,5),(8,8,9),(1,8,1.5)]).d)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


# ---- bad inputs ------------------------------------------------------------------------------
def test_empty_grid():
    with pytest.raises(LatencyProfileError, match="empty grid"):
        fit([])


@pytest.mark.parametrize("points", [
    [(1, 0, 1.0), (1, 512, 2.0), (1, 1024, 3.0), (1, 2048, 4.0)],  # decode only
    [(1, 0, 1.0), (4, 0, 2.0), (16, 0, 3.0)],  # three points
    [(1, 0, 1.0)] * 10,  # many repeats of one cell
])
def test_too_few_distinct_points(points):
    with pytest.raises(LatencyProfileError, match="too few distinct points"):
        fit(points)


def test_decode_fit_needs_two_cache_sizes():
    with pytest.raises(LatencyProfileError, match="N_inf = 1"):
        fit_decode([(1, 0, 1.0), (4, 0, 2.0), (4, 8, 3.0)])


@pytest.mark.parametrize("points,match", [
    ([(1, 0, float("nan"))] * 5, "NaN"),
    ([(0, 0, 1.0)] * 5, "n_inf >= 1"),
    ([(1, 0)], "triples"),
    (["abc"], "triples"),
])
def test_malformed_points(points, match):
    with pytest.raises(LatencyProfileError, match=match):
        fit(points)


def test_mismatched_profile_and_model():
    p = profile(name="Qwen/Qwen2-7B", hidden_size=3584, vocab_size=152064, num_hidden_layers=28)
    lm = LatencyModel({"llm": p})
    good = {"_name_or_path": "Qwen/Qwen2-7B", "hidden_size": 3584, "vocab_size": 152064, "num_hidden_layers": 28}
    lm.check_models(llm=good)
    with pytest.raises(LatencyProfileError, match="hidden_size: profile 3584 vs model 1536"):
        lm.check_models(llm={**good, "hidden_size": 1536})
    with pytest.raises(LatencyProfileError, match="vocab_size"):
        lm.check_models(llm={**good, "vocab_size": 151936})
    with pytest.raises(LatencyProfileError, match="name"):
        lm.check_models(llm={**good, "_name_or_path": "other/model"})
    lm.check_models(llm={**good, "_name_or_path": "other/model"}, check_name=False)

    class Cfg:  # attribute-style configs (transformers) work too
        hidden_size, vocab_size, num_hidden_layers, _name_or_path = 3584, 152064, 14, ""

    with pytest.raises(LatencyProfileError, match="num_hidden_layers"):
        lm.check_models(llm=Cfg())


def test_malformed_json(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"fit": {"a": 1, ')
    with pytest.raises(LatencyProfileError, match="not valid JSON.*line 1"):
        LatencyModel.from_profiles(llm=bad)
    with pytest.raises(LatencyProfileError, match="not valid JSON"):
        LatencyModel.load(bad)
    with pytest.raises(LatencyProfileError, match="cannot read"):
        LatencyModel.load(tmp_path / "missing.json")


@pytest.mark.parametrize("data,match", [
    ({"model": {}}, "no 'fit'"),
    ({"fit": {"a": 1, "b": 2, "c": 3}}, r"missing coefficient\(s\) \['d'\]"),
    ({"fit": {"a": "x", "b": 2, "c": 3, "d": 4}}, "must be numbers"),
    ({"fit": {"a": 1, "b": 2, "c": 3, "d": 4}, "unit": "s"}, "milliseconds"),
    ({"fit": {"a": 1, "b": 2, "c": 3, "d": 4}, "format": "other/9"}, "unknown format"),
    ([1, 2], "expected a JSON object"),
])
def test_malformed_profile(data, match):
    with pytest.raises(LatencyProfileError, match=match):
        LatencyModel.from_profiles(llm=data)


def test_combined_file_without_roles(tmp_path):
    path = tmp_path / "single.json"
    path.write_text(json.dumps(profile().to_dict()))
    with pytest.raises(LatencyProfileError, match="from_profiles"):
        LatencyModel.load(path)


def test_missing_role():
    lm = LatencyModel.from_profiles(llm=profile())
    with pytest.raises(LatencyProfileError, match="no latency profile for role 'slm'"):
        lm.predict_trace(CALLS)
    with pytest.raises(LatencyProfileError, match="at least one role"):
        LatencyModel({})


@pytest.mark.parametrize("trace,match", [
    ([("xlm", 1, 0)], "unknown role"),
    ([("slm", 1)], "is not \\(role, n_inf, n_kv\\)"),
    ([{"role": "slm", "n_inf": 1}], "is not \\(role, n_inf, n_kv\\)"),
    ([("slm", 0, 0)], "n_inf >= 1"),
    ({"no_calls": []}, "no 'calls'"),
])
def test_bad_trace(trace, match):
    with pytest.raises(LatencyProfileError, match=match):
        _two_role_model().predict_trace(trace)


def test_predict_call_needs_role_with_two_profiles():
    with pytest.raises(LatencyProfileError, match="needs role"):
        _two_role_model().predict_call(1, 0)
    assert math.isfinite(_two_role_model().predict_call(1, 0, "slm"))
