"""Rows that wait for the LLM (``schedule="gather"``): outputs, routes and accounting are unchanged,
fewer LLM calls run, and a held row's caches equal a recompute from scratch -- on both lanes."""

import pytest
import torch

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch import Role
from hf_rstitch.core.scheduling import GatherForLLM, Immediate, LLMDemand, parse_schedule
from hf_rstitch.decode import Lane
from hf_rstitch.batching.requests import Request, RequestEngine
from hf_rstitch.fast import FastConfig, FastLane
from tiny_models import make_pair, prompt

CPU_FAST = FastConfig(max_bucket=4, graphs=False)
LENGTHS = [5, 11, 3, 8, 14, 2, 7]
MAX_NEW = [12, 5, 20, 9, 15, 7, 4]
TAUS = [0.3, 0.5, 0.6, 0.4, 0.55, 0.5, 0.7]


# ---- the decision --------------------------------------------------------------------------------
def test_gather_runs_the_llm_once_enough_rows_need_it_or_one_waited_long_enough():
    g = GatherForLLM(max_wait=2, min_rows=3)
    assert not g.run_now(LLMDemand(need=2, rows=8, waited=1))
    assert g.run_now(LLMDemand(need=3, rows=8, waited=0))  # enough rows
    assert g.run_now(LLMDemand(need=1, rows=8, waited=2))  # waited long enough
    assert g.run_now(LLMDemand(need=2, rows=2, waited=0))  # nobody else would progress
    assert GatherForLLM().gather(4) == 2 and GatherForLLM().gather(64) == 16  # default: a quarter, at least 2
    assert Immediate().run_now(LLMDemand(need=1, rows=64, waited=0))


@pytest.mark.parametrize("spec, want", [(None, Immediate()), ("now", Immediate()), ("gather", GatherForLLM()),
                                        ("gather:3", GatherForLLM(3)), ("gather:1:8", GatherForLLM(1, 8))])
def test_schedules_parse_from_their_command_line_form(spec, want):
    assert parse_schedule(spec) == want


@pytest.mark.parametrize("spec, match", [("later", "use 'now'"), ("gather:x", "integers"), ("gather:0", "max_wait"),
                                         ("gather:1:0", "min_rows"), ("gather:1:2:3", "use 'now'")])
def test_bad_schedules_say_what_to_write(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_schedule(spec)


# ---- the lanes: a held row moves right, its caches equal a recompute ----------------------------
def _lane(kind, model):
    if kind == "eager":
        return Lane(model, Role.LLM, 96, batch_size=3)
    return FastLane(model, Role.LLM, 96, capacity=64, config=CPU_FAST, max_rows=4)


def _cached(lane, row: int, n: int) -> torch.Tensor:
    """Keys of layer 0 for ``row``'s last ``n`` seen slots."""
    if isinstance(lane, Lane):
        return lane.cache.layers[0].keys[row, :, lane.n_seen - n: lane.n_seen]
    slot = lane.rows.slot[row]
    return lane.cache.keys[0][slot, :, lane.seen - n: lane.seen]


@pytest.mark.parametrize("kind", ["eager", "fast"])
@pytest.mark.parametrize("arch", ["llama", "qwen2-full"])
def test_held_rows_keep_their_solo_logits_and_caches(kind, arch):
    llm, _ = make_pair(arch)
    g = torch.Generator().manual_seed(0)
    lengths = [6, 4, 9]
    seq = torch.full((3, 9), 2)
    mask = torch.zeros(3, 9, dtype=torch.long)
    for r, n in enumerate(lengths):
        seq[r, 9 - n:], mask[r, 9 - n:] = torch.randint(3, 96, (n,), generator=g), 1
    lane = _lane(kind, llm)
    everyone, nobody = torch.ones(3, dtype=torch.bool), torch.zeros(3, dtype=torch.bool)
    lane.advance(seq, mask, everyone, nobody)
    for held in ([1], [0, 2], [], [1]):  # some rows wait, the others gain a token; then every row advances
        seq = torch.cat([seq, torch.randint(3, 96, (3, 1), generator=g)], 1)
        mask = torch.cat([mask, torch.ones(3, 1, dtype=torch.long)], 1)
        for r in held:
            seq[r] = torch.cat([torch.tensor([2]), seq[r, :-1]])
            mask[r] = torch.cat([torch.tensor([0]), mask[r, :-1]])
        lane.hold_rows(held)
        seq = torch.cat([seq, torch.randint(3, 96, (3, 1), generator=g)], 1)
        mask = torch.cat([mask, torch.ones(3, 1, dtype=torch.long)], 1)
        logits, _, calls = lane.advance(seq, mask, everyone, nobody)
        fresh = _lane(kind, llm)
        fresh.advance(seq, mask, everyone, nobody)  # the reference: the same layout read from scratch
        with torch.no_grad():
            for r in range(3):
                real = seq[r][mask[r].bool()]
                want = llm(input_ids=real[None]).logits[0, -1, :96].float()
                torch.testing.assert_close(logits[r], want, rtol=1e-5, atol=1e-5)
                n = int(mask[r].sum())
                torch.testing.assert_close(_cached(lane, r, n), _cached(fresh, r, n), rtol=1e-5, atol=1e-5)
                assert calls[r].n_kv + calls[r].n_inf == n  # accounted in the row's real tokens


# ---- the request engine ------------------------------------------------------------------------
def _requests():
    prompts = [prompt(n, seed=i) for i, n in enumerate(LENGTHS)]
    return [Request(p[0].tolist(), max_new_tokens=m, stitch_threshold=t, request_id=str(i))
            for i, (p, t, m) in enumerate(zip(prompts, TAUS, MAX_NEW))]


def _same(a, b):
    assert a.tokens == b.tokens and a.finish_reason == b.finish_reason
    ta, tb = a.trace, b.trace
    assert ta.roles == tb.roles and ta.handovers == tb.handovers
    assert [(c.role, c.kind, c.n_inf, c.n_kv) for c in ta.calls] == [(c.role, c.kind, c.n_inf, c.n_kv) for c in tb.calls]
    assert [h is None for h in ta.slm_entropies] == [h is None for h in tb.slm_entropies]
    torch.testing.assert_close(torch.tensor(ta.entropies), torch.tensor(tb.entropies), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("trim", [1, 32], ids=["trim-each-column", "trim-lazily"])
@pytest.mark.parametrize("engine", ["default", CPU_FAST], ids=["eager", "fast"])
@pytest.mark.parametrize("arch", ["llama", "qwen2-full"])
def test_waiting_rows_change_nothing_but_the_llm_calls(arch, engine, trim, monkeypatch):
    monkeypatch.setattr("hf_rstitch.batching.requests.HOLD_TRIM", trim)  # padding held rows leave is trimmed at
    llm, slm = make_pair(arch)
    now = RequestEngine.of(llm, slm, max_batch=4, engine=engine, max_length=64)
    base = now.run(_requests())
    gather = RequestEngine.of(llm, slm, max_batch=4, engine=engine, max_length=64, schedule=GatherForLLM(3, 3))
    got = gather.run(_requests())
    for rid, want in base.items():
        _same(got[rid], want)
    assert gather.stats["held"] > 0 and now.stats["held"] == 0
    assert gather.stats["llm_calls"] < now.stats["llm_calls"]
    p, t, m = prompt(LENGTHS[4], seed=4), TAUS[4], MAX_NEW[4]
    alone = llm.generate(p, assistant_model=slm, stitch_threshold=t, max_new_tokens=m, return_dict_in_generate=True)
    assert got["4"].tokens == alone.sequences[0, p.shape[1]:].tolist()  # and so each equals its solo run


def test_a_sampled_request_draws_nothing_while_it_waits():
    llm, slm = make_pair("llama")
    reqs = lambda: [Request(r.input_ids, max_new_tokens=r.max_new_tokens, stitch_threshold=r.stitch_threshold,  # noqa: E731
                            request_id=r.request_id, do_sample=True, seed=int(r.request_id)) for r in _requests()]
    base = RequestEngine.of(llm, slm, max_batch=4).run(reqs())
    gather = RequestEngine.of(llm, slm, max_batch=4, schedule="gather:3:3")
    got = gather.run(reqs())
    assert gather.stats["held"] > 0
    assert {k: c.tokens for k, c in got.items()} == {k: c.tokens for k, c in base.items()}


def test_sliding_window_models_cannot_wait():
    llm, slm = make_pair("qwen2")  # a sliding window on every layer
    with pytest.raises(ValueError, match="full-attention"):
        RequestEngine.of(llm, slm, schedule="gather")
    with pytest.raises(TypeError, match="run_now"):
        RequestEngine.of(*make_pair("llama"), schedule=3)
