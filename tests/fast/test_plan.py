"""FastPlan (hf_rstitch.fast.plan): which kernels and patches a lane runs, decided by one pure function, and a
lane that builds what its plan names."""

import os

import pytest
import torch

from hf_rstitch import Role
from hf_rstitch.fast import FastConfig, FastLane, FastPlan, plan_for
from hf_rstitch.fast.kernels import triton_support
from tiny_models import make_model

CPU = FastConfig(max_bucket=4, graphs=False)
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1" and triton_support.available(torch.device("cpu"))


def test_plan_on_cpu_names_the_eager_kernels():
    model = make_model("llama", 32, 2, 0)
    plan = plan_for(model, CPU, max_rows=3)
    if not INTERPRETED:
        assert (plan.attention, plan.products, plan.gemv_tiers, plan.rope_store, plan.read_out) == \
               ("matmul", "cublas", (), False, "eager")
    assert not plan.graphs and plan.compile is None and not plan.add_norm and not plan.fold_norms
    assert plan.batch_buckets == (1, 2, 3) and plan.length_buckets == (1, 2, 4)
    assert plan.windows == (None, None) and plan.experts is None and plan.rotary_table
    assert plan.pdl == "off" and not plan.run_ahead  # run-ahead follows graphs
    assert plan_for(model, CPU, max_rows=3) == plan  # pure: the same answer twice, nothing built
    assert FastPlan(**plan.as_dict()) == plan


def test_plan_follows_the_config():
    model = make_model("qwen2", 32, 2, 0)  # a sliding window of 6 on every layer
    parts = plan_for(model, FastConfig(graphs=False, compile="parts"))
    assert parts.add_norm and parts.rotary_table and parts.windows == (6, 6)
    whole = plan_for(model, FastConfig(graphs=False, compile="decode", rotary_table=True, attention="sdpa"))
    assert not whole.add_norm and not whole.rotary_table and not whole.rope_store and whole.attention == "sdpa"
    assert plan_for(model, FastConfig(graphs=False, run_ahead=True)).run_ahead


def test_plan_prints_one_line_per_choice():
    plan = plan_for(make_model("qwen2", 32, 2, 0), FastConfig(graphs=False, compile="parts"), max_rows=2)
    text = str(plan)
    lines = text.splitlines()
    assert lines[0] == "FastLane plan for Qwen2ForCausalLM (cpu, torch.float64, up to 2 rows)"
    names = [line.split()[0] for line in lines[1:]]
    assert names == ["graphs", "compile", "attention", "products", "norms", "rotary", "windows", "experts",
                     "read-out", "launch", "decisions"] + ["module"] * len(plan.modules)  # then one line per module class
    assert {(c.part, c.module, c.count) for c in plan.modules} == {("norm", "Qwen2RMSNorm", 5),
                                                                   ("layer", "Qwen2DecoderLayer", 2)}
    assert "sliding window 6 on 2 of 2 layers" in text and "batch buckets 1, 2" in text


@pytest.mark.parametrize("attention", ["matmul", "sdpa", "split"])
def test_lane_builds_what_its_plan_names(attention):
    model = make_model("llama", 32, 2, 0)
    config = FastConfig(max_bucket=4, graphs=False, attention=attention)
    lane = FastLane(model, Role.SLM, 96, 16, config, max_rows=2)
    assert lane.plan == plan_for(model, config, max_rows=2)
    assert (lane.graphs is not None) == lane.plan.graphs
    assert (lane._no_mask is not None) == lane.plan.mask_free
    assert bool(lane.gemv_layers) == (lane.plan.products == "triton")
    assert lane.cache.fused_store == lane.plan.rope_store >= bool(lane._rotary)  # rotation: float32 / 16 only
    assert lane._experts.kind == lane.plan.experts
    assert lane._attention.startswith(f"rstitch_{lane.plan.attention}_")


@pytest.mark.skipif(not INTERPRETED, reason="the Triton kernels on CPU need TRITON_INTERPRET=1")
def test_plan_with_triton_names_the_kernels():
    model = make_model("llama", 32, 2, 0).float()
    plan = plan_for(model, FastConfig(graphs=False, compile="parts"), max_rows=32)
    assert (plan.attention, plan.mask_free, plan.products) == ("split", False, "triton")  # head size 8: no kernel
    assert plan.gemv_tiers == (1, 16, 64) and plan.fuse_qkv and plan.fuse_mlp and plan.fold_norms
    assert plan_for(model, FastConfig(graphs=False), max_rows=16).gemv_tiers == (1, 16)
    assert not plan_for(model, FastConfig(graphs=False, gemv=False)).fold_norms


def test_env_prints_the_plans_of_the_shipped_pair():
    from hf_rstitch.cli.env import fast_plans

    plans = fast_plans("cpu")
    assert set(plans) == {"llm", "slm"} and all(p.compile == "parts" and p.device == "cpu" for p in plans.values())


def test_parts_stay_off_where_not_bit_equal():
    """Model types whose compiled pieces differed from the eager engine (regions.NOT_BIT_EQUAL) plan no compile, with
    the reason in the printed plan; the others keep compile="parts"."""
    from hf_rstitch.fast.patches import regions
    from zoo_models import build_pair

    assert "granitemoe" in regions.NOT_BIT_EQUAL
    llm, _ = build_pair("granitemoe")
    plan = plan_for(llm, FastConfig(graphs=False, compile="parts"))
    assert plan.compile is None and not plan.add_norm and "NOT_BIT_EQUAL" in plan.compile_note
    assert "compile      none (granitemoe: compiled parts were not bit-equal" in str(plan)
    assert plan_for(llm, FastConfig(graphs=False)).compile_note is None
    llama, _ = build_pair("llama")
    assert plan_for(llama, FastConfig(graphs=False, compile="parts")).compile == "parts"
