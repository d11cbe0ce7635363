from hf_rstitch.core.roles import Role
from hf_rstitch.core.trace import CallKind, ForwardCall, StitchTrace

S, L = Role.SLM, Role.LLM


def hand_trace():
    # prompt of 5; SLM writes 2 tokens, hands over, LLM writes 2, returns; SLM writes 1
    return StitchTrace(
        roles=[S, S, L, L, S],
        entropies=[0.0, 0.01, 0.2, 0.3, 0.0],
        handovers=[False, False, True, False, False],
        slm_entropies=[0.0, 0.01, 0.5, None, 0.0],
        calls=[
            ForwardCall(S, CallKind.PREFILL, 5, 0), ForwardCall(S, CallKind.DECODE, 1, 5),
            ForwardCall(S, CallKind.DECODE, 1, 6),  # proposal discarded
            ForwardCall(L, CallKind.PREFILL, 7, 0), ForwardCall(L, CallKind.DECODE, 1, 7),
            ForwardCall(S, CallKind.RESUME, 2, 7),
        ],
    )


def test_summary_by_hand():
    s = hand_trace().summary()
    assert (s["new_tokens"], s["llm_tokens"], s["slm_tokens"]) == (5, 2, 3)
    assert s["switches"] == 2 and s["discarded_slm_tokens"] == 1
    assert s["slm_forward_calls"] == 4 and s["llm_forward_calls"] == 2
    assert s["slm_prefill_tokens"] == 5 and s["llm_prefill_tokens"] == 7
    assert s["slm_partial_prefill_tokens"] == 2 and s["llm_partial_prefill_tokens"] == 0


def test_dict_round_trip():
    t = hand_trace()
    back = StitchTrace.from_dict(t.to_dict())
    assert back == t
    assert t.to_dict()["roles"] == ["slm", "slm", "llm", "llm", "slm"]
