"""The generate loop's guessed steps (``stitch_loop(guess=True)``, :mod:`hf_rstitch.decode.loop`): a step goes on
before its routing decisions reach the host -- the SLM's next step run ahead over the SLM's own token, the LLM's
next step while it keeps its rows -- and is rolled back (a position reset of the lane's cache) where a decision
went the other way; sampled tokens are drawn again from the same random state.

On CUDA the fast engine guesses where the policy decides on the device; here CPU FastLanes are told to
(``FastConfig(ahead_of_decisions=True)``), so that decisions on the host are treated as if they came a step late.
Every output must equal the eager engine's (which reads every decision first) and the fast engine's without
guessing: tokens, logits, roles, per-row forward-call records and the tokens a streamer is shown. Policies that hand
over at every step (:class:`Flip`, :class:`RouterFlip`) roll a guess back at every step; the entropy rule at
middle thresholds mixes kept and undone guesses across rows.

fp64 tiny models: identical tokens, logits to 1e-9.
"""

import dataclasses

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from hf_rstitch import Role
from hf_rstitch.core.policies import EntropyPolicy
from hf_rstitch.decode import loop
from hf_rstitch.fast import FastConfig, FastEngine
from hf_rstitch.router.model import Router
from hf_rstitch.router.policy import RouterPolicy
from engine_checks import assert_same_run
from stand_in_policies import Flip
from tiny_models import Shown, left_pad, make_pair, prompt

READ = FastConfig(max_bucket=4, graphs=False, run_ahead=True)  # runs ahead, reads every decision first
GUESS = dataclasses.replace(READ, ahead_of_decisions=True)
PAGED = dataclasses.replace(GUESS, paged=True)
N = 12


class RouterFlip(Flip):
    """The router's device decisions hand every proposal over (it votes LLM; tau 0 asks every row); every LLM row
    comes back."""

    needs_hidden = True

    def __init__(self, slm):
        torch.manual_seed(0)
        router = Router(slm.config.hidden_size, width=8, num_blocks=2, llm_bias=20.0).double().eval()
        self.router = RouterPolicy(router, threshold=0.0)

    def hand_to_llm(self, step):
        return self.router.hand_to_llm(step)


@pytest.fixture
def undone(monkeypatch):
    """The guessed early calls rolled back, by role."""
    seen = []
    original = loop.roll_back

    def spy(lanes, ahead):
        if ahead is not None and ahead.since is not None:
            seen.append(ahead.role)
        return original(lanes, ahead)

    monkeypatch.setattr(loop, "roll_back", spy)
    return seen


def _traces(out):
    return out.stitch if isinstance(out.stitch, list) else [out.stitch]


def _same(out, ref):
    assert_same_run(out, ref)  # tokens, routes, call records, entropies, logits
    assert [t.handovers for t in _traces(out)] == [t.handovers for t in _traces(ref)]
    for a, b in zip(out.scores or (), ref.scores or ()):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def _batch(rows: int):
    if rows == 1:
        ids = prompt(9)
        return ids, torch.ones_like(ids)
    return left_pad([prompt(3 + (5 * i) % 7, seed=70 + i) for i in range(rows)])


def _runs(llm, slm, ids, mask, policy, engines, sample=False, **kw):
    """Per engine: the output and the streamer's tensors, each run from the same random state."""
    kw.setdefault("max_new_tokens", N)
    kw.setdefault("min_new_tokens", N)
    got = []
    for engine in engines:
        shown = Shown()
        torch.manual_seed(5)
        out = llm.generate(ids, attention_mask=mask, assistant_model=slm, stitch_engine=engine, stitch_policy=policy(),
                           return_dict_in_generate=True, output_logits=True, do_sample=sample,
                           streamer=shown if ids.shape[0] == 1 else None, **kw)
        got.append((out, shown.puts))
    return got


def _all_same(got):
    (ref, ref_shown), *rest = got
    for out, shown in rest:
        _same(out, ref)
        assert len(shown) == len(ref_shown) and all(torch.equal(a, b) for a, b in zip(shown, ref_shown))


EIGHT = pytest.param(8, marks=pytest.mark.slow)  # ~4 s on 2 cores


@pytest.mark.parametrize("rows", [1, EIGHT])
@pytest.mark.parametrize("sample", [False, True])
@pytest.mark.parametrize("policy", ["flip", "router"])
def test_a_hand_over_at_every_step_rolls_back_and_equals_the_eager_engine(rows, sample, policy, undone):
    llm, slm = make_pair("llama")
    ids, mask = _batch(rows)
    make = Flip if policy == "flip" else (lambda: RouterFlip(slm))
    got = _runs(llm, slm, ids, mask, make, ["default", FastEngine(READ), FastEngine(GUESS)], sample)
    _all_same(got)
    assert all(t.roles == [Role.LLM] * N and all(t.handovers) for t in _traces(got[0][0]))
    # every step: the SLM's guess undone (the LLM writes), then the LLM's guess undone (it hands every row back)
    assert undone.count(Role.SLM) >= N - 1 and undone.count(Role.LLM) >= N - 1, undone


@pytest.mark.parametrize("rows", [1, EIGHT])
@pytest.mark.parametrize("sample", [False, True])
def test_entropy_rule_equals_the_eager_engine(rows, sample, undone):
    """Middle thresholds: some steps keep the guess, some undo it, rows differ (B = 8)."""
    llm, slm = make_pair("qwen2-full")
    ids, mask = _batch(rows)
    kept = 0
    for tau in (0.7, 0.75):
        got = _runs(llm, slm, ids, mask, lambda tau=tau: EntropyPolicy(tau), ["default", FastEngine(GUESS)], sample)
        _all_same(got)
        roles = [t.roles for t in _traces(got[0][0])]
        kept += sum(all(r[i] is Role.SLM for r in roles) for i in range(N))
    assert undone and kept, (undone, kept)


@pytest.mark.slow
def test_paged_cache_rolls_back_as_the_static_one(undone):
    llm, slm = make_pair("llama")
    ids, mask = _batch(3)
    _all_same(_runs(llm, slm, ids, mask, Flip, ["default", FastEngine(PAGED)], True))
    _all_same(_runs(llm, slm, ids, mask, lambda: EntropyPolicy(0.7), ["default", FastEngine(PAGED)]))
    assert undone


def test_llm_keeping_control_runs_ahead_and_keeps_its_guess(undone):
    """tau 0: every SLM proposal goes over and the LLM never hands back: its guessed calls are all kept."""
    llm, slm = make_pair("llama")
    ids, mask = _batch(4)
    _all_same(_runs(llm, slm, ids, mask, lambda: EntropyPolicy(0.0), ["default", FastEngine(GUESS)], True))
    assert undone == [Role.SLM]  # the first step's SLM guess only


def test_rows_finishing_at_different_steps_with_guesses(undone):
    """End tokens stop rows in the middle (dropped from the lanes, or kept running when logits are returned)."""
    llm, slm = make_pair("llama")
    ids, mask = _batch(3)
    free = _runs(llm, slm, ids, mask, lambda: EntropyPolicy(0.7), ["default"], min_new_tokens=0)[0][0]
    new = free.sequences[:, ids.shape[1]:]
    eos = [int(new[1, 4]), int(new[2, 8])]
    for logits in (False, True):
        outs = []
        for engine in ("default", FastEngine(GUESS)):
            outs.append(llm.generate(ids, attention_mask=mask, assistant_model=slm, stitch_engine=engine,
                                     stitch_policy=EntropyPolicy(0.7), eos_token_id=eos, pad_token_id=2,
                                     max_new_tokens=N, output_logits=logits, return_dict_in_generate=True))
        _same(outs[1], outs[0])
        assert min(t.n_tokens for t in _traces(outs[0])) < N
    assert undone


class Counting(LogitsProcessor):
    """A processor from outside transformers: not known to be pure (it counts its calls)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, input_ids, scores):
        self.calls += 1
        return scores


def test_a_processor_not_known_to_be_pure_turns_guessing_off(undone):
    llm, slm = make_pair("llama")
    ids = prompt(7)
    counts, outs = [], []
    for engine in ("default", FastEngine(GUESS)):
        counting = Counting()
        outs.append(llm.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=slm, stitch_engine=engine,
                                 stitch_policy=Flip(), logits_processor=LogitsProcessorList([counting]),
                                 max_new_tokens=N, min_new_tokens=N, return_dict_in_generate=True, output_scores=True))
        counts.append(counting.calls)
    _same(outs[1], outs[0])
    assert counts[0] == counts[1] == N and not undone


def test_transformers_processors_keep_guessing_on(undone):
    """Sampling warpers and a repetition penalty are transformers' own: pure, called again for an undone step."""
    llm, slm = make_pair("llama")
    ids, mask = _batch(2)
    kw = dict(top_k=20, top_p=0.9, temperature=0.8, repetition_penalty=1.3)
    _all_same(_runs(llm, slm, ids, mask, Flip, ["default", FastEngine(GUESS)], True, **kw))
    assert undone


def test_crop_forgets_read_columns_only():
    from hf_rstitch.fast.lane import FastLane

    llm, _ = make_pair("llama")
    lane = FastLane(llm, Role.LLM, 96, 32, FastConfig(max_bucket=4, graphs=False))
    ids = prompt(6)
    nobody = torch.zeros(1, dtype=torch.bool)
    lane.advance(ids, torch.ones_like(ids), nobody, nobody)
    longer = torch.cat([ids, torch.tensor([[7]])], dim=1)
    once, _, _ = lane.advance(longer, torch.ones_like(longer), nobody, nobody)
    lane.crop(6)
    assert lane.seen == 6 and int(lane.cache.pos) == 6
    again, _, _ = lane.advance(longer, torch.ones_like(longer), nobody, nobody)
    torch.testing.assert_close(again, once, rtol=0, atol=0)
    with pytest.raises(ValueError, match="cannot crop to 9 columns"):
        lane.crop(9)


def test_plan_and_lanes_say_where_decisions_are_read():
    from hf_rstitch.decode.lane import Lane
    from hf_rstitch.decode.step import decides_late
    from hf_rstitch.fast.plan import plan_for

    llm, _ = make_pair("llama")
    on_host = torch.zeros(2, dtype=torch.bool)
    on_device = torch.zeros(2, dtype=torch.bool, device="meta")
    assert "read on the host" in str(plan_for(llm, FastConfig(graphs=False)))
    assert "read on the host" in str(plan_for(llm, READ))  # the default: the host reads every decision first
    assert "a policy deciding on the host" in str(plan_for(llm, dataclasses.replace(READ, ahead_of_decisions=None)))
    assert "rolled back at a hand-over" in str(plan_for(llm, GUESS))
    eager = Lane(llm, Role.LLM, 96)
    assert not decides_late(eager, on_device)

    class Ahead:
        run_ahead, ahead_of_decisions = True, None

    assert decides_late(Ahead(), on_device) and not decides_late(Ahead(), on_host)
    Ahead.ahead_of_decisions = True
    assert decides_late(Ahead(), on_host)


def test_a_lane_left_to_itself_asks_the_gate():
    from hf_rstitch.core.guessing import GuessGate
    from hf_rstitch.decode.step import decides_late

    class Auto:
        run_ahead, ahead_of_decisions, role = True, None, Role.SLM

    on_device = torch.zeros(2, dtype=torch.bool, device="meta")
    gate = GuessGate()
    assert decides_late(Auto(), on_device, gate)
    gate.saw(Role.SLM, True)
    assert not decides_late(Auto(), on_device, gate)
    Auto.ahead_of_decisions = True  # told to: guesses whatever the gate says
    assert decides_late(Auto(), on_device, gate)
