"""What crosses the engine process's socket (hf_rstitch.serve.split): a token that does not finish its request goes
as a plain tuple, anything else whole (a finishing event's trace cut to its roles and threshold); every event comes
out in the front end as the event the engine made, whoever wrote the token."""

import pickle

import pytest

from hf_rstitch.batching.request_types import Event
from hf_rstitch.core.roles import Role
from hf_rstitch.core.trace import StitchTrace
from hf_rstitch.serve.driver import StepFailure
from hf_rstitch.serve.split import _event, _item

TRACE = StitchTrace(roles=[Role.SLM, Role.LLM], entropies=[0.1, 0.4], handovers=[False, True],
                    slm_entropies=[0.1, 0.5], threshold=0.3, policy="EntropyPolicy(threshold=0.3)")


def _across(event):
    return _event(pickle.loads(pickle.dumps(_item(event), protocol=pickle.HIGHEST_PROTOCOL)))


@pytest.mark.parametrize("role", [Role.SLM, Role.LLM, None])
def test_a_token_crosses_as_a_tuple_and_comes_out_the_same_event(role):
    event = Event("cmpl-1", 42, role)
    assert _item(event) == ("token", "cmpl-1", 42, [None, Role.SLM, Role.LLM].index(role))
    assert _across(event) == event


def test_finishing_events_cross_whole_with_their_trace_cut_to_the_roles():
    done = Event("cmpl-2", 7, Role.LLM, True, "stop", trace=TRACE)
    assert _across(done) == Event("cmpl-2", 7, Role.LLM, True, "stop",
                                  trace=StitchTrace(roles=[Role.SLM, Role.LLM], threshold=0.3))
    error = Event("cmpl-3", None, None, True, "error", error="sampling failed", error_code=None)
    assert _across(error) == error
    failure = StepFailure("cmpl-4", "the engine failed")
    assert _across(failure) == failure
