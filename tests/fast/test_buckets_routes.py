"""Pure helpers of the fast engine: length buckets and synthetic routes."""

import pytest

from hf_rstitch.fast import bucket_for, bucket_sizes
from hf_rstitch.fast.buckets import round_up
from hf_rstitch.fast.routes import route, switches


def test_bucket_sizes_are_powers_of_two():
    assert bucket_sizes(1) == (1,)
    assert bucket_sizes(16) == (1, 2, 4, 8, 16)


@pytest.mark.parametrize("bad", [0, 3, 12, -4, 2.0, True])
def test_bucket_sizes_reject_non_powers_of_two(bad):
    with pytest.raises(ValueError, match="power of two"):
        bucket_sizes(bad)


def test_bucket_for_picks_smallest_fitting_bucket():
    sizes = bucket_sizes(8)
    assert [bucket_for(w, sizes) for w in range(1, 10)] == [1, 2, 4, 4, 8, 8, 8, 8, None]
    with pytest.raises(ValueError):
        bucket_for(0, sizes)


def test_round_up():
    assert [round_up(v, 64) for v in (1, 64, 65, 128)] == [64, 64, 128, 128]


@pytest.mark.parametrize("n,llm,run", [(1024, 102, 1), (1024, 307, 4), (1024, 512, 16), (1115, 344, 4), (7, 3, 2)])
def test_route_has_exact_counts_and_run_lengths(n, llm, run):
    roles = route(n, llm, run, seed=3)
    assert len(roles) == n and roles.count("llm") == llm and roles[0] == "slm"
    llm_runs = switches(roles + ["slm"]) // 2  # every LLM run is entered and left once
    assert llm_runs == max(1, min(round(llm / run), llm, n - llm))
    assert route(n, llm, run, seed=3) == roles  # deterministic


def test_route_edge_cases():
    assert route(5, 0, 1) == ["slm"] * 5
    assert route(5, 5, 1) == ["llm"] * 5
    assert switches(route(10, 5, 1)) == 9
    with pytest.raises(ValueError):
        route(5, 6, 1)
    with pytest.raises(ValueError):
        route(5, 2, 0.5)
