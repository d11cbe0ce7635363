import pytest

from hf_rstitch.cli.demo import RESET, coloured
from hf_rstitch.cli.main import main
from hf_rstitch.core.roles import Role
from hf_rstitch.toyworld.pair import assets_present
from tiny_models import make_tokenizer


def test_coloured_marks_each_token_by_model():
    tok = make_tokenizer()
    ids = tok("ab c")["input_ids"]
    roles = [Role.SLM, Role.LLM, Role.SLM, Role.LLM]
    assert coloured(tok, ids, roles, colour=False) == "a[b] [c]"
    assert coloured(tok, ids, roles, colour=True).count(RESET) == 4


@pytest.mark.parametrize("argv, message", [
    (["--n", "0"], "--n must be at least 1"),
    (["--n", "3", "--show", "3"], "--show must index"),
    (["--thresholds", "1.5"], "--thresholds"),
])
def test_bad_options_are_messages(argv, message, capsys):
    assert main(["demo", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(not assets_present(), reason="the shipped pair is not in this checkout")
def test_demo_runs_offline_on_the_shipped_pair(capsys):
    assert main(["demo", "--n", "1", "--thresholds", "0.05", "--no-colour", "--no-router",
                 "--max-new-tokens", "300"]) == 0
    out = capsys.readouterr().out
    for label in ("LLM", "SLM", "R-Stitch", "speedup", "Problem"):
        assert label in out


def test_generate_command_rejects_half_a_pair(capsys):
    assert main(["generate", "--llm", "x"]) == 2
    assert "both --llm and --slm" in capsys.readouterr().err


def test_generate_and_profile_take_shipped_references(capsys):
    from hf_rstitch import shipped
    from hf_rstitch.cli.generate import GenerateConfig
    from hf_rstitch.cli.profile import ProfileConfig

    cfg = GenerateConfig(llm="shipped:llm", slm="shipped:slm")
    assert (cfg.llm, cfg.slm) == (str(shipped("llm")), str(shipped("slm")))
    assert ProfileConfig(model="shipped:slm").model == str(shipped("slm"))
    assert main(["generate", "--prompt", "What is 2 + 3?", "--llm", "shipped:llm", "--slm", "shipped:slm",
                 "--max-new-tokens", "8", "--no-colour"]) == 0
