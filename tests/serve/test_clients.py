"""Real clients against the server on the shipped pair: the openai SDK (plain, streaming, stop) and lm-eval's
``local-completions`` / ``local-chat-completions`` on a small local task with its default settings (no
downloads: the task's data is a jsonl file in the test's tmp dir, loaded by the ``json`` builder offline)."""

from __future__ import annotations

import json

import pytest

from hf_rstitch.toyworld.pair import assets_present
from serve.live import LiveServer
from serve.pair_cases import SERVER_TAU, pair, problem, solo

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not assets_present(), reason="shipped toy-world pair absent")]
NAME = "rstitch-toyworld-pair"


@pytest.fixture(scope="module", params=["one-process", "split"])
def server(request):
    """The server of ``ServeConfig(threshold=SERVER_TAU, max_batch=4)`` in each of ``rstitch serve``'s layouts."""
    import contextlib

    from hf_rstitch.serve.app import create_app
    from hf_rstitch.serve.config import ServeConfig, build_engine, settings_for
    from serve.live import split_app

    cfg = ServeConfig(threshold=SERVER_TAU, max_batch=4)
    if request.param == "split":
        built = split_app(cfg)
    else:
        llm, slm, tok = pair()
        built = contextlib.nullcontext(create_app(build_engine(cfg, llm, slm), tok, settings_for(cfg, llm)))
    with built as app, LiveServer(app) as srv:
        srv.app = app
        yield srv


def test_openai_sdk_plain_streaming_and_stop(server, one_thread):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": problem(0)}]
    want = solo(0, None, 48)["text"]
    out = client.chat.completions.create(model=NAME, messages=messages, max_tokens=48, temperature=0)
    assert out.choices[0].message.content == want and out.usage.completion_tokens == solo(0, None, 48)["completion_tokens"]
    chunks = list(client.chat.completions.create(model=NAME, messages=messages, max_tokens=48, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert chunks[-1].usage.completion_tokens == out.usage.completion_tokens
    stop = want.split()[3]  # a word inside the answer: the text ends before its first appearance
    cut = want[:want.index(stop)]
    out = client.chat.completions.create(model=NAME, messages=messages, max_tokens=48, temperature=0, stop=[stop])
    assert out.choices[0].message.content == cut and out.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model=NAME, prompt=problem(1), max_tokens=16, temperature=0, stop=stop,
                                         stream=True)
    plain = client.completions.create(model=NAME, prompt=problem(1), max_tokens=16, temperature=0, stop=stop)
    assert "".join(c.choices[0].text for c in streamed) == plain.choices[0].text
    with pytest.raises(openai.NotFoundError, match="the model 'gpt-4o' does not exist") as missing:
        client.chat.completions.create(model="gpt-4o", messages=messages, max_tokens=4)
    assert missing.value.code == "model_not_found" and missing.value.param == "model"
    with pytest.raises(openai.BadRequestError, match="n=2"):
        client.chat.completions.create(model=NAME, messages=messages, max_tokens=4, n=2)


TASK = """task: toy_arith
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{problem}}}}"
doc_to_target: "{{{{answer}}}}"
filter_list:
  - name: boxed
    filter:
      - function: regex
        regex_pattern: "boxed\\\\{{(\\\\d+)\\\\}}"
      - function: take_first
metric_list:
  - metric: exact_match
"""


def _task(tmp_path, n):
    from hf_rstitch.toyworld.pair import load_test_split

    rows = load_test_split()[:n]
    data = tmp_path / "toy.jsonl"
    data.write_text("".join(json.dumps({"problem": r["problem"], "answer": r["answer"]}) + "\n" for r in rows))
    (tmp_path / "toy_arith.yaml").write_text(TASK.format(data=data))
    return rows


@pytest.mark.parametrize("kind", ["local-chat-completions", "local-completions"])
def test_lm_eval_runs_against_the_server(server, tmp_path, monkeypatch, one_thread, kind):
    pytest.importorskip("lm_eval")
    import lm_eval
    from lm_eval.tasks import TaskManager

    from hf_rstitch.toyworld.pair import ASSETS

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    rows = _task(tmp_path, 4)
    chat = kind == "local-chat-completions"
    endpoint = "/v1/chat/completions" if chat else "/v1/completions"
    args = f"model={NAME},base_url={server.url}{endpoint},num_concurrent=4,max_retries=1,tokenizer={ASSETS / 'llm'}"
    if chat:
        args += ",tokenizer_backend=None"
    out = lm_eval.simple_evaluate(model=kind, model_args=args, tasks=["toy_arith"], apply_chat_template=chat,
                                  task_manager=TaskManager(include_path=str(tmp_path)), log_samples=True)
    samples = sorted(out["samples"]["toy_arith"], key=lambda s: s["doc_id"])
    responses = [s["resps"][0][0] for s in samples]
    assert len(responses) == len(rows) and all(isinstance(r, str) for r in responses)
    for i, got in enumerate(responses):  # the solo greedy answer, cut at lm-eval's default stop ("\n\n")
        want = solo(i, None, 256)["text"] if chat else _solo_raw(problem(i), 256)
        assert got == want.split("\n\n")[0], i
    assert out["results"]["toy_arith"]["exact_match,boxed"] == sum(
        f"boxed{{{r['answer']}}}" in g for r, g in zip(rows, responses)) / len(rows)


def _solo_raw(text, max_new):
    """Greedy solo generate over the raw text (what local-completions sends: its token ids, no template)."""
    import torch

    llm, slm, tok = pair()
    ids = torch.tensor([tok(text)["input_ids"]])
    out = llm.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=slm, do_sample=False,
                       max_new_tokens=min(max_new, 768 - ids.shape[1]), stitch_threshold=SERVER_TAU)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
