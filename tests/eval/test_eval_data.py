"""Loading benchmark JSONL and building chat prompts."""

from __future__ import annotations

import pytest

from hf_rstitch.eval.data import DEFAULT_INSTRUCTION, dataset_name, load_jsonl, load_problems, prompt_ids


def test_load_jsonl_and_limit(bench_file):
    probs = load_jsonl(bench_file)
    assert [p.id for p in probs] == ["a", "b", "c"]
    assert probs[0].dataset == "toy" and probs[2].answer == "\\frac{5}{2}"
    assert len(load_problems(str(bench_file), limit=2)) == 2


def test_ids_are_strings_and_extra_keys_ignored(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"id": 7, "problem": "p", "answer": "1", "source": "s"}\n\n')
    (p,) = load_jsonl(path)
    assert p.id == "7"


@pytest.mark.parametrize("body,match", [
    ('{"id": "1", "problem": "p", "answer": "1"}\n{"id": "2", "problem": "p"}\n', r"x\.jsonl:2: missing key\(s\) \['answer'\]"),
    ('{"id": "1", "problem": "p", "answer": "1"}\n{"id": "2", "problem": "p", \n', r"x\.jsonl:2: not valid JSON"),
    ('["id", "problem", "answer"]\n', r"x\.jsonl:1: expected a JSON object"),
    ('{"id": "1", "problem": "p", "answer": "1"}\n{"id": "1", "problem": "q", "answer": "2"}\n', r"duplicate id '1'"),
    ("\n", "holds no rows"),
])
def test_load_jsonl_errors_name_the_line(tmp_path, body, match):
    path = tmp_path / "x.jsonl"
    path.write_text(body)
    with pytest.raises(ValueError, match=match):
        load_jsonl(path)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_problems(str(tmp_path / "nope.jsonl"))


def test_dataset_name():
    assert dataset_name("/x/shared/benchmarks/aime24.jsonl") == "aime24"
    assert dataset_name("owner/my-set:test") == "my-set"


def test_prompt_uses_chat_template(tokenizer):
    ids = prompt_ids(tokenizer, "What is 1+1?")
    text = tokenizer.decode(ids)
    assert text.startswith("<|user|>What is 1+1?\n\n" + DEFAULT_INSTRUCTION) and text.endswith("<|assistant|>")
    plain = tokenizer.decode(prompt_ids(tokenizer, "Q", instruction="", chat_template=False))
    assert plain == "Q"


def test_prompt_without_template_says_how_to_fix(tokenizer_without_template):
    with pytest.raises(ValueError, match="--no-chat-template"):
        prompt_ids(tokenizer_without_template, "Q")
