"""Events from the driver thread to the handlers (hf_rstitch.serve.handover), and the paced streams they make."""

from __future__ import annotations

import asyncio
import threading

import pytest

from hf_rstitch.core.roles import Role
from hf_rstitch.batching.request_types import Event
from hf_rstitch.serve.handover import Pacer, PostOffice
from hf_rstitch.serve.responses import Transcript
from serve.fake_engine import FakeEngine
from serve.helpers import EOS, SCRIPT, make_app, sse_events


def test_a_burst_of_events_wakes_the_loop_once_and_each_box_reads_its_own_in_order():
    async def main():
        loop = asyncio.get_running_loop()
        wakes, real = [], loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *a: (wakes.append(a), real(*a))[1]
        office = PostOffice(loop)
        boxes = [office.mailbox() for _ in range(3)]

        def driver():  # one engine step's events, on another thread, while the loop is busy
            for t in range(5):
                for i, box in enumerate(boxes):
                    end = t == 4
                    box(Event(f"r{i}", 10 * i + t, Role.SLM, finished=end, finish_reason="length" if end else None))

        thread = threading.Thread(target=driver)
        thread.start()
        thread.join()  # the loop thread is blocked meanwhile: nothing ran the wake-up yet
        assert len(wakes) == 1
        await asyncio.wait_for(boxes[2].wait(1.0), 1.0)
        got = [box.take() for box in boxes]
        assert [[e.token for e in evs] for evs in got] == [[10 * i + t for t in range(5)] for i in range(3)]
        assert all(box.final and box.take() == [] for box in boxes)
        del loop.call_soon_threadsafe

    asyncio.run(main())


def test_wait_for_the_final_event_sleeps_through_tokens():
    async def main():
        loop = asyncio.get_running_loop()
        box = PostOffice(loop).mailbox()
        box(Event("r", 1, Role.SLM))
        t0 = loop.time()
        await box.wait(0.1, final_only=True)  # a token is there, but not the end: the full timeout
        assert loop.time() - t0 >= 0.09
        loop.call_later(0.01, box, Event("r", 2, Role.LLM, finished=True, finish_reason="stop"))
        t0 = loop.time()
        await box.wait(5.0, final_only=True)
        assert loop.time() - t0 < 2.0 and [e.token for e in box.take()] == [1, 2]

    asyncio.run(main())


def test_pacer_spacing():
    assert Pacer().spacing() == 0.0
    pacer = Pacer(interval_s=0.02, writes_per_s=2000)
    pacer.open = 1
    assert pacer.spacing() == 0.02  # one stream: the floor
    pacer.open = 256
    assert pacer.spacing() == pytest.approx(0.128)  # 256 streams share 2000 writes a second
    with pytest.raises(ValueError, match="must be >= 0"):
        Pacer(-1.0)


@pytest.mark.parametrize("stop", [(), ("+ 7",), ("7 =", "+")])
def test_add_all_equals_adding_one_event_at_a_time(tokenizer, stop):
    events = [Event("r", t, Role.SLM) for t in SCRIPT] + [Event("r", EOS, Role.LLM, True, "stop")]
    one, together = Transcript(tokenizer, 3, stop), Transcript(tokenizer, 3, stop)
    streamed = "".join(one.add(ev) for ev in events)
    batched = "".join(together.add_all(events[i:i + 4]) for i in range(0, len(events), 4))
    assert batched == streamed == one.text == together.text
    assert (together.finish_reason, together.tokens, together.stopped) == (one.finish_reason, one.tokens, one.stopped)


def test_a_paced_stream_sends_several_tokens_a_chunk_and_the_same_text(tokenizer):
    from fastapi.testclient import TestClient

    engine = FakeEngine(SCRIPT * 3, eos=EOS, step_s=0.01)
    app, _ = make_app(tokenizer, engine, stream_interval_s=0.06)
    with TestClient(app) as client:
        plain = client.post("/v1/completions", json={"prompt": "Tom has", "max_tokens": 24}).json()
        with client.stream("POST", "/v1/completions", json={"prompt": "Tom has", "max_tokens": 24,
                                                            "stream": True}) as r:
            events = sse_events(r.iter_lines())
    chunks = events[:-1]
    assert events[-1] == "[DONE]" and "".join(c["choices"][0]["text"] for c in chunks) == plain["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and chunks[-1]["usage"]["completion_tokens"] == 24
    assert len(chunks) <= 12  # 24 tokens at >= 10 ms a step, a write at most every 60 ms (the first at once)


def _byte_level_tokenizer():
    """A byte-level BPE trained here on text with multi-byte characters, so that tokens split characters."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["Tom has 12 apples, über 7 more: 19 ✓ — größer. 你好世界 🙂 naïve café"] * 20
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


@pytest.mark.parametrize("which", ["shipped", "byte_level"])
def test_long_answers_decode_a_window_and_stream_the_same_text(tokenizer, which):
    import random

    tok = tokenizer if which == "shipped" else _byte_level_tokenizer()
    rng = random.Random(0)
    ids = [rng.randrange(4, len(tok)) for _ in range(300)]
    events = [Event("r", t, Role.SLM) for t in ids[:-1]] + [Event("r", ids[-1], Role.LLM, True, "length")]
    one, together = Transcript(tok, 3), Transcript(tok, 3)
    streamed = "".join(one.add(ev) for ev in events)
    batched = "".join(together.add_all(events[i:i + 7]) for i in range(0, len(events), 7))
    want = tok.decode(ids, skip_special_tokens=True)
    assert streamed == batched == one.text == want
    assert 0 < one._settled < len(ids)  # the settled prefix moved: later writes decoded a window only


def test_one_pacing_default_for_the_cli_and_the_app_and_its_spacing():
    """`rstitch serve` and a bare app pace alike (one home: handover.STREAM_*); at the defaults all answers write at
    most 500 times a second: 64 open answers write every 0.128 s each, 4 every 0.02 s (the interval's floor)."""
    from hf_rstitch.serve.app import ServerSettings
    from hf_rstitch.serve.config import ServeConfig
    from hf_rstitch.serve.handover import STREAM_INTERVAL_S, STREAM_WRITES_PER_S

    cfg, settings = ServeConfig(), ServerSettings()
    assert (cfg.stream_interval, cfg.stream_writes_per_s) == (STREAM_INTERVAL_S, STREAM_WRITES_PER_S)
    assert (settings.stream_interval_s, settings.stream_writes_per_s) == (STREAM_INTERVAL_S, STREAM_WRITES_PER_S)
    pacer = Pacer(STREAM_INTERVAL_S, STREAM_WRITES_PER_S)
    pacer.open = 64
    assert pacer.spacing() == pytest.approx(0.128)
    pacer.open = 4
    assert pacer.spacing() == pytest.approx(0.02)
