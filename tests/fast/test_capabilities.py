"""The GPU feature table (hf_rstitch.fast.capabilities): its queries, the generic profile reaching them from
FastConfig and the environment, the kernels' and lanes' gates asking it, and docs/fast-engine.md carrying it."""

import sys
from pathlib import Path

import pytest
import torch

from hf_rstitch.core.roles import Role
from hf_rstitch.fast import FastConfig, capabilities
from hf_rstitch.fast import lane as fast_lane
from hf_rstitch.fast.kernels import expert_gemv, triton_support
from tiny_models import make_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import capability_table  # noqa: E402

CPU = torch.device("cpu")


def test_doc_carries_the_table():
    assert capability_table.main(["--check"]) == 0, "run: PYTHONPATH=$PWD python tools/capability_table.py"


@pytest.mark.parametrize("capability", sorted(capabilities.TARGETS))
def test_queries_follow_the_table(capability):
    with capabilities.assume(capability):
        assert capabilities.device_capability(CPU) == capability
        for name, feature in capabilities.FEATURES.items():
            assert capabilities.has(name, CPU) == feature.on(capability)
            with capabilities.profile_scope("generic"):  # generic: as the GPU capped at 8.9
                assert capabilities.has(name, CPU) == feature.on(min(capability, capabilities.GENERIC_CEILING))


def test_hand_values():
    on = {c for c in capabilities.TARGETS if capabilities.FEATURES["bfloat16"].on(c)}
    assert (7, 5) not in on and (8, 0) in on
    assert [c for c in sorted(capabilities.TARGETS) if capabilities.FEATURES["wgmma"].on(c)] == [(9, 0)]
    assert not capabilities.has("pdl", CPU)  # off CUDA nothing is on


def test_profile_from_config_env_and_errors(monkeypatch):
    monkeypatch.delenv(capabilities.PROFILE_ENV, raising=False)
    assert capabilities.active_profile() == "native"
    monkeypatch.setenv(capabilities.PROFILE_ENV, "Generic")
    assert capabilities.active_profile() == "generic"
    with capabilities.profile_scope("native"):  # a lane's FastConfig wins over the environment
        assert capabilities.active_profile() == "native"
    monkeypatch.setenv(capabilities.PROFILE_ENV, "hopper")
    with pytest.raises(ValueError, match="HF_RSTITCH_PROFILE='hopper'.*native, generic"):
        capabilities.active_profile()
    with pytest.raises(ValueError, match="profile must be one of native, generic"):
        FastConfig(profile="ampere")
    assert capabilities.triton_environment("generic") == {"DISABLE_MMA_V3": "1"}
    assert capabilities.triton_environment("native") == {}


def test_kernel_gates_ask_the_table(monkeypatch):
    monkeypatch.setattr(triton_support, "interpreted", lambda: False)
    monkeypatch.setattr(triton_support, "_has_gdc", lambda: True)
    bf16 = torch.zeros(1, 4, dtype=torch.bfloat16)
    for capability, hopper in (((8, 6), False), ((9, 0), True), ((12, 0), True)):
        with capabilities.assume(capability):
            assert triton_support.pdl(CPU, 1) is hopper
            assert expert_gemv.fused(bf16) is hopper
            assert not expert_gemv.fused(bf16.half())  # the fused grouped GEMM takes bfloat16 only
            with capabilities.profile_scope("generic"):
                assert not triton_support.pdl(CPU, 1) and not expert_gemv.fused(bf16)


def test_lane_runs_inside_its_profile(monkeypatch):
    """FastConfig(profile=...) reaches every query the lane's planning and steps make."""
    seen = []
    plan_for, run_buckets = fast_lane.plan_for, fast_lane.FastLane._run_buckets

    def spy_plan(*args, **kwargs):
        seen.append(("plan", capabilities.active_profile()))
        return plan_for(*args, **kwargs)

    def spy_run(self, *args, **kwargs):
        seen.append(("step", capabilities.active_profile()))
        return run_buckets(self, *args, **kwargs)

    monkeypatch.setattr(fast_lane, "plan_for", spy_plan)
    monkeypatch.setattr(fast_lane.FastLane, "_run_buckets", spy_run)
    model = make_model("llama", 32, 2, seed=0).eval()
    lane = fast_lane.FastLane(model, Role.LLM, model.config.vocab_size, 32, FastConfig(graphs=False, profile="generic"))
    lane.warm_up()
    assert seen and set(seen) == {("plan", "generic"), ("step", "generic")}
    assert capabilities.active_profile() == "native"  # left behind by nobody
