"""ForcedEntropies (hf_rstitch.fast.forced_routes): with a pair's entropies forced from recorded routes, the real
policies -- EntropyPolicy at any threshold in (0, 0.99), the router policy with a router that always votes for the
LLM -- reproduce each route decision by decision, on the eager engine and the fast engine's static path (run-ahead
on and off), one row and several with left padding; tokens equal a replay of the same routes on the same models.
"""

import pytest
import torch

from hf_rstitch import EntropyPolicy, ReplayPolicy, Role
from hf_rstitch.fast import FastConfig
from hf_rstitch.fast.forced_routes import ForcedEntropies, high_entropy
from hf_rstitch.fast.routes import route
from hf_rstitch.router.model import Router
from hf_rstitch.router.policy import RouterPolicy
from tiny_models import VOCAB, left_pad, make_pair, prompt

ENGINES = {"eager": "default", "static": FastConfig(max_bucket=4, graphs=False),
           "static-ahead": FastConfig(max_bucket=4, graphs=False, run_ahead=True)}
MATH_LIKE = route(40, 12, 4.0, seed=3)  # LLM runs of ~4 tokens, as the benchmarks' MATH-shaped routes


def test_high_entropy_by_hand():
    r = ["slm", "llm", "llm", "slm", "llm"]
    assert high_entropy(r, "slm") == [False, True, True, False, True]  # the SLM hands over where the LLM writes
    assert high_entropy(r, Role.LLM) == [True, True, False, True, True]  # the LLM keeps control before its tokens


def _forced(llm, slm, routes, prompts, rows=4, positions=64):
    for m in (llm, slm):
        m.generation_config.eos_token_id = None  # spike tokens may be any id: no early end
    return [ForcedEntropies(m, role, rows, positions, VOCAB) for m, role in ((llm, "llm"), (slm, "slm"))]


def _run(llm, slm, ids, mask, policy, engine, n):
    out = llm.generate(ids, attention_mask=mask, assistant_model=slm, stitch_policy=policy, stitch_engine=engine,
                       max_new_tokens=n, do_sample=False, return_dict_in_generate=True)
    return out.sequences, [[str(r) for r in t.roles] for t in (out.stitch if isinstance(out.stitch, list)
                                                                 else [out.stitch])]


@pytest.mark.parametrize("engine, tau", [(e, 0.02) for e in ENGINES] + [("eager", 0.5)])
def test_entropy_policy_reproduces_one_route(engine, tau):
    llm, slm = make_pair("llama")
    ids = prompt(9)
    forced = _forced(llm, slm, [MATH_LIKE], 9)
    for f in forced:
        f.follow(MATH_LIKE, 9)
    mask = torch.ones_like(ids)
    seq, roles = _run(llm, slm, ids, mask, EntropyPolicy(tau), ENGINES[engine], len(MATH_LIKE))
    assert roles == [MATH_LIKE]
    replayed, _ = _run(llm, slm, ids, mask, ReplayPolicy(MATH_LIKE), ENGINES[engine], len(MATH_LIKE))
    assert torch.equal(seq, replayed)


@pytest.mark.parametrize("engine", list(ENGINES))
def test_entropy_policy_reproduces_rows_routes(engine):
    llm, slm = make_pair("qwen2-full")
    routes = [route(30, 9, 4.0, seed=s) for s in range(3)]
    routes[2] = ["llm"] * 30  # the LLM alone: handed over at the first step, kept ever after
    lengths = [9, 6, 11]
    ids, mask = left_pad([prompt(n, seed=i) for i, n in enumerate(lengths)])
    for f in _forced(llm, slm, routes, lengths):
        f.follow(routes, lengths)
    seq, roles = _run(llm, slm, ids, mask, EntropyPolicy(0.1), ENGINES[engine], 30)
    assert roles == routes
    replayed, _ = _run(llm, slm, ids, mask, ReplayPolicy(routes), ENGINES[engine], 30)
    assert torch.equal(seq, replayed)


@pytest.mark.parametrize("engine", ["eager", "static-ahead"])
def test_router_policy_reproduces_the_route(engine):
    llm, slm = make_pair("llama")
    ids = prompt(9)
    for f in _forced(llm, slm, [MATH_LIKE], 9):
        f.follow(MATH_LIKE, 9)
    router = Router(slm.config.hidden_size, width=8, num_blocks=2, llm_bias=20.0).double().eval()  # votes LLM
    policy = RouterPolicy(router, threshold=0.02, record=True)
    _, roles = _run(llm, slm, ids, torch.ones_like(ids), policy, ENGINES[engine], len(MATH_LIKE))
    assert roles == [MATH_LIKE]
    assert policy.router_calls == sum(a == "slm" and b == "llm" for a, b in zip(["slm"] + MATH_LIKE, MATH_LIKE))


def test_close_gives_the_model_its_own_logits():
    llm, _ = make_pair("llama")
    ids = prompt(9)
    with torch.no_grad():
        own = llm(ids).logits
        forced = ForcedEntropies(llm, "llm", 1, 32, VOCAB)
        forced.follow(["llm"] * 8, 2)  # every position from 1 on is forced
        positions = torch.arange(9)[None]
        got = llm(ids, position_ids=positions).logits
        assert torch.equal(got[:, :1], own[:, :1])  # the prompt's first position is left alone
        assert not torch.equal(got[:, 1:], own[:, 1:])
        forced.close()
        assert torch.equal(llm(ids, position_ids=positions).logits, own)


def test_follow_refuses_more_routes_than_rows():
    llm, _ = make_pair("llama")
    with pytest.raises(ValueError, match="1 to 2 routes"):
        ForcedEntropies(llm, "llm", 2, 16, VOCAB).follow([["slm"]] * 3, 4)


def _cuda_pair():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    def make(hidden, layers, seed):
        torch.manual_seed(seed)
        cfg = Qwen2Config(vocab_size=1024, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                          num_attention_heads=8, num_key_value_heads=2)
        return Qwen2ForCausalLM(cfg).to("cuda", torch.bfloat16).eval()

    return make(256, 3, 0), make(128, 2, 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("engine", [FastConfig(), "auto"], ids=["graphs", "auto"])
@pytest.mark.parametrize("rows", [1, 4])
def test_graphs_record_the_forcing(engine, rows):
    """The hooks run inside the captured steps: replayed graphs follow the tables follow() fills later."""
    llm, slm = _cuda_pair()
    ids = torch.randint(0, 1024, (rows, 12), generator=torch.Generator().manual_seed(0)).cuda()
    forced = [ForcedEntropies(m, role, 4, 128, 1024) for m, role in ((llm, "llm"), (slm, "slm"))]
    for m in (llm, slm):
        m.generation_config.eos_token_id, m.generation_config.pad_token_id = None, 0
    for first_seed in (0, 10):  # the second routes replay graphs captured under the first
        routes = [route(60, 18, 4.0, seed=first_seed + s) for s in range(rows)]
        for f in forced:
            f.follow(routes, 12)
        seq, roles = _run(llm, slm, ids, torch.ones_like(ids), EntropyPolicy(0.02), engine, 60)
        assert roles == routes
        replayed, _ = _run(llm, slm, ids, torch.ones_like(ids), ReplayPolicy(routes), engine, 60)
        assert torch.equal(seq, replayed)
