"""Profiler and ``rstitch profile`` on a tiny random Llama on CPU (structure only, no timing asserts)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from hf_rstitch.cli.main import main
from hf_rstitch.cli.profile import ProfileConfig
from hf_rstitch.latency import LatencyModel, LatencyProfileError
from hf_rstitch.latency.model import fit
from hf_rstitch.latency.profiler import _prefill, profile_model, time_cell

N_INF, N_KV = [1, 2, 8], [0, 4, 16]


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2)
    return LlamaForCausalLM(cfg).eval()


def test_time_cell_keeps_cache_size():
    model = tiny_llama()
    with torch.inference_mode():
        cache = _prefill(model, 12, 64, torch.device("cpu"), 1, chunk=5)  # chunked prefill: 5 + 5 + 2
        assert isinstance(cache, DynamicCache) and cache.get_seq_length() == 12
        samples = time_cell(model, cache, 3, 64, torch.device("cpu"), repeats=2, warmup=1)
    assert len(samples) == 2 and all(s > 0 for s in samples)
    assert cache.get_seq_length() == 12  # cropped back after every timed call


def test_profile_tiny_llama_writes_valid_profile(tmp_path):
    seen = []
    prof = profile_model(tiny_llama(), n_inf=N_INF, n_kv=N_KV, repeats=2, warmup=1, name="tiny-llama",
                         progress=lambda *a: seen.append(a))
    assert len(seen) == len(prof.grid) == len(N_INF) * len(N_KV)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof.to_dict()))
    d = json.loads(path.read_text())
    assert set("abcd") <= set(d["fit"]) and d["fit"]["n_points"] == 9 and d["decode_fit"]["n_points"] == 3
    assert d["model"]["name"] == "tiny-llama" and d["model"]["hidden_size"] == 32 and d["model"]["vocab_size"] == 64
    assert d["model"]["num_hidden_layers"] == 2
    for key in ("device", "dtype", "torch", "transformers", "date", "timing"):
        assert d[key]
    assert {(g["n_inf"], g["n_kv"]) for g in d["grid"]} == {(i, k) for i in N_INF for k in N_KV}
    assert all(len(g["samples_ms"]) == 2 and g["median_ms"] > 0 for g in d["grid"])
    lm = LatencyModel.from_profiles(llm=path)
    lm.check_models(llm=tiny_llama().config, check_name=False)
    assert lm.predict_call(4, 8, "llm") == pytest.approx(prof.fit(4, 8))


def test_profile_rejects_unfittable_grid():
    with pytest.raises(LatencyProfileError, match="cannot determine"):
        profile_model(tiny_llama(), n_inf=[1], n_kv=[0, 4], progress=False)
    with pytest.raises(LatencyProfileError, match="empty grid"):
        profile_model(tiny_llama(), n_inf=[], n_kv=[0, 4], progress=False)


def test_cli_profile(tmp_path, capsys):
    model_dir = tmp_path / "tiny"
    tiny_llama().save_pretrained(model_dir)
    out = tmp_path / "out.json"
    rc = main(["profile", "--model", str(model_dir), "--device", "cpu", "--dtype", "float32", "--out", str(out),
               "--n-inf", "1", "2", "8", "--n-kv", "0", "4", "16", "64", "--max-kv", "16", "--repeats", "1",
               "--warmup", "0"])
    assert rc == 0
    d = json.loads(out.read_text())
    assert sorted({g["n_kv"] for g in d["grid"]}) == [0, 4, 16]  # --max-kv trimmed 64
    assert d["dtype"] == "float32" and "Eq. 4 fit" in capsys.readouterr().out


def test_cli_profile_relative_fit(tmp_path):
    model_dir = tmp_path / "tiny"
    tiny_llama().save_pretrained(model_dir)
    out = tmp_path / "out.json"
    rc = main(["profile", "--model", str(model_dir), "--device", "cpu", "--dtype", "float32", "--out", str(out),
               "--n-inf", "1", "2", "8", "--n-kv", "0", "4", "16", "--repeats", "1", "--warmup", "0", "--relative-fit"])
    assert rc == 0
    d = json.loads(out.read_text())
    assert d["fit_residuals"].startswith("relative")
    points = [(g["n_inf"], g["n_kv"], g["median_ms"]) for g in d["grid"]]
    assert d["fit"]["a"] == pytest.approx(fit(points, relative=True).a)  # the weighted fit, not the plain one


@pytest.mark.parametrize("kwargs,match", [
    ({}, "exactly one of"),
    ({"model": "x", "random_qwen2": "7b"}, "exactly one of"),
    ({"model": "x", "n_inf": []}, "empty grid"),
    ({"model": "x", "n_inf": [0, 1, 2]}, ">= 1"),
    ({"model": "x", "n_inf": [1]}, "cannot determine"),
    ({"model": "x", "repeats": 0}, "--repeats"),
    ({"model": "x", "dtype": "int8"}, "--dtype"),
])
def test_profile_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ProfileConfig(**kwargs)


def test_cli_bad_config_exit_code(capsys):
    assert main(["profile", "--model", "x", "--n-inf", "1"]) == 2
    assert "cannot determine" in capsys.readouterr().err
