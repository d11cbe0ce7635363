"""benchmarks/eval_sharded.py --resume-from: prior records go to the shard that owns their problem."""

import json

import eval_sharded  # benchmarks/ is on the test path (pyproject: [tool.pytest.ini_options] pythonpath)


def test_prior_records_land_in_the_shard_that_runs_their_problem(tmp_path):
    data = tmp_path / "set.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{k}", "problem": f"{k}+1", "answer": str(k + 1)}) + "\n"
                            for k in range(7)))
    prior = tmp_path / "prior"
    prior.mkdir()
    records = [{"dataset": "set", "id": f"p{k}", "method": m} for k in (0, 1, 4, 5) for m in ("llm", "slm")]
    records.append({"dataset": "other", "id": "p0", "method": "llm"})  # not in --data: skipped
    (prior / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (prior / "run.json").write_text(json.dumps({"settings": {}}))
    shards = tmp_path / "out" / "shards"
    (shards / "2").mkdir(parents=True)
    (shards / "2" / "records.jsonl").write_text("kept\n")  # a shard with records of its own is left alone
    eval_sharded.seed_shards(prior, shards, 3, ["--llm", "a", "--slm", "b", "--data", str(data)])

    def ids(i):
        return [json.loads(x)["id"] for x in (shards / str(i) / "records.jsonl").read_text().splitlines()]

    assert ids(0) == ["p0", "p0"]  # problems 0, 3, 6 belong to shard 0
    assert ids(1) == ["p1", "p1", "p4", "p4"]  # 1, 4
    assert (shards / "2" / "records.jsonl").read_text() == "kept\n"
    assert (shards / "0" / "run.json").exists()
