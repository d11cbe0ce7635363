"""``rstitch env --plan MODEL``: the fast engine's plan of a model id or folder, one line per module class saying
which fused kernel runs or why the model's own code runs (FastLane.plan), on the CPU with the shipped pair."""

import json

import pytest

from hf_rstitch.cli.main import main

pytestmark = pytest.mark.slow  # loads the shipped pair (a few seconds on two cores)


def test_plan_of_a_pair_folder_names_both_models_modules(capsys):
    assert main(["env", "--plan", _pair(), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    for role, layers in (("LLM", 12), ("SLM", 2)):
        assert f"{role}: FastLane plan for LlamaForCausalLM (cpu, torch.float32, up to 1 rows)" in out
        line = f"LlamaDecoderLayer x{layers} (layer): add + norm pieces: probe equal (max abs err 0)"
        assert f"module       {line}" in out
    # on the CPU the norms probe equal, yet run their compiled code: the kernel needs Triton
    assert "LlamaRMSNorm x5 (norm): model's own code: compiled, the kernel needs Triton (cpu); probe equal" in out


def test_plan_of_one_model_folder_as_json(capsys):
    assert main(["env", "--json", "--plan", f"{_pair()}/slm", "--device", "cpu"]) == 0
    info = json.loads(capsys.readouterr().out)
    plan = info[f"fast plan {_pair()}/slm"]
    assert plan["model"] == "LlamaForCausalLM" and plan["compile"] == "parts"
    assert {(m["part"], m["module"], m["count"]) for m in plan["modules"]} == {
        ("layer", "LlamaDecoderLayer", 2), ("norm", "LlamaRMSNorm", 5)}


def test_plan_of_a_missing_folder_says_what_was_wrong(capsys):
    try:
        code = main(["env", "--plan", "./no-such-model", "--device", "cpu"])
    except SystemExit as done:
        code = done.code
    assert code != 0
    assert "--plan ./no-such-model: no such folder" in capsys.readouterr().err


def _pair() -> str:
    from hf_rstitch.toyworld.pair import ASSETS

    return str(ASSETS)
