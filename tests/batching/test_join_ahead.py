"""Joins ahead (hf_rstitch.batching.executor, scheduler.join_ahead): where a waiting request would join at the next
step, it is taken at the end of this step's calls -- before the host reads the step's values -- its rows join the
batch (each lane's prefill queued behind the step) and the next step's first call still runs ahead, its first token
read in that call.

Every request's tokens, finish reason, route, per-call records and entropies must equal those of the same engine
joining at a step's start (``Executor.join_ahead`` None: no call runs ahead of a join), while requests arrive at
different steps, finish at different steps and one is cancelled: stitched with mixed thresholds, sampling and a
request pinned to the LLM (joins at once and paced), the LLM alone (every request pinned), and paged KV memory whose
blocks limit admission. CPU FastLanes run ahead (``FastConfig(run_ahead=True)``) so that the path is the GPU's.
"""

import pytest
import torch

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch.batching import executor as executor_module
from hf_rstitch.batching.requests import Request, RequestEngine
from hf_rstitch.core.roles import Role
from hf_rstitch.decode.step import Routing
from hf_rstitch.fast import FastConfig
from request_events import drive
from tiny_models import make_pair, prompt

AHEAD = FastConfig(graphs=False, max_bucket=4, run_ahead=True)
ARRIVE = {0: [0, 1, 2], 1: [3], 2: [4], 3: [5, 6], 5: [7], 7: [8, 9], 9: [10, 11]}  # step: requests


def _requests(taus, pinned) -> list[Request]:
    return [Request(prompt(3 + (5 * i) % 11, seed=70 + i)[0].tolist(), max_new_tokens=3 + (7 * i) % 13,
                    stitch_threshold=taus[i], do_sample=i % 4 == 3, seed=i if i % 4 == 3 else None,
                    role=Role.LLM if i in pinned else None, request_id=f"j{i}") for i in range(12)]


def _run(ahead: bool, taus, pinned=(), **kw):
    """The requests arriving at ARRIVE's steps, ``j4`` cancelled at step 6; completions by id, and the engine."""
    llm, slm = make_pair("llama")
    eng = RequestEngine.of(llm, slm, max_batch=4, max_length=96, engine=AHEAD, **kw)
    if not ahead:
        eng.executor.join_ahead = None  # joins at a step's start: the step before them runs nothing ahead
    return drive(eng, _requests(taus, pinned), ARRIVE, cancel=(6, "j4")), eng


def _assert_equal(got: dict, ref: dict) -> None:
    assert got.keys() == ref.keys() == {f"j{i}" for i in range(12)}
    for rid, (tokens, reason, (roles, entropies, calls)) in ref.items():
        g_tokens, g_reason, (g_roles, g_entropies, g_calls) = got[rid]
        if rid == "j4":  # cancelled at a fixed step: how far it got depends on when it joined, not what it wrote
            n = min(len(tokens), len(g_tokens))
            assert g_reason == reason == "cancelled" and n > 0
            assert (g_tokens[:n], g_roles[:n]) == (tokens[:n], roles[:n]), rid
            continue
        assert (g_tokens, g_reason, g_roles, g_calls) == (tokens, reason, roles, calls), rid
        assert g_entropies == pytest.approx(entropies, abs=1e-5), rid


MIXED = [0.0, 0.4, 0.0, 0.55, 0.3, 0.0, 0.45, 0.0, 0.35, 0.6, 0.25, 0.5]


@pytest.mark.slow
@pytest.mark.parametrize("join_wait", [0, 2])
def test_stitched_rows_joining_ahead_write_what_joining_at_a_step_start_writes(join_wait):
    ref, before = _run(False, MIXED, pinned=(5,), join_wait=join_wait, join_group=2)
    got, eng = _run(True, MIXED, pinned=(5,), join_wait=join_wait, join_group=2)
    _assert_equal(got, ref)
    assert before.stats["joined_ahead"] == 0 and eng.stats["joined_ahead"] > 3
    assert eng.stats["ahead"] > before.stats["ahead"]  # the steps before a join ran their next call ahead too


@pytest.mark.slow
def test_the_llm_alone_joins_ahead_and_its_next_call_runs_ahead_at_every_join():
    every = tuple(range(12))
    ref, before = _run(False, [0.5] * 12, pinned=every)
    got, eng = _run(True, [0.5] * 12, pinned=every)
    _assert_equal(got, ref)
    assert eng.stats["joined_ahead"] > 3 and eng.stats["ahead"] > before.stats["ahead"]


@pytest.mark.slow
def test_paged_rows_join_ahead_within_the_pool_and_write_the_same():
    """A pool of 160 tokens a lane: admission is limited by blocks (counted with the column a step not read yet
    writes), and nothing is lost."""
    ref, _ = _run(False, MIXED, pinned=(5,), kv_tokens=160)
    got, eng = _run(True, MIXED, pinned=(5,), kv_tokens=160)
    _assert_equal(got, ref)
    assert eng.stats["joined_ahead"] > 0
    for lane in eng.lanes.values():
        assert lane.kv_pool.allocator.n_free == lane.kv_pool.allocator.usable, lane.role


@pytest.mark.slow
def test_a_join_ahead_is_queued_after_the_steps_calls_and_before_its_values_are_read(monkeypatch):
    order = []
    join, wait = executor_module.Executor.join, executor_module.StepRun.wait

    def joined(self, rows, new, staged=None):
        order.append(("join", len(new)))
        return join(self, rows, new, staged)

    def waited(self):
        order.append(("read", len(self.out.writer_llm)))
        return wait(self)

    monkeypatch.setattr(executor_module.Executor, "join", joined)
    monkeypatch.setattr(executor_module.StepRun, "wait", waited)
    llm, slm = make_pair("llama")
    eng = RequestEngine.of(llm, slm, max_batch=4, max_length=64, engine=AHEAD, threshold=0.4)
    for i in range(2):
        eng.submit(Request(prompt(5, seed=i)[0].tolist(), max_new_tokens=6, eos_token_id=[], request_id=f"a{i}"))
    eng.step()  # the first two join an empty batch at the step's start
    eng.step()
    eng.submit(Request(prompt(7, seed=9)[0].tolist(), max_new_tokens=3, eos_token_id=[], request_id="late"))
    order.clear()
    eng.step()
    assert order == [("join", 1), ("read", 2)]  # joined after the 2-row step's calls, before its values were read
    assert eng.executor.ran_ahead and len(eng.executor.batch) == 3
    events = eng.step()
    assert [e.request_id for e in events if e.token is not None] == ["a0", "a1", "late"]


def test_the_routing_of_rows_that_joined_after_a_step_is_theirs_after_its_values():
    """Routing.after with rows past the step's: the step's rows follow its values, the joined keep their start."""
    routing = Routing.start(3)
    routing.add([False, True])  # two rows join after the step's calls: the second pinned to the LLM
    writer = torch.tensor([True, False, True])
    routing.after(writer, torch.tensor([False, False, True]))
    assert routing.llm_on.tolist() == [True, False, False, False, True]
    assert routing.last_llm.tolist() == [True, False, True, False, False]
    assert routing.waited.tolist() == [0] * 5 and not routing.slm_only


ZOO = ["llama", "gemma3_text", "mistral", "qwen2_moe", "gpt_oss", "phi3", "gpt2", "gpt_neox", "cohere2", "olmoe"]


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ZOO)
def test_joins_ahead_write_what_joins_at_a_step_start_write_across_the_zoo(model_type):
    """Architectures of the fast engine's proven zoo that differ where a join could go wrong -- sliding windows
    (mistral, gemma3, cohere2, gpt_oss), experts (qwen2_moe, gpt_oss, olmoe), learned or partial positions (gpt2,
    gpt_neox), fused projections (phi3): requests arriving over time on paged CPU FastLanes that run ahead, at a
    threshold where routes mix, write the same tokens and routes joining ahead as joining at a step's start."""
    from zoo_models import VOCAB, request_pair

    llm, slm, tau = request_pair(model_type)
    g = torch.Generator().manual_seed(11)
    reqs = [dict(input_ids=torch.randint(3, VOCAB, (3 + (5 * i) % 9,), generator=g).tolist(),
                 max_new_tokens=3 + (7 * i) % 11, eos_token_id=[], request_id=f"z{i}") for i in range(9)]
    arrive = {0: [0, 1, 2], 1: [3], 3: [4, 5], 6: [6, 7], 8: [8]}
    got = {}
    for ahead in (False, True):
        eng = RequestEngine.of(llm, slm, max_batch=3, max_length=64, engine=AHEAD, threshold=tau, kv_tokens=256)
        if not ahead:
            eng.executor.join_ahead = None
        done = drive(eng, [Request(**r) for r in reqs], arrive, last=lambda e: e.trace.roles)
        got[ahead] = (done, dict(eng.stats))
    (ref, before), (new, after) = got[False], got[True]
    assert new == ref and len(ref) == 9
    assert after["joined_ahead"] > 0 and after["ahead"] > before["ahead"], (before, after)
    assert {r for _, _, roles in ref.values() for r in roles} == {Role.SLM, Role.LLM}, "routes do not mix"
