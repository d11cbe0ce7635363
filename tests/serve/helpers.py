"""Shared pieces of the server tests: the scripted answer, an app over the fake engine, SSE parsing."""

from __future__ import annotations

import json

from serve.fake_engine import FakeEngine

# "So 12 + 7 = 19." then <|end|> (id 3) in the shipped pair's vocabulary
SCRIPT = [74, 17, 8, 28, 23, 27, 17, 15, 26]
SCRIPT_TEXT = "So 12 + 7 = 19."
EOS = 3
CHAT = {"messages": [{"role": "user", "content": "Tom has 12 apples and buys 7 more. How many apples does he have?"}]}


def make_app(tokenizer, engine=None, **settings):
    """(app, engine): the server over ``engine`` (default: a FakeEngine answering SCRIPT)."""
    from hf_rstitch.serve.app import ServerSettings, create_app

    engine = engine or FakeEngine(SCRIPT, eos=EOS)
    settings.setdefault("max_context", 768)
    settings.setdefault("vocab_size", 131)
    settings.setdefault("disconnect_poll_s", 0.05)
    return create_app(engine, tokenizer, ServerSettings(**settings)), engine


def sse_events(lines) -> list:
    """The JSON payloads of a server-sent-event stream, with "[DONE]" kept as a string."""
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def fake_build(step_s: float = 0.0, repeat: int = 1, engine_vocab: int | None = None, **settings):
    """``(FakeEngine answering SCRIPT * repeat, ServerSettings)`` as ``make_app`` makes them: what a split server's
    engine process builds in the tests (picklable through ``functools.partial``)."""
    from hf_rstitch.serve.app import ServerSettings

    settings = {"max_context": 768, "vocab_size": 131, "disconnect_poll_s": 0.05, **settings}
    return FakeEngine(SCRIPT * repeat, eos=EOS, step_s=step_s, vocab=engine_vocab), ServerSettings(**settings)
