"""The request engine's next call queued once a step's values are read (``StepRun.wait``, ``Executor._after_read``):
where the LLM wrote every row and its hand-back decisions are still on the device, no call can run ahead of the
values, so the next one is queued as soon as the host has read them, where no row ends with them, before it makes
the step's events, hands them on and plans the next step.

CPU lanes read their decisions on the host, where every next call runs ahead at once. A device is simulated
(``simulated_device.py``): the decisions a step's lanes return count as on a device (``decode.loop.on_device``)
until the host reads the step's values, so the run-ahead inside a step declines where the LLM wrote every row, as on
a GPU. Every request's tokens, finish reason, route, per-call records and entropies must equal those of the same
engine on the host (every call run ahead at once), while requests join (paced and at once), finish at different
steps and one is cancelled."""

import pytest

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch.batching import requests as requests_module
from hf_rstitch.batching.requests import Request, RequestEngine
from hf_rstitch.core.roles import Role
from hf_rstitch.fast import FastConfig
from request_events import assert_same_completions, drive
from simulated_device import simulate_a_device
from stand_in_policies import Flip
from tiny_models import make_pair, prompt

READ = FastConfig(graphs=False, max_bucket=4, run_ahead=True)
ARRIVE = {0: [0, 1, 2], 1: [3], 3: [4, 5], 6: [6, 7], 11: [8, 9]}  # step: requests


@pytest.fixture
def on_a_device(monkeypatch):
    """Each step's hand-back decisions as a GPU's: on the device until the host reads the step's values."""
    simulate_a_device(monkeypatch, requests_module, "run_step")


@pytest.fixture
def used(monkeypatch):
    """In order: ``("after", role)`` for each call queued after a read, ``("used", role)`` for each early call a step
    used (its lane's ``account``)."""
    from hf_rstitch.batching.executor import Executor
    from hf_rstitch.decode import step as step_module

    seen, after_read, account = [], Executor._after_read, step_module._advance

    def noted_after_read(self, *args):
        before = self.stats["ahead_after_read"]
        after_read(self, *args)
        if self.stats["ahead_after_read"] > before:
            seen.append(("after", self.batch.ahead.role))

    def noted_advance(lane, ahead, *args, **kwargs):
        if ahead is not None and ahead.role is lane.role:
            seen.append(("used", lane.role))
        return account(lane, ahead, *args, **kwargs)

    monkeypatch.setattr(Executor, "_after_read", noted_after_read)
    monkeypatch.setattr(step_module, "_advance", noted_advance)
    return seen


def _each_used(seen: list) -> None:
    """Every call queued after a read is the one the next step uses: the next early call used is of its lane, before
    the next call queued after a read (a call of the wrong lane would go unused: the outputs could not tell)."""
    for i, (what, role) in enumerate(seen):
        if what == "after":
            nxt = next((x for x in seen[i + 1:] if x[0] == "used" or x[0] == "after"), None)
            assert nxt == ("used", role), (i, seen[i:i + 4])


def _requests(taus, pinned=()) -> list[Request]:
    return [Request(prompt(3 + (5 * i) % 9, seed=60 + i)[0].tolist(), max_new_tokens=4 + (7 * i) % 15,
                    stitch_threshold=taus[i] if taus is not None else None, do_sample=i % 4 == 3,
                    seed=i if i % 4 == 3 else None, role=Role.LLM if i in pinned else None,
                    request_id=f"a{i}") for i in range(10)]


def _run(taus, policy=None, pinned=(), after_read=True, **kw):
    llm, slm = make_pair("llama")
    eng = RequestEngine.of(llm, slm, max_batch=4, max_length=64, engine=READ, policy=policy, **kw)
    eng.executor.after_read = after_read
    return drive(eng, _requests(taus, pinned), ARRIVE, cancel=(5, "a2")), eng


def _assert_equal(got: dict, ref: dict) -> None:
    assert got.keys() == ref.keys() == {f"a{i}" for i in range(10)}
    assert_same_completions(got, ref)
    assert ref["a2"][1] == "cancelled"


CASES = {  # name: (thresholds, policy, run kwargs)
    "llm alone": ([0.0] * 10, None, {"join_wait": 0}),
    "hands back every step": (None, Flip(), {}),
    "mixed, sampling, paced": ([0.0, 0.4, 0.0, 0.55, 0.3, 0.0, 0.45, 0.0, 0.35, 0.6], None, {"join_wait": 2}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_next_call_queued_after_the_read_writes_what_running_ahead_at_once_writes(case, request, used):
    taus, policy, kw = CASES[case]
    ref, host = _run(taus, policy, **kw)
    assert host.stats["ahead_after_read"] == 0  # on the host every call that can run ahead does so at once
    request.getfixturevalue("on_a_device")
    got, eng = _run(taus, policy, **kw)
    _assert_equal(got, ref)
    assert eng.stats["ahead_after_read"] > 0
    _each_used(used)
    assert eng.stats["ahead"] + eng.stats["ahead_after_read"] <= host.stats["ahead"]


def test_without_it_the_llm_steps_on_a_device_do_not_run_ahead(on_a_device):
    """The simulation is what the engine meets on a GPU: with the after-read call off (``Executor.after_read``, a
    benchmark's switch), an LLM step's next call waits for the next step, and the engine still writes the same."""
    taus = [0.0] * 10
    with_it, eng = _run(taus, join_wait=0)
    without, plain = _run(taus, join_wait=0, after_read=False)
    _assert_equal(with_it, without)
    assert plain.stats["ahead_after_read"] == 0
    assert plain.stats["ahead"] < eng.stats["ahead"] + eng.stats["ahead_after_read"]


def test_rows_pinned_to_the_llm_run_ahead_before_the_read(on_a_device):
    """A row pinned to the LLM keeps it whatever it decides: its next call runs ahead inside the step, not after."""
    taus, every = [0.5] * 10, tuple(range(10))
    _, eng = _run(taus, pinned=every)
    assert eng.stats["ahead"] > 5 and eng.stats["ahead_after_read"] == 0


@pytest.mark.parametrize("max_new_tokens", [1, 6])
def test_a_lone_request_queues_its_next_call_after_every_read_but_the_last(on_a_device, max_new_tokens):
    """One client's request, the LLM alone: every step's next call waits for the read, and none follows the step whose
    token ends the request (its call would be wasted, and would delay the next request's join)."""
    llm, slm = make_pair("llama")
    eng = RequestEngine.of(llm, slm, max_batch=4, max_length=64, engine=READ, join_wait=0)
    request = Request(prompt(5, seed=1)[0].tolist(), max_new_tokens=max_new_tokens, stitch_threshold=0.0,
                      request_id="x")
    done = drive(eng, [request], {0: [0]})
    assert len(done["x"][0]) == eng.stats["steps"] == max_new_tokens
    assert eng.stats["ahead_after_read"] == max_new_tokens - 1 and eng.stats["ahead"] == 0


def test_a_request_ends_at_an_end_id_or_at_its_budget():
    from hf_rstitch.batching.request_types import RequestState
    from hf_rstitch.core.trace import StitchTrace

    state = RequestState(Request([1, 2], max_new_tokens=3), frozenset({7}), StitchTrace())
    assert [state.ending(t) for t in (7, 5)] == ["stop", None]
    state.trace.roles += [Role.SLM, Role.LLM]  # two written: the third is the last
    assert [state.ending(t) for t in (7, 5)] == ["stop", "length"]


def test_a_guess_undone_at_the_read_runs_the_slm_after_it_not_another_guess(on_a_device, used):
    """A lane told to guess (``ahead_of_decisions=True``) queues the LLM's next call before the read; where the LLM
    handed every row back, the read undoes it, and the call after the read is the SLM's, queued without a guess."""
    import dataclasses

    taus = None
    ref, _ = _run(taus, Flip())
    llm, slm = make_pair("llama")
    eng = RequestEngine.of(llm, slm, max_batch=4, max_length=64, policy=Flip(),
                           engine=dataclasses.replace(READ, ahead_of_decisions=True))
    got = drive(eng, _requests(taus), ARRIVE, cancel=(5, "a2"))
    _assert_equal(got, ref)
    assert eng.stats["undone"] > 0 and eng.stats["ahead_after_read"] > 0
    assert {role for what, role in used if what == "after"} == {Role.SLM}
    _each_used(used)
