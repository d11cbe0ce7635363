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
