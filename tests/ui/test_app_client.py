"""The served page through gradio_client (the API a browser's events call): a run's answer is generate's, the LLM
alone runs beside with the speed-up, bad input is a message and the app keeps serving, two clients at once each get
their own answer (hf_rstitch/ui/page.py)."""

import concurrent.futures

import pytest

pytestmark = pytest.mark.slow
OUTPUTS = ("message", "stitched", "clock_stitched", "llm", "clock_llm", "plot", "summary", "code")


@pytest.fixture(scope="module")
def client(served):
    from gradio_client import Client

    return Client(served[0], verbose=False)


def run(client, prompt, threshold=0.001, max_new_tokens=120, mode="greedy", seed=0, router=False, compare=False):
    out = client.predict(prompt, threshold, max_new_tokens, mode, seed, router, compare, api_name="/run")
    return dict(zip(OUTPUTS, out))


def expected(prompt, threshold, max_new_tokens=120):
    """What generate writes for these settings (the decode the page must show)."""
    from hf_rstitch.ui.pair import load
    from hf_rstitch.ui.run import RunSettings, stream

    pair = load()
    last = list(stream(pair, RunSettings(prompt, threshold, max_new_tokens).checked()))[-1]
    return pair.tokenizer.decode(last.ids, skip_special_tokens=True), last


@pytest.fixture(scope="module")
def problems():
    from hf_rstitch.toyworld.pair import load_test_split

    return [row["problem"] for row in load_test_split()[:2]]


def test_a_run_shows_generates_answer_coloured_with_the_plot_summary_and_code(client, problems, text_of):
    got = run(client, problems[0])
    text, last = expected(problems[0], 0.001)
    assert got["message"] == "" and text_of(got["stitched"]) == text
    assert "tok-slm" in got["stitched"] and "tok-llm" in got["stitched"]
    assert 'class="threshold"' in got["plot"] and "(done)" in got["clock_stitched"]
    assert dict(map(tuple, got["summary"]["data"])) == last.summary
    assert "llm.generate(**inputs, assistant_model=slm, stitch_threshold=0.001" in got["code"]


def test_the_llm_alone_runs_beside_with_the_speedup(client, problems):
    got = run(client, problems[0], max_new_tokens=40, compare=True)
    assert "tok-llm" in got["llm"] and "tok-slm" not in got["llm"]
    assert "x</b> the LLM alone" in got["clock_stitched"] and "tokens/s" in got["clock_llm"]


@pytest.mark.parametrize("args, message", [
    (dict(prompt=""), "prompt is empty"),
    (dict(max_new_tokens=0), "less than minimum"),  # the slider's own bound, checked by Gradio
])
def test_bad_input_is_a_message_and_the_app_keeps_serving(client, problems, text_of, args, message):
    from gradio_client.exceptions import AppError

    try:
        got = run(client, **{"prompt": problems[0], **args})
        shown = text_of(got["message"])
    except AppError as err:  # Gradio refuses a value outside a component's bounds before the handler runs
        shown = str(err)
    assert message in shown and "Traceback" not in shown
    assert "tok-" in run(client, problems[1], max_new_tokens=20)["stitched"]


def test_a_threshold_outside_0_1_is_refused_with_a_message(client, problems):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="greater than maximum value 1"):
        run(client, problems[0], threshold=1.5)
    assert "tok-" in run(client, problems[0], max_new_tokens=10)["stitched"]


def test_loading_a_pair_that_cannot_load_is_a_message(client, tmp_path, text_of):
    status = client.predict(str(tmp_path / "missing"), "shipped:slm", api_name="/load_pair")[0]
    assert "no such folder" in text_of(status)
    status = client.predict("nobody-xyz/no-such-model-rstitch", "shipped:slm", api_name="/load_pair")[0]
    assert "cannot load the pair" in text_of(status)


def test_two_clients_at_once_each_get_their_own_answer(served, problems, text_of):
    from gradio_client import Client

    settings = [(problems[0], 0.001), (problems[1], 0.02)]
    clients = [Client(served[0], verbose=False) for _ in settings]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda cs: run(cs[0], *cs[1]), zip(clients, settings)))
    for got, (prompt, tau) in zip(answers, settings):
        assert text_of(got["stitched"]) == expected(prompt, tau)[0]
