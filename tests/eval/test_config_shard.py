import pytest

from hf_rstitch.eval.config import EvalConfig


def cfg(**kw):
    return EvalConfig(llm="a", slm="b", data=["x.jsonl"], **kw)


def test_shards_partition_the_problems():
    problems = list(range(10))
    parts = [cfg(shard=f"{i}/3").shard_of(problems) for i in range(3)]
    assert sorted(sum(parts, [])) == problems and parts[1] == [1, 4, 7]
    assert cfg().shard_of(problems) == problems


@pytest.mark.parametrize("bad", ["1", "a/b", "3/3", "-1/2"])
def test_bad_shard(bad):
    with pytest.raises(ValueError, match="shard"):
        cfg(shard=bad)


def test_router_path_from_the_cli_becomes_the_router():
    c = cfg(methods=["router"], router_path="hf_rstitch/assets/router")
    assert c.router == "hf_rstitch/assets/router"
