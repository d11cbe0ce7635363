import math

import pytest
import torch

from hf_rstitch.core.policies import EntropyPolicy, RandomPolicy, ReplayPolicy, RoutingPolicy, StepView
from hf_rstitch.core.roles import Role


def view(h, index=0):
    return StepView(index=index, entropy=torch.tensor([h]))


def test_entropy_rule_is_algorithm_1():
    p = EntropyPolicy(0.1)
    assert p.hand_to_llm(view(0.11)).item() and not p.hand_to_llm(view(0.1)).item()
    assert p.hand_to_slm(view(0.1)).item() and not p.hand_to_slm(view(0.10001)).item()


@pytest.mark.parametrize("bad", [-0.01, 1.5, math.nan, math.inf])
def test_threshold_out_of_range(bad):
    with pytest.raises(ValueError, match="stitch_threshold.*\\[0, 1\\]"):
        EntropyPolicy(bad)


@pytest.mark.parametrize("bad", ["0.1", None, True])
def test_threshold_wrong_type(bad):
    with pytest.raises(TypeError, match="stitch_threshold"):
        EntropyPolicy(bad)


def test_random_policy_is_seeded_and_near_p():
    p = RandomPolicy(0.3, seed=5)
    p.reset()
    a = [p.hand_to_llm(view(0.5)).item() for _ in range(2000)]
    p.reset()
    b = [p.hand_to_llm(view(0.5)).item() for _ in range(2000)]
    assert a == b
    assert abs(sum(a) / len(a) - 0.3) < 0.05
    assert p.hand_to_slm(view(0.99)).item()  # default: return after every LLM token


def test_replay_policy_follows_route():
    p = ReplayPolicy(["slm", "llm", "llm", "slm"])
    assert not p.hand_to_llm(view(0.9, 0)).item()
    assert p.hand_to_llm(view(0.0, 1)).item()
    assert not p.hand_to_slm(view(0.0, 1)).item()  # token 2 is the LLM's too
    assert p.hand_to_slm(view(0.9, 2)).item()  # token 3 is the SLM's
    assert p.hand_to_llm(view(0.0, 99)).item() is False  # past the end: last entry repeats (slm)


def test_replay_rejects_bad_routes():
    with pytest.raises(ValueError, match="non-empty"):
        ReplayPolicy([])
    with pytest.raises(ValueError, match="'slm' or 'llm'"):
        ReplayPolicy(["slm", "big"])


def test_policies_share_the_interface():
    for p in (EntropyPolicy(0.1), RandomPolicy(0.1), ReplayPolicy([Role.SLM])):
        assert isinstance(p, RoutingPolicy)


def test_replay_policy_per_row_routes_follow_row_ids():
    p = ReplayPolicy([["slm", "llm"], ["llm", "slm"], ["llm", "llm"]])
    step = StepView(index=0, entropy=torch.zeros(2), rows=torch.tensor([0, 2]))  # row 1 has left the batch
    assert p.hand_to_llm(step).tolist() == [False, True]
    assert p.hand_to_slm(step).tolist() == [False, False]
    with pytest.raises(ValueError, match="3 routes"):
        p.hand_to_llm(StepView(index=0, entropy=torch.zeros(1), rows=torch.tensor([3])))


@pytest.mark.parametrize("routes", [["slm", "llm", "llm", "slm"],
                                    [["slm", "llm", "slm"], ["llm", "llm", "slm", "slm"], ["slm"]]])
def test_replay_decisions_on_a_device_equal_those_on_the_host(routes):
    """ReplayPolicy(device=...) gives the same decisions as a tensor on that device (as a GPU policy's),
    for rows in order, a subset in another order, and past the routes' ends."""
    host, dev = ReplayPolicy(routes), ReplayPolicy(routes, device="meta")
    on_cpu = ReplayPolicy(routes, device="cpu")
    n = 3
    for rows in (torch.arange(n), torch.tensor([2, 0]), torch.tensor([1])):
        for index in range(6):
            view = StepView(index, torch.zeros(len(rows)), rows=rows)
            assert dev.hand_to_llm(view).device.type == "meta"
            assert torch.equal(on_cpu.hand_to_llm(view), host.hand_to_llm(view))
            assert torch.equal(on_cpu.hand_to_slm(view), host.hand_to_slm(view))
