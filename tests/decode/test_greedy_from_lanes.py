"""Greedy tokens a lane found reading its logits out (``greedy``, the fast lane's read-out): the loop takes them
where nothing changes the scores, and the output is what it computes itself. On CPU, with eager lanes that
offer their argmax as the fast lane does (the read-out itself is tested in tests/fast)."""

import torch

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch import ReplayPolicy
from hf_rstitch.decode import loop
from hf_rstitch.decode.protocol import EagerEngine
from tiny_models import left_pad, make_pair, prompt


class _Offering:
    """An eager lane that also answers ``greedy`` for the logits it last returned, counting the answers."""

    def __init__(self, lane, asked: list):
        self._lane, self._asked, self._last = lane, asked, None

    def __getattr__(self, name):
        return getattr(self._lane, name)

    def advance(self, *args, **kwargs):
        logits, hidden, calls = self._lane.advance(*args, **kwargs)
        self._last = logits
        return logits, hidden, calls

    def greedy(self, logits):
        if logits is not self._last:
            return None
        self._asked.append(self._lane.role)
        return logits.argmax(-1)


class _OfferingEngine(EagerEngine):
    def __init__(self):
        super().__init__()
        self.asked = []

    def lanes(self, *args, **kwargs):
        return {role: _Offering(lane, self.asked) for role, lane in super().lanes(*args, **kwargs).items()}


ROUTES = [["slm", "llm", "llm", "slm"] * 3, ["llm", "slm"] * 6, ["slm"] * 5 + ["llm"] * 3 + ["slm"] * 4]


def _run(monkeypatch, engine, **kw):
    picked = []
    original = loop.pick_tokens
    monkeypatch.setattr(loop, "pick_tokens", lambda *a, **k: picked.append(1) or original(*a, **k))
    llm, slm = make_pair("llama")
    ids, mask = left_pad([prompt(k, seed=90 + i) for i, k in enumerate([5, 8, 6])])
    out = llm.generate(ids, attention_mask=mask, assistant_model=slm, stitch_policy=ReplayPolicy(ROUTES),
                       stitch_engine=engine, max_new_tokens=12, do_sample=False, pad_token_id=2,
                       return_dict_in_generate=True, **kw)
    return out, len(picked)


def test_greedy_tokens_of_mixed_writers_come_from_the_lanes(monkeypatch):
    """No processor, greedy: every step's tokens are the lanes' (each row its writer's), none computed by the
    loop; sequences and roles equal the plain eager engine's."""
    want, _ = _run(monkeypatch, "default")
    engine = _OfferingEngine()
    got, picked = _run(monkeypatch, engine)
    assert picked == 0 and {str(r) for r in engine.asked} == {"slm", "llm"}
    assert torch.equal(got.sequences, want.sequences)
    assert [t.roles for t in got.stitch] == [t.roles for t in want.stitch]


def test_a_processor_makes_the_loop_pick_the_tokens(monkeypatch):
    """A logits processor changes the scores: the loop picks every token itself, as plain generate."""
    want, _ = _run(monkeypatch, "default", repetition_penalty=1.3)
    engine = _OfferingEngine()
    got, picked = _run(monkeypatch, engine, repetition_penalty=1.3)
    assert picked == got.sequences.shape[1] - 8  # every step
    assert torch.equal(got.sequences, want.sequences)
