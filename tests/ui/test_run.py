"""The app's run, without Gradio: what it streams is what ``generate`` returns, the watched roles are the trace's,
the code box reproduces the run, and bad input is a message (hf_rstitch/ui/run.py, code.py, render.py, pair.py)."""

import contextlib
import io
import math

import pytest
import torch

import hf_rstitch
from hf_rstitch.core.roles import Role
from hf_rstitch.toyworld.pair import assets_present, load_test_split
from hf_rstitch.ui import render
from hf_rstitch.ui.code import reproduce
from hf_rstitch.ui.pair import PairError, load
from hf_rstitch.ui.run import RunError, RunSettings, prompt_ids, stream
from tiny_models import make_tokenizer

pytestmark = pytest.mark.skipif(not assets_present(), reason="the shipped pair is not in this checkout")


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(1)
    return load()


@pytest.fixture(scope="module")
def problem():
    return load_test_split()[0]["problem"]


def reference(pair, settings, **route):
    """``llm.generate`` as a user calls it, for the same settings."""
    ids = prompt_ids(pair, settings.prompt)
    route = route or dict(stitch_threshold=settings.threshold)
    out = pair.llm.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=pair.slm, do_sample=False,
                            max_new_tokens=settings.max_new_tokens, return_dict_in_generate=True, **route)
    return out.sequences[0, ids.shape[1]:].tolist(), out.stitch


def test_the_shipped_pair_defaults_to_its_router_and_the_routers_tau(pair):
    assert pair.shipped and pair.router == "shipped" and pair.threshold == 0.001
    assert (pair.llm_ref, pair.slm_ref) == ("shipped:llm", "shipped:slm")


@pytest.mark.parametrize("tau", [0.001, 0.005, 1.0])
def test_stream_ends_with_generates_tokens_and_the_watched_roles_are_the_traces(pair, problem, tau):
    settings = RunSettings(problem, tau, 120).checked()
    snaps = list(stream(pair, settings))
    last = snaps[-1]
    ids, trace = reference(pair, settings)
    assert last.done and not any(s.done for s in snaps[:-1])
    assert last.ids == ids and last.roles == trace.roles and last.summary == trace.summary()
    for snap in snaps[:-1]:  # live: a prefix of the final answer, coloured as the trace colours it
        n = len(snap.ids)
        assert snap.ids == ids[:n] and snap.roles == trace.roles[:n]
        assert snap.slm_entropy == pytest.approx(last.slm_entropy[:n])
        assert snap.llm_entropy == pytest.approx(last.llm_entropy[:n])
    if tau == 1.0:
        assert set(last.roles) == {Role.SLM}


def test_router_run_equals_generate_with_the_shipped_router(pair, problem):
    settings = RunSettings(problem, 0.001, 120, router=True).checked()
    last = list(stream(pair, settings))[-1]
    ids, trace = reference(pair, settings, stitch_router="shipped", stitch_threshold=0.001)
    assert last.ids == ids and last.roles == trace.roles and "Router" in trace.policy


@pytest.mark.slow
def test_two_runs_at_once_on_a_fresh_pair_each_equal_generate(problem):
    """The pair's first generate sets the models up (the fast engine's KV-shape probe swaps a model's attention
    function for one forward); a run started meanwhile must not see that (hf_rstitch.fast.kv_shapes.kv_shape)."""
    import concurrent.futures

    fresh = load()
    settings = [RunSettings(problem, 0.001, 30).checked(), RunSettings("Tom has 3 pens and buys 4. How many?", 0.02,
                                                                       30).checked()]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        lasts = list(pool.map(lambda s: list(stream(fresh, s))[-1], settings))
    for last, s in zip(lasts, settings):
        assert last.ids == reference(fresh, s)[0]


@pytest.mark.slow
def test_llm_alone_equals_plain_generate(pair, problem):
    settings = RunSettings(problem, 0.005, 40).checked()
    last = list(stream(pair, settings, stitched=False))[-1]
    ids = prompt_ids(pair, problem)
    plain = pair.llm.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=40)
    assert last.ids == plain[0, ids.shape[1]:].tolist() and set(last.roles) == {Role.LLM} and last.summary is None


@pytest.mark.slow
@pytest.mark.parametrize("sample, router", [(False, False), (True, False), (False, True)])
def test_the_code_box_reproduces_the_run(pair, problem, sample, router):
    settings = RunSettings(problem, 0.002, 80, sample=sample, router=router, seed=3).checked()
    last = list(stream(pair, settings))[-1]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(reproduce(pair, settings), "code-box", "exec"), {})
    text, summary = printed.getvalue().rstrip("\n").rsplit("\n", 1)
    assert text == pair.tokenizer.decode(last.ids, skip_special_tokens=True)
    assert summary == str(last.summary)


def test_page_text_is_generates_decode(pair, problem):
    last = list(stream(pair, RunSettings(problem, 0.005, 120).checked()))[-1]
    assert "".join(render.token_texts(pair.tokenizer, last.ids)) == pair.tokenizer.decode(last.ids,
                                                                                          skip_special_tokens=True)
    page = render.tokens_html(pair.tokenizer, last.ids, last.roles, "stitched")
    assert page.count("tok-slm") == last.roles.count(Role.SLM) and page.count("tok-llm") == last.roles.count(Role.LLM)
    assert page.count("handover") == last.summary["switches"]


@pytest.mark.parametrize("settings, message", [
    (dict(prompt="  \n"), "prompt is empty"),
    (dict(threshold=1.5), "in [0, 1]"),
    (dict(threshold=-0.1), "in [0, 1]"),
    (dict(threshold=math.nan), "in [0, 1]"),
    (dict(threshold=None), "must be a number"),
    (dict(max_new_tokens=0), "max new tokens"),
    (dict(max_new_tokens=10 ** 6), "max new tokens"),
])
def test_bad_settings_are_messages(settings, message):
    with pytest.raises(RunError, match=message.replace("[", r"\[").replace("]", r"\]")):
        RunSettings(**{**dict(prompt="2 + 2?", threshold=0.01, max_new_tokens=10), **settings}).checked()


def test_router_on_a_pair_without_one_is_a_message(pair, problem):
    from dataclasses import replace

    with pytest.raises(RunError, match="no R-Stitch\\+ router"):
        list(stream(replace(pair, router=None), RunSettings(problem, 0.01, 5, router=True).checked()))


def test_a_model_that_cannot_load_is_a_message(tmp_path):
    with pytest.raises(PairError, match="no such folder"):
        load(str(tmp_path / "missing"), "shipped:slm")
    with pytest.raises(PairError, match="cannot load the pair"):
        load("nobody-xyz/no-such-model-rstitch", "shipped:slm")  # HF_HUB_OFFLINE=1 in the test commands
    with pytest.raises(PairError, match="both"):
        load("shipped:llm", None)


def test_rstitch_ui_with_a_pair_that_cannot_load_exits_with_the_message(tmp_path, capsys):
    from hf_rstitch.cli.main import main

    assert main(["ui", "--llm", str(tmp_path / "missing"), "--slm", "shipped:slm"]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main(["ui", "--llm", "shipped:llm"]) == 2
    assert "both --llm and --slm" in capsys.readouterr().err


def test_a_pair_with_different_tokenizers_is_a_message(tmp_path):
    make_tokenizer().save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text((hf_rstitch.shipped("slm") / "config.json").read_text())
    with pytest.raises(PairError, match="tokenizers differ"):
        load("shipped:llm", str(tmp_path))


def test_entropy_plot_has_a_dot_per_model_that_ran_and_the_threshold_line():
    svg = render.entropy_svg([0.1, None, 0.0], [None, 0.3, None], 0.02)
    assert svg.count('class="dot-slm"') == 2 and svg.count('class="dot-llm"') == 1
    assert svg.count('class="threshold"') == 1 and "tau = 0.02" in svg
