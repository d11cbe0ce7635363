"""Batched stitching: every row equals the same prompt run alone."""

import pytest
import torch

import hf_rstitch  # noqa: F401  (patches generate)
from hf_rstitch import Role
from hf_rstitch.hf.compat import with_cache
from tiny_models import BATCH_ARCHS, left_pad, make_pair, prompt

N_NEW = 20
LENGTHS = [5, 11, 8, 3]


def prompts():
    return [prompt(n, seed=10 + i) for i, n in enumerate(LENGTHS)]


@pytest.mark.slow  # 3.5-4.2 s per architecture
@pytest.mark.parametrize("arch", BATCH_ARCHS)
def test_each_row_equals_its_prompt_alone(arch):
    llm, slm = make_pair(arch)
    ps = prompts()
    ids, mask = left_pad(ps)
    checked = 0
    for tau in [0.2, 0.3, 0.4, 0.5, 0.55, 0.6, 0.7]:
        out = llm.generate(ids, attention_mask=mask, assistant_model=slm, stitch_threshold=tau, max_new_tokens=N_NEW,
                           return_dict_in_generate=True)
        assert isinstance(out.stitch, list) and len(out.stitch) == len(ps)
        if not any(t.switches for t in out.stitch) or len({tuple(t.roles) for t in out.stitch}) == 1:
            continue  # this threshold does not make rows route differently; try the next
        checked += 1
        for i, p in enumerate(ps):
            alone = llm.generate(p, assistant_model=slm, stitch_threshold=tau, max_new_tokens=N_NEW,
                                 return_dict_in_generate=True)
            new_alone = alone.sequences[0, p.shape[1]:]
            assert torch.equal(out.sequences[i, ids.shape[1]: ids.shape[1] + len(new_alone)], new_alone), (tau, i)
            assert out.stitch[i].roles == alone.stitch.roles
            assert [(c.role, c.kind, c.n_inf, c.n_kv) for c in out.stitch[i].calls] == \
                [(c.role, c.kind, c.n_inf, c.n_kv) for c in alone.stitch.calls]
    assert checked >= 2


@pytest.mark.parametrize("arch", BATCH_ARCHS)
def test_thresholds_zero_and_one_equal_batched_generate(arch):
    llm, slm = make_pair(arch)
    ids, mask = left_pad(prompts())
    kw = dict(attention_mask=mask, max_new_tokens=N_NEW)
    assert torch.equal(llm.generate(ids, assistant_model=slm, stitch_threshold=0.0, **kw), llm.generate(ids, **kw))
    assert torch.equal(llm.generate(ids, assistant_model=slm, stitch_threshold=1.0, **kw), slm.generate(ids, **kw))


@pytest.mark.slow  # 3.5 s
def test_rows_finish_at_different_times_and_stop_costing():
    llm, slm = make_pair("llama")
    ps = prompts()
    ids, mask = left_pad(ps)
    free = llm.generate(ids, attention_mask=mask, assistant_model=slm, stitch_threshold=0.55, max_new_tokens=N_NEW)
    eos = free[1, ids.shape[1] + 3].item()  # row 1 stops after 4 tokens
    kw = dict(attention_mask=mask, max_new_tokens=N_NEW, eos_token_id=eos, pad_token_id=2)
    out = llm.generate(ids, assistant_model=slm, stitch_threshold=0.55, return_dict_in_generate=True, **kw)
    lengths = [t.n_tokens for t in out.stitch]
    assert lengths[1] <= 4 and max(lengths) > lengths[1]
    for i, p in enumerate(ps):
        alone = llm.generate(p, assistant_model=slm, stitch_threshold=0.55, max_new_tokens=N_NEW, eos_token_id=eos,
                             pad_token_id=2, return_dict_in_generate=True)
        new = alone.sequences[0, p.shape[1]:]
        row = out.sequences[i, ids.shape[1]:]
        assert torch.equal(row[: len(new)], new)
        assert (row[len(new):] == 2).all()  # padded after its end
        # a finished row takes part in no later forward call: its calls are those of its solo run
        assert [(c.role, c.n_inf, c.n_kv) for c in out.stitch[i].calls] == \
            [(c.role, c.n_inf, c.n_kv) for c in alone.stitch.calls]
    sl = llm.generate(ids, assistant_model=slm, stitch_threshold=1.0, **kw)
    assert torch.equal(sl, slm.generate(ids, **kw))  # HF pads finished rows the same way


def test_batched_scores_stack_with_finished_rows_masked():
    llm, slm = make_pair("llama")
    ids, mask = left_pad(prompts())
    out = llm.generate(ids, attention_mask=mask, assistant_model=slm, stitch_threshold=0.55, max_new_tokens=6,
                       return_dict_in_generate=True, output_scores=True)
    assert len(out.scores) == 6 and all(s.shape == (4, llm.config.vocab_size) for s in out.scores)
    assert all(t.tokens(Role.LLM) + t.tokens(Role.SLM) == 6 for t in out.stitch)


def test_per_row_replayed_routes():
    llm, slm = make_pair("llama")
    ids, mask = left_pad(prompts())
    routes = [["slm"] * 6, ["llm"] * 6, ["slm", "llm"] * 3, ["llm", "llm", "slm", "slm", "slm", "llm"]]
    out = llm.generate(ids, attention_mask=mask, assistant_model=slm, stitch_policy=hf_rstitch.ReplayPolicy(routes),
                       max_new_tokens=6, return_dict_in_generate=True)
    assert [[str(r) for r in t.roles] for t in out.stitch] == routes


@pytest.mark.parametrize("arch", BATCH_ARCHS)
def test_batched_caches_are_dense_and_equal_a_recompute(arch):
    """Every call brings every row up to date: after decoding, each lane's cache holds exactly the
    shared sequence (no masked holes), and each row's keys/values equal a recompute of that row."""
    from transformers import DynamicCache

    llm, slm = make_pair(arch)
    ids, mask = left_pad(prompts())
    engine = hf_rstitch.decode.EagerEngine()
    routes = [["slm"] * 8, ["llm"] * 8, ["slm", "slm", "llm"] * 2 + ["slm", "slm"], ["llm", "slm", "slm", "slm"] * 2]
    out = llm.generate(ids, attention_mask=mask, assistant_model=slm, stitch_policy=hf_rstitch.ReplayPolicy(routes),
                       max_new_tokens=8, return_dict_in_generate=True, stitch_engine=engine)
    lanes = engine.built
    seq = out.sequences
    full_mask = torch.cat([mask, torch.ones(len(routes), seq.shape[1] - mask.shape[1], dtype=mask.dtype)], dim=1)
    for role, model in ((Role.SLM, slm), (Role.LLM, llm)):
        lane = lanes[role]
        n = int(lane.seen.max())
        assert (lane.seen == n).all() and lane.cache.get_seq_length() == n  # one slot per column, every row
        assert torch.equal(lane.slots.bool(), full_mask[:, :n].bool())  # holes only on left padding
        fresh = DynamicCache(config=model.config)
        positions = (full_mask[:, :n].cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            model(input_ids=seq[:, :n], attention_mask=full_mask[:, :n], position_ids=positions,
                  **with_cache(model, fresh), use_cache=True)
        real = full_mask[:, :n].bool()
        for got, want in zip(lane.cache.layers, fresh.layers):
            for g, w in ((got.keys, want.keys), (got.values, want.values)):  # [B, H, n, D]; sliding: last W - 1
                assert g.shape == w.shape
                kept = real[:, n - g.shape[-2]:]
                torch.testing.assert_close(g.transpose(1, 2)[kept], w.transpose(1, 2)[kept])
