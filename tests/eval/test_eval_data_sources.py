"""``--data`` beyond the house JSONL: column mappings, local csv/json/parquet through ``datasets``, Hub
sets as published (the Hub call is replaced by an in-memory dataset: no network)."""

from __future__ import annotations

import pytest

from hf_rstitch.cli.main import main
from hf_rstitch.eval.data import load_problems, parse_columns

datasets = pytest.importorskip("datasets")


def test_parse_columns():
    assert parse_columns("problem=question, answer=final_answer") == {"problem": "question", "answer": "final_answer"}
    assert parse_columns("") == {}
    with pytest.raises(ValueError, match="FIELD=COLUMN"):
        parse_columns("problem")
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['question'\]"):
        parse_columns("question=problem")


def test_jsonl_with_mapping_and_row_ids(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"question": "1+1?", "final_answer": "2"}\n{"question": "2+2?", "final_answer": "4"}\n')
    probs = load_problems(str(path), columns="problem=question,answer=final_answer")
    assert [(p.id, p.problem, p.answer, p.dataset) for p in probs] == [("0", "1+1?", "2", "mine"), ("1", "2+2?", "4", "mine")]
    with pytest.raises(ValueError, match=r"missing key\(s\) \['problem', 'answer'\].*--columns"):
        load_problems(str(path))


@pytest.mark.parametrize("suffix", [".csv", ".json", ".parquet"])
def test_local_files_through_datasets(tmp_path, suffix):
    ds = datasets.Dataset.from_dict({"q": ["a?", "b?"], "a": ["1", "2"], "key": ["x", "y"]})
    path = tmp_path / f"set{suffix}"
    {".csv": ds.to_csv, ".json": ds.to_json, ".parquet": ds.to_parquet}[suffix](str(path))
    probs = load_problems(str(path), columns={"problem": "q", "answer": "a", "id": "key"}, limit=1)
    assert [(p.id, p.problem, p.answer, p.dataset) for p in probs] == [("x", "a?", "1", "set")]


def _fake_hub(monkeypatch, rows: dict):
    calls = []

    def load_dataset(path, name=None, split=None):
        calls.append((path, name, split))
        return datasets.Dataset.from_dict(rows)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def test_gsm8k_as_published(monkeypatch):
    calls = _fake_hub(monkeypatch, {"question": ["Tom has 3 ...?"], "answer": ["3 + 4 = <<3+4=7>>7\n#### 7"]})
    (p,) = load_problems("openai/gsm8k")
    assert calls == [("openai/gsm8k", "main", "test")]
    assert (p.id, p.problem, p.answer, p.dataset) == ("0", "Tom has 3 ...?", "7", "gsm8k")


def test_math500_as_published_and_explicit_config_split(monkeypatch):
    calls = _fake_hub(monkeypatch, {"problem": ["x?"], "solution": ["..."], "answer": ["\\frac{1}{2}"],
                                    "unique_id": ["test/algebra/1.json"]})
    (p,) = load_problems("HuggingFaceH4/MATH-500")
    assert (p.id, p.answer) == ("test/algebra/1.json", "\\frac{1}{2}")
    load_problems("HuggingFaceH4/MATH-500:default:train")
    assert calls[-1] == ("HuggingFaceH4/MATH-500", "default", "train")


def test_missing_hub_columns_are_named(monkeypatch):
    _fake_hub(monkeypatch, {"prompt": ["x?"], "target": ["1"]})
    with pytest.raises(ValueError, match=r"no column\(s\) \['problem', 'answer'\]; it has \['prompt', 'target'\]"):
        load_problems("me/set")
    assert load_problems("me/set", columns="problem=prompt,answer=target")[0].answer == "1"


def test_unreachable_hub_set_is_a_clear_error(monkeypatch):
    def load_dataset(**kw):
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: load_dataset(**k))
    with pytest.raises(ValueError, match="could not load 'me/set'.*HF_HUB_OFFLINE"):
        load_problems("me/set")


def test_cli_reports_a_bad_mapping_without_traceback(tmp_path, capsys, monkeypatch):
    _fake_hub(monkeypatch, {"prompt": ["x?"], "target": ["1"]})
    rc = main(["eval", "--llm", "a", "--slm", "b", "--data", "me/set", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "no column(s)" in err and "Traceback" not in err
    assert main(["eval", "--llm", "a", "--slm", "b", "--data", "me/set", "--columns", "problem"]) == 2
    assert "FIELD=COLUMN" in capsys.readouterr().err
