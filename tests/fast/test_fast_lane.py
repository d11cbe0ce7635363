"""FastLane on CPU (same static-cache steps as on CUDA, run eagerly): equal to the default engine.

fp64 tiny models, so "equal" means identical tokens and logits to ~1e-12. Buckets are kept small
(max_bucket=4) so routes exercise padded buckets and catch-ups longer than the largest bucket.
"""

import pytest
import torch
from transformers import DynamicCache

from hf_rstitch import ReplayPolicy, Role
from hf_rstitch.fast import FastConfig, FastEngine, FastLane
from hf_rstitch.hf.compat import with_cache
from tiny_models import make_pair, prompt

ROUTE = ["slm"] * 3 + ["llm"] * 2 + ["slm"] * 4 + ["llm"] + ["slm"] * 7 + ["llm"] * 6 + ["slm"] * 2 + ["llm"] + ["slm"]
CPU = FastConfig(max_bucket=4, graphs=False)
ARCHS = ["llama", "qwen2-full"]


def _generate(llm, slm, ids, engine, policy=None, **kw):
    return llm.generate(ids, assistant_model=slm, stitch_policy=policy or ReplayPolicy(ROUTE), stitch_engine=engine,
                        max_new_tokens=len(ROUTE), min_new_tokens=len(ROUTE), return_dict_in_generate=True, output_logits=True, **kw)


def _same(out, ref):
    assert torch.equal(out.sequences, ref.sequences)
    assert out.stitch.roles == ref.stitch.roles == [Role(r) for r in ROUTE]
    assert [(c.role, c.kind, c.n_inf, c.n_kv) for c in out.stitch.calls] == \
           [(c.role, c.kind, c.n_inf, c.n_kv) for c in ref.stitch.calls]
    for a, b in zip(out.logits, ref.logits):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("attention", ["matmul", "sdpa"])
@pytest.mark.parametrize("arch", ARCHS)
def test_fast_engine_equals_default_engine_and_reuses_lanes(arch, attention):
    llm, slm = make_pair(arch)
    ids = prompt(12)
    ref = _generate(llm, slm, ids, "default")
    engine = FastEngine(FastConfig(max_bucket=4, graphs=False, attention=attention))
    for _ in range(2):  # the second generation reuses both lanes
        _same(_generate(llm, slm, ids, engine), ref)
    assert engine.builds == 2
    # past max_bucket=4, as several bucket calls: the LLM's first call (15 tokens), catch-ups of 5 and 8
    assert engine._lanes[Role.LLM].long_calls == 3


def test_left_padded_prompt():
    llm, slm = make_pair("llama")
    ids = prompt(10)
    mask = torch.ones_like(ids)
    ids[:, :3], mask[:, :3] = 2, 0  # three pad tokens on the left
    _same(_generate(llm, slm, ids, FastEngine(CPU), attention_mask=mask),
          _generate(llm, slm, ids, "default", attention_mask=mask))


class HiddenReplay(ReplayPolicy):
    needs_hidden = True

    def __init__(self, route):
        super().__init__(route)
        self.hidden = []

    def hand_to_llm(self, step):
        self.hidden.append(step.hidden.clone())
        return super().hand_to_llm(step)


def test_hidden_states_reach_the_policy_unchanged():
    llm, slm = make_pair("qwen2-full")
    ids = prompt(9)
    ref, fast = HiddenReplay(ROUTE), HiddenReplay(ROUTE)
    _generate(llm, slm, ids, "default", policy=ref)
    _generate(llm, slm, ids, FastEngine(CPU), policy=fast)
    assert len(ref.hidden) == len(fast.hidden) > 0
    for a, b in zip(ref.hidden, fast.hidden, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_cache_slots_hold_what_a_recompute_gives():
    llm, slm = make_pair("llama")
    ids = prompt(12)
    engine = FastEngine(CPU)
    out = _generate(llm, slm, ids, engine)
    for role, model in ((Role.SLM, slm), (Role.LLM, llm)):
        lane = engine._lanes[role]
        fresh = DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=out.sequences[:, : lane.seen], **with_cache(model, fresh), use_cache=True)
        assert int(lane.cache.pos) == lane.seen
        for layer, want in enumerate(fresh.layers):
            torch.testing.assert_close(lane.cache.keys[layer][:, :, : lane.seen], want.keys)
            torch.testing.assert_close(lane.cache.values[layer][:, :, : lane.seen], want.values)


# ---- errors and fallbacks ----------------------------------------------------------------------
def test_graphs_need_cuda():
    llm, _ = make_pair("llama")
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        FastLane(llm, Role.LLM, 96, 64, FastConfig(graphs=True))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_fast_engine_on_cpu_warns_and_runs_eagerly():
    llm, slm = make_pair("llama")
    with pytest.warns(UserWarning, match="eagerly on cpu"):
        out = _generate(llm, slm, prompt(5), "fast")
    assert out.sequences.shape[1] == 5 + len(ROUTE)


def test_layer_kinds_other_than_full_and_sliding_attention_are_refused():
    llm, slm = make_pair("llama")
    llm.config.layer_types = ["chunked_attention"] * llm.config.num_hidden_layers  # as Llama 4's chunked layers
    with pytest.raises(ValueError, match=r"layer types \['chunked_attention'\]; the fast engine runs full and sliding"):
        FastLane(llm, Role.LLM, 96, capacity=8, config=CPU)


def test_capacity_overflow_is_a_clear_error():
    llm, _ = make_pair("llama")
    lane = FastLane(llm, Role.LLM, 96, capacity=8, config=CPU)
    ids = prompt(9)
    with pytest.raises(RuntimeError, match="holds 8 tokens"):
        lane.advance(ids, torch.ones_like(ids), torch.ones(1, dtype=torch.bool), torch.zeros(1, dtype=torch.bool))


def test_advancing_with_nothing_new_is_an_error():
    llm, _ = make_pair("llama")
    lane = FastLane(llm, Role.LLM, 96, capacity=32, config=CPU)
    ids, rows, resumed = prompt(5), torch.ones(1, dtype=torch.bool), torch.zeros(1, dtype=torch.bool)
    lane.advance(ids, torch.ones_like(ids), rows, resumed)
    with pytest.raises(RuntimeError, match="nothing new"):
        lane.advance(ids, torch.ones_like(ids), rows, resumed)


@pytest.mark.parametrize("spec", ["fastest", 3, ""])  # None is no engine named: "auto"
def test_unknown_engine_is_refused(spec):
    llm, slm = make_pair("llama")
    with pytest.raises(ValueError, match="stitch_engine must be"):
        _generate(llm, slm, prompt(5), spec)


@pytest.mark.parametrize("kw", [{"max_bucket": 12}, {"compile": "yes"}, {"attention": "flash"}])
def test_bad_config_is_refused(kw):
    with pytest.raises(ValueError):
        FastConfig(**kw)


@pytest.mark.parametrize("at_build", [False, True])
def test_warm_up_captures_every_bucket_and_changes_nothing(at_build):
    llm, slm = make_pair("llama")
    ids = prompt(12)
    ref = _generate(llm, slm, ids, "default")
    engine = FastEngine(FastConfig(max_bucket=4, graphs=False, warm_up=at_build))
    _same(_generate(llm, slm, ids, engine), ref)  # builds the lanes (warmed up when at_build)
    for lane in engine._lanes.values():
        assert lane.warm_up() >= 0
        assert lane.seen == 0 and int(lane.cache.pos) == 0
    _same(_generate(llm, slm, ids, engine), ref)
    assert engine.builds == 2


def test_fast_by_name_keeps_the_engine_on_the_llm():
    """stitch_engine="fast" / a FastConfig: later generate calls on the same LLM reuse its lanes and graphs."""
    from hf_rstitch.fast import engine_for, release

    llm, slm = make_pair("llama")
    ids = prompt(8)
    ref = _generate(llm, slm, ids, "default")
    for _ in range(2):
        _same(_generate(llm, slm, ids, CPU), ref)
    engine = engine_for(llm, CPU)
    assert engine.builds == 2  # one lane per model, built by the first call only
    release(llm)
    assert engine_for(llm, CPU) is not engine


def test_lanes_are_built_for_whole_capacity_steps_and_reused_across_lengths():
    """Generations of other lengths reuse the lanes while they fit the step the lanes were built for."""
    llm, slm = make_pair("llama")
    engine = FastEngine(CPU, capacity_step=64)
    route = ["slm", "llm"] * 4
    for length, new in ((12, 8), (20, 8), (9, 40)):  # 20, 28, 49 tokens: one 64-token step
        llm.generate(prompt(length), assistant_model=slm, stitch_policy=ReplayPolicy(route * 5), stitch_engine=engine,
                     max_new_tokens=new)
    assert engine.builds == 2 and engine._lanes[Role.LLM].capacity == 64
    llm.generate(prompt(30), assistant_model=slm, stitch_policy=ReplayPolicy(route * 5), stitch_engine=engine,
                 max_new_tokens=40)  # 70 tokens: the next step
    assert engine.builds == 4 and engine._lanes[Role.LLM].capacity == 128
    with pytest.raises(ValueError, match="capacity_step must be >= 1"):
        FastEngine(CPU, capacity_step=0)


def test_warm_up_at_build_leaves_no_graph_for_a_later_call_to_capture(monkeypatch):
    """``warm_up`` (on in ``"auto"``): every (batch bucket, length bucket) a call can run is run once when the lanes
    are built, so no later call -- routes with catch-ups of every length, a smaller batch, rows finishing --
    meets a graph it would have to capture mid-way. Counted on CPU by the first run of each graph key."""
    from hf_rstitch.fast import AUTO, bucket_for

    assert AUTO.warm_up
    keys: dict[int, set] = {}
    first_runs: list[tuple] = []
    run_bucket = FastLane._run_bucket

    def counting(lane, new_ids, want_hidden):
        key = (lane.rows.bucket, bucket_for(new_ids.shape[1], lane.buckets), want_hidden)
        if key not in keys.setdefault(id(lane), set()):
            keys[id(lane)].add(key)
            first_runs.append((lane.role, key))
        return run_bucket(lane, new_ids, want_hidden)

    monkeypatch.setattr(FastLane, "_run_bucket", counting)
    llm, slm = make_pair("llama")
    engine = FastEngine(FastConfig(max_bucket=4, graphs=False, warm_up=True), max_batch=3)
    _generate(llm, slm, prompt(12), engine)
    captured = len(first_runs)
    lane = engine._lanes[Role.LLM]
    assert captured == 2 * len(lane.rows.sizes) * len(lane.buckets)  # lanes x batch buckets x length buckets
    routes = [["llm"] * k + ["slm"] * k for k in (1, 2, 3, 5, 7)]
    for batch in (1, 2, 3):
        ids = prompt(9).expand(batch, -1).contiguous()
        for route in routes:
            llm.generate(ids, assistant_model=slm, stitch_policy=ReplayPolicy(route * 3), stitch_engine=engine,
                         max_new_tokens=len(route) * 3)
    assert engine.builds == 2 and first_runs[captured:] == []


@pytest.mark.parametrize("fails", [False, True])
def test_kernels_built_ahead_change_nothing(monkeypatch, fails):
    """The eager steps a lane runs at build to compile its kernels ahead (FastLane.ahead.steps; on CUDA each launch
    compiled, not run) leave no trace: the same tokens and logits as the default engine, the cache zeroed, the
    lane reset; and a failure in them only leaves the kernels to the captures."""
    import contextlib

    from hf_rstitch.fast.kernels import triton_support

    entered = []

    @contextlib.contextmanager
    def compile_ahead(jobs, device=None):
        entered.append(device)
        if fails:
            raise RuntimeError("a compile that fails")
        yield

    monkeypatch.setattr(triton_support, "ahead_possible", lambda device: True)
    monkeypatch.setattr(triton_support, "compile_ahead", compile_ahead)
    llm, slm = make_pair("llama")
    ids = prompt(12)
    ref = _generate(llm, slm, ids, "default")
    engine = FastEngine(CPU)
    _same(_generate(llm, slm, ids, engine), ref)
    assert len(entered) == 2 and all(lane.build_seconds["steps_ahead"] >= 0 for lane in engine._lanes.values())
    assert [lane.ahead_error for lane in engine._lanes.values()] == ["RuntimeError: a compile that fails" if fails
                                                                     else None] * 2
