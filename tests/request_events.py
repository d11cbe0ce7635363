"""Collecting a request engine's events by request (the serving tests' drivers share it)."""

from __future__ import annotations


def gather(events, tokens: dict, done: dict, last=lambda e: e.trace) -> None:
    """Each event's token onto ``tokens[request_id]``; a finished request's ``(tokens, finish_reason, last(event))``
    into ``done`` (its tokens leave ``tokens``)."""
    for e in events:
        if e.token is not None:
            tokens.setdefault(e.request_id, []).append(e.token)
        if e.finished:
            done[e.request_id] = (tokens.pop(e.request_id, []), e.finish_reason, last(e))


def route_record(e) -> tuple:
    """A finished request's route, entropies and per-call records (what the run-ahead tests compare)."""
    return e.trace.roles, e.trace.entropies, [(c.role, c.kind, c.n_inf, c.n_kv) for c in e.trace.calls]


def drive(engine, requests: list, arrive: dict, cancel: tuple[int, str] | None = None, last=route_record) -> dict:
    """Step ``engine`` until nothing is left, submitting ``requests[i]`` at the steps ``arrive`` names (``{step: [i,
    ...]}``), cancelling request ``cancel[1]`` at step ``cancel[0]`` and checking the bookkeeping after each step:
    every completion by id, as :func:`gather` records it."""
    tokens, done, k = {}, {}, 0
    while engine.has_work() or k <= max(arrive):
        for i in arrive.get(k, []):
            engine.submit(requests[i])
        if cancel is not None and k == cancel[0]:
            engine.cancel(cancel[1])
        gather(engine.step(), tokens, done, last=last)
        engine.check_consistent()
        k += 1
    return done


def assert_same_completions(got: dict, ref: dict) -> None:
    """Two :func:`drive` results (``last=route_record``) equal: the same requests, each with the same tokens, finish
    reason, route and per-call records, and entropies within 1e-5."""
    import pytest

    assert got.keys() == ref.keys()
    for rid, (tokens, reason, (roles, entropies, calls)) in ref.items():
        g_tokens, g_reason, (g_roles, g_entropies, g_calls) = got[rid]
        assert (g_tokens, g_reason, g_roles, g_calls) == (tokens, reason, roles, calls), rid
        assert g_entropies == pytest.approx(entropies, abs=1e-5), rid
