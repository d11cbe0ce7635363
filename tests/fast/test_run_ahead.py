"""The generate loop's run-ahead (hf_rstitch.decode.loop.run_ahead): the next step's first lane advanced
before the stopping check when the host knows which lane that is -- the SLM when some row's token was the
SLM's (or a host-deciding policy sends a row back), the LLM when it keeps every row on the host's word. On CUDA the fast engine does it by default;
here CPU FastLanes are told to (``FastConfig(run_ahead=True)``) and every output must equal the eager
engine's: tokens, logits, roles and per-row forward-call records, with rows finishing at different
steps (dropped from the lanes, or kept running when logits are returned), end tokens, a router policy
that reads hidden states, and sampling.

fp64 tiny models: identical tokens, logits to 1e-9.
"""

import pytest
import torch

from hf_rstitch import ReplayPolicy, Role
from hf_rstitch.decode import loop
from hf_rstitch.fast import FastConfig, FastEngine
from engine_checks import assert_same_run as _same
from tiny_models import left_pad, make_pair, prompt

AHEAD = FastConfig(max_bucket=4, graphs=False, run_ahead=True)
ROUTE = ["slm"] * 5 + ["llm"] * 2 + ["slm"] * 6 + ["llm"] + ["slm"] * 4
# every row the SLM's at steps 0-2, 6-9 and 13-17: run-ahead steps for the whole batch
ROUTES = [["slm"] * 3 + ["llm"] * 3 + ["slm"] * 4 + ["llm"] * 3 + ["slm"] * 5,
          ["slm"] * 3 + ["slm", "llm", "slm"] + ["slm"] * 4 + ["slm", "slm", "llm"] + ["slm"] * 5,
          ["slm"] * 3 + ["llm", "slm", "llm"] + ["slm"] * 4 + ["llm", "slm", "slm"] + ["slm"] * 5]


def _spy(monkeypatch, note) -> list:
    """What ``note`` makes of each step's run-ahead output (None where none ran), in order."""
    seen = []
    original = loop.run_ahead

    def spy(*args, **kwargs):
        got = original(*args, **kwargs)
        seen.append(note(got))
        return got

    monkeypatch.setattr(loop, "run_ahead", spy)
    return seen


@pytest.fixture
def counted(monkeypatch):
    """Per step, whether a lane ran ahead."""
    return _spy(monkeypatch, lambda got: got is not None)


@pytest.fixture
def lanes_ahead(monkeypatch):
    """Which lane each run-ahead advanced (None where none ran)."""
    return _spy(monkeypatch, lambda got: got.role if got is not None else None)


def _generate(llm, slm, ids, engine, mask=None, **kw):
    kw.setdefault("stitch_policy", ReplayPolicy(ROUTE))
    kw.setdefault("max_new_tokens", len(ROUTE))
    return llm.generate(ids, attention_mask=mask if mask is not None else torch.ones_like(ids), assistant_model=slm,
                        stitch_engine=engine, return_dict_in_generate=True, **kw)


@pytest.mark.parametrize("arch", ["llama", "qwen2-full"])
@pytest.mark.parametrize("logits", [False, True])
def test_one_row_equals_the_eager_engine(arch, logits, counted):
    llm, slm = make_pair(arch)
    ids = prompt(10)
    ref = _generate(llm, slm, ids, "default", output_logits=logits, min_new_tokens=len(ROUTE))
    engine = FastEngine(AHEAD)
    for _ in range(2):  # the second generation starts from a lane that read one column more at the end
        _same(_generate(llm, slm, ids, engine, output_logits=logits, min_new_tokens=len(ROUTE)), ref)
    assert sum(counted) >= 2 * 12  # the SLM steps followed by an SLM step, each generation


def _first_at(seqs: torch.Tensor, row: int, steps: range) -> int:
    """A token that row ``row`` writes at one of ``steps`` and no row writes earlier."""
    for step in steps:
        token = int(seqs[row, step])
        if not bool((seqs[:, :step] == token).any()):
            return token
    raise AssertionError(f"no token of row {row} first appears in steps {steps}")


def _finishing(llm, slm, ids, mask, first, second):
    free = _generate(llm, slm, ids, "default", mask, stitch_policy=ReplayPolicy(ROUTES), max_new_tokens=len(ROUTES[0]))
    new = free.sequences[:, ids.shape[1]:]
    return [_first_at(new, 1, first), _first_at(new, 2, second)]


@pytest.mark.parametrize("logits", [False, True])
def test_rows_finishing_at_different_steps(logits, counted):
    """End tokens stop row 1 inside an all-SLM stretch and row 2 later: dropped rows (no logits returned)
    or rows kept running unaccounted (logits returned) give the eager engine's outputs."""
    llm, slm = make_pair("llama")
    ids, mask = left_pad([prompt(k, seed=40 + i) for i, k in enumerate([6, 9, 4])])
    eos = _finishing(llm, slm, ids, mask, range(4, 10), range(10, 18))
    kw = dict(eos_token_id=eos, pad_token_id=2, max_new_tokens=len(ROUTES[0]), output_logits=logits)
    ref = _generate(llm, slm, ids, "default", mask, stitch_policy=ReplayPolicy(ROUTES), **kw)
    out = _generate(llm, slm, ids, FastEngine(AHEAD), mask, stitch_policy=ReplayPolicy(ROUTES), **kw)
    _same(out, ref)
    lengths = [tr.n_tokens for tr in ref.stitch]
    assert lengths[0] == len(ROUTES[0]) and lengths[1] < lengths[2] < lengths[0], lengths
    assert any(counted)


@pytest.mark.parametrize("config", [AHEAD, FastConfig(max_bucket=4, graphs=False)])
def test_rows_finishing_before_the_llm_ever_ran(config):
    """Rows ending in the first steps, while the LLM lane has read nothing yet: it starts later from the
    rows that are left."""
    llm, slm = make_pair("llama")
    ids, mask = left_pad([prompt(k, seed=40 + i) for i, k in enumerate([6, 9, 4])])
    eos = _finishing(llm, slm, ids, mask, range(0, 2), range(0, 3))
    kw = dict(eos_token_id=eos, pad_token_id=2, max_new_tokens=len(ROUTES[0]))
    ref = _generate(llm, slm, ids, "default", mask, stitch_policy=ReplayPolicy(ROUTES), **kw)
    _same(_generate(llm, slm, ids, FastEngine(config), mask, stitch_policy=ReplayPolicy(ROUTES), **kw), ref)
    assert min(tr.n_tokens for tr in ref.stitch) <= 3


def test_router_reading_hidden_states_and_threshold_routing(counted):
    """A policy that needs the SLM's hidden state gets it from the early call."""
    from hf_rstitch.core.policies import EntropyPolicy

    class HiddenNorm(EntropyPolicy):
        needs_hidden = True
        seen = []

        def hand_to_llm(self, view):
            self.seen.append(float(view.hidden.norm()))
            return super().hand_to_llm(view)

    llm, slm = make_pair("llama")
    ids = prompt(8)
    outs, seen = [], []
    for engine in ("default", FastEngine(AHEAD)):
        HiddenNorm.seen = []
        outs.append(_generate(llm, slm, ids, engine, stitch_policy=HiddenNorm(0.7), max_new_tokens=16))
        seen.append(HiddenNorm.seen)
    _same(outs[1], outs[0])
    assert seen[1] == pytest.approx(seen[0], abs=1e-9) and len(seen[0]) >= 4
    assert any(counted)


def test_sampling_draws_the_same_tokens():
    llm, slm = make_pair("qwen2-full")
    ids = prompt(7)
    outs = []
    for engine in ("default", FastEngine(AHEAD)):
        torch.manual_seed(3)
        outs.append(_generate(llm, slm, ids, engine, do_sample=True, max_new_tokens=len(ROUTE)))
    _same(outs[1], outs[0])


def test_lanes_without_it_never_run_ahead(counted):
    llm, slm = make_pair("llama")
    _generate(llm, slm, prompt(6), FastEngine(FastConfig(max_bucket=4, graphs=False)))
    _generate(llm, slm, prompt(6), "default")
    assert counted and not any(counted)
    assert FastConfig(graphs=False).run_ahead is None  # None: the lane runs ahead when it runs CUDA graphs


def test_run_ahead_stops_at_the_lane_capacity():
    """The last step would read one column past the cache: not run ahead (no error)."""
    llm, slm = make_pair("llama")
    ids = prompt(6)
    engine = FastEngine(AHEAD, capacity_step=1)
    out = _generate(llm, slm, ids, engine, stitch_policy=ReplayPolicy(["slm"] * 8), max_new_tokens=8)
    ref = _generate(llm, slm, ids, "default", stitch_policy=ReplayPolicy(["slm"] * 8), max_new_tokens=8)
    _same(out, ref)
    assert engine._lanes[Role.SLM].capacity == out.sequences.shape[1]


@pytest.mark.parametrize("arch", ["llama", "qwen2-full"])
def test_llm_runs_ahead_when_the_policy_keeps_it_on_the_host(arch, lanes_ahead):
    """A replayed route decides on the host: inside an LLM stretch the LLM's next call runs early, and a
    stretch's last LLM token (handed back) runs the SLM early. Three rows whose stretches differ."""
    llm, slm = make_pair(arch)
    ids, mask = left_pad([prompt(k, seed=50 + i) for i, k in enumerate([5, 8, 3])])
    routes = [["llm"] * 6 + ["slm"] * 3 + ["llm"] * 4, ["llm"] * 4 + ["slm"] * 5 + ["llm"] * 4, ["llm"] * 13]
    kw = dict(stitch_policy=ReplayPolicy(routes), max_new_tokens=13, min_new_tokens=13, output_logits=True)
    ref = _generate(llm, slm, ids, "default", mask, **kw)
    _same(_generate(llm, slm, ids, FastEngine(AHEAD), mask, **kw), ref)
    assert lanes_ahead.count(Role.LLM) >= 4 and lanes_ahead.count(Role.SLM) >= 4, lanes_ahead


def test_entropy_routing_runs_the_next_steps_first_lane_ahead(lanes_ahead):
    """An entropy policy on CPU decides on the host: each step runs early the lane the next step calls first
    -- the SLM when some row is the SLM's then (it kept its token or hands it over), else the LLM."""
    from hf_rstitch.core.policies import EntropyPolicy

    llm, slm = make_pair("llama")
    ids, mask = left_pad([prompt(k, seed=60 + i) for i, k in enumerate([7, 4, 9, 5])])
    mixed = 0
    for tau in (0.6, 0.75, 0.9):
        kw = dict(stitch_policy=EntropyPolicy(tau), max_new_tokens=14, min_new_tokens=14, output_logits=True)
        ref = _generate(llm, slm, ids, "default", mask, **kw)
        lanes_ahead.clear()
        _same(_generate(llm, slm, ids, FastEngine(AHEAD), mask, **kw), ref)
        slm_at = [[r is Role.SLM or h for r, h in zip(t.roles, t.handovers)] for t in ref.stitch]
        for i, early in enumerate(lanes_ahead[:-1]):
            assert early is (Role.SLM if any(row[i + 1] for row in slm_at) else Role.LLM), (i, slm_at, lanes_ahead)
        mixed += sum(len({row[i] for row in slm_at}) == 2 for i in range(14))
    assert mixed  # some step had rows of both models


def test_next_lane_waits_for_a_hand_back_decided_on_the_device():
    """Where the LLM's hand-back is still on the device (a GPU policy), only an SLM row makes the next lane known."""
    from hf_rstitch.decode.step import StepOut

    def out(writer, back):
        w = torch.tensor(writer)
        return StepOut(None, None, w, None, None, back, [])

    on_device = torch.zeros(3, dtype=torch.bool, device="meta")
    assert loop.next_lane(out([True, False, True], on_device)) is Role.SLM
    assert loop.next_lane(out([True, True, True], on_device)) is None
    assert loop.next_lane(out([False, False, False], None)) is Role.SLM
    assert loop.next_lane(out([True, True, True], torch.tensor([False, False, False]))) is Role.LLM
    assert loop.next_lane(out([True, True, True], torch.tensor([False, True, False]))) is Role.SLM
