"""The request engine's LLM calls run ahead on a guess (hf_rstitch.batching.executor): where every row was the LLM's,
its next call is queued before its hand-back decisions reach the host, and undone (a position reset of its cache)
where it handed every row back. CPU FastLanes are told to guess (``FastConfig(ahead_of_decisions=True)``), so that
decisions on the host are treated as if they came a step late.

Every request's tokens, finish reason, route, per-call records and entropies must equal those of the same engine
reading every decision first, while requests join (paced and at once), finish at different steps and one is
cancelled: the LLM alone (threshold 0: the guess kept), a policy that hands every row back at every step (every
guess undone), and mixed thresholds with sampling and a request pinned to the LLM.
"""

import dataclasses

import pytest
import torch

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch.batching.requests import Request, RequestEngine
from hf_rstitch.core.roles import Role
from hf_rstitch.decode import loop
from hf_rstitch.fast import FastConfig
from request_events import assert_same_completions, drive
from stand_in_policies import Flip
from tiny_models import make_pair, prompt

READ = FastConfig(graphs=False, max_bucket=4, run_ahead=True)  # runs ahead, reads every decision first
GUESS = dataclasses.replace(READ, ahead_of_decisions=True)
ARRIVE = {0: [0, 1, 2], 1: [3], 3: [4, 5], 6: [6, 7], 11: [8, 9]}  # step: requests


@pytest.fixture
def guesses(monkeypatch):
    """The early calls queued on a guess, by role."""
    seen = []
    original = loop.call_early

    def spy(lane, *args, **kw):
        if kw.get("guess", args[3] if len(args) > 3 else False):
            seen.append(lane.role)
        return original(lane, *args, **kw)

    monkeypatch.setattr(loop, "call_early", spy)
    return seen


def _requests(taus, pinned=(5,)) -> list[Request]:
    return [Request(prompt(3 + (5 * i) % 9, seed=40 + i)[0].tolist(), max_new_tokens=4 + (7 * i) % 15,
                    stitch_threshold=taus[i] if taus is not None else None, do_sample=i % 4 == 3,
                    seed=i if i % 4 == 3 else None, role=Role.LLM if i in pinned and taus is not None else None,
                    request_id=f"g{i}") for i in range(10)]


def _run(config: FastConfig, taus, policy=None, pinned=(5,), **kw):
    """The requests arriving at ARRIVE's steps (``pinned``: those pinned to the LLM), ``g2`` cancelled at step 5;
    completions by id, and the engine."""
    llm, slm = make_pair("llama")
    eng = RequestEngine.of(llm, slm, max_batch=4, max_length=64, engine=config, policy=policy, **kw)
    return drive(eng, _requests(taus, pinned), ARRIVE, cancel=(5, "g2")), eng


def _assert_equal(got: dict, ref: dict) -> None:
    assert got.keys() == ref.keys() == {f"g{i}" for i in range(10)}
    assert_same_completions(got, ref)
    assert ref["g2"][1] == "cancelled"


@pytest.mark.slow
@pytest.mark.parametrize("join_wait", [0, 3])
def test_the_llm_alone_runs_ahead_on_a_guess_that_is_kept(join_wait, guesses):
    taus = [0.0] * 10
    ref, _ = _run(READ, taus, join_wait=join_wait)
    assert guesses == []  # decisions read first: the host knew each call was needed
    got, guessed = _run(GUESS, taus, join_wait=join_wait)
    _assert_equal(got, ref)
    assert len(guesses) > 5 and set(guesses) == {Role.LLM} and guessed.stats["undone"] == 0


@pytest.mark.slow
def test_a_guess_undone_at_every_hand_back_writes_what_reading_first_writes(guesses):
    ref, _ = _run(READ, None, policy=Flip())
    got, guessed = _run(GUESS, None, policy=Flip())
    _assert_equal(got, ref)
    assert guessed.stats["undone"] == len(guesses) > 0  # every guess went the other way


@pytest.mark.slow
def test_mixed_thresholds_sampling_and_a_pinned_request_write_what_reading_first_writes(guesses):
    taus = [0.0, 0.4, 0.0, 0.55, 0.3, 0.0, 0.45, 0.0, 0.35, 0.6]
    ref, _ = _run(READ, taus, join_wait=2)
    got, guessed = _run(GUESS, taus, join_wait=2)
    _assert_equal(got, ref)
    assert len(guesses) > 0 and guessed.stats["ahead"] > 0


@pytest.mark.slow
def test_rows_pinned_to_the_llm_run_it_ahead_without_a_guess(guesses):
    """Every request pinned to the LLM (as a server's LLM-alone requests): the LLM keeps its rows whatever it decides,
    so its next call is queued without a guess, and nothing is undone."""
    taus, every = [0.5] * 10, tuple(range(10))
    ref, _ = _run(READ, taus, pinned=every)
    got, eng = _run(GUESS, taus, pinned=every)
    _assert_equal(got, ref)
    assert guesses == [] and eng.stats["ahead"] > 5 and eng.stats["undone"] == 0


def test_the_llm_is_next_without_a_guess_where_a_row_is_pinned_to_it():
    """next_lane: every row the LLM's, its decisions not read (``late``): unknown, unless it keeps a row anyway."""
    from hf_rstitch.decode.loop import next_lane
    from hf_rstitch.decode.step import StepOut

    every, some = torch.ones(3, dtype=torch.bool), torch.tensor([True, False, True])
    def out(writer):
        return StepOut(None, None, writer, None, None, torch.zeros(3, dtype=torch.bool), [],
                       all_llm=bool(writer.all()), no_llm=not bool(writer.any()))

    assert next_lane(out(every), late=True) is None
    assert next_lane(out(every), late=True, llm_keeps=True) is Role.LLM
    assert next_lane(out(some), late=True, llm_keeps=True) is Role.SLM
