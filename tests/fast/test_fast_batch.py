"""FastLane at batch size > 1 on CPU (the same static-cache steps as on CUDA, run eagerly): every row
equals the default engine's, with left-padded prompts of different lengths, per-row routes, rows
finishing at different steps (cache rows moving down as the batch bucket shrinks) and lane reuse.

fp64 tiny models: identical tokens, logits to 1e-9 and identical per-row forward-call records.
"""

import pytest
import torch

import hf_rstitch
from hf_rstitch import ReplayPolicy, Role
from hf_rstitch.fast import FastConfig, FastEngine
from hf_rstitch.fast.rows import RowSlots, batch_sizes
from tiny_models import left_pad, make_pair, prompt

FULL_ATTENTION = ["llama", "qwen2-full"]
WINDOWED = ["qwen2", "gemma3"]  # qwen2: a window of 6 on every layer; gemma3: hybrid (tests/fast/test_fast_windows.py)

CPU = FastConfig(max_bucket=4, graphs=False)
LENGTHS = [5, 11, 8, 3, 9]
N_NEW = 14
ROUTES = [["slm"] * 3 + ["llm"] * 2 + ["slm"] * 9,  # catch-ups past max_bucket=4 for the LLM
          ["llm"] * 14,
          ["slm", "llm"] * 7,
          ["llm", "llm", "slm", "slm", "slm", "llm"] * 3,
          ["slm"] * 6 + ["llm"] * 6 + ["slm", "slm"]]


def _batch(n=len(LENGTHS)):
    return left_pad([prompt(k, seed=20 + i) for i, k in enumerate(LENGTHS[:n])])


def _generate(llm, slm, ids, mask, engine, policy, **kw):
    return llm.generate(ids, attention_mask=mask, assistant_model=slm, stitch_policy=policy, stitch_engine=engine,
                        max_new_tokens=N_NEW, return_dict_in_generate=True, output_logits=True, **kw)


def _calls(trace):
    return [(c.role, c.kind, c.n_inf, c.n_kv) for c in trace.calls]


def _same(out, ref, tol=1e-9):
    assert torch.equal(out.sequences, ref.sequences)
    traces = lambda o: o.stitch if isinstance(o.stitch, list) else [o.stitch]  # noqa: E731  (B = 1: one trace)
    assert [t.roles for t in traces(out)] == [t.roles for t in traces(ref)]
    assert [_calls(t) for t in traces(out)] == [_calls(t) for t in traces(ref)]
    assert len(out.logits) == len(ref.logits)
    for a, b in zip(out.logits, ref.logits):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)  # -inf on finished rows in both


@pytest.mark.parametrize("arch", FULL_ATTENTION + WINDOWED)
def test_batched_fast_engine_equals_default_engine(arch):
    llm, slm = make_pair(arch)
    ids, mask = _batch()
    ref = _generate(llm, slm, ids, mask, "default", ReplayPolicy(ROUTES))
    engine = FastEngine(CPU)
    for _ in range(2):  # the second generation reuses both lanes
        _same(_generate(llm, slm, ids, mask, engine, ReplayPolicy(ROUTES)), ref)
    assert engine.builds == 2 and engine._lanes[Role.LLM].max_rows == len(LENGTHS)
    # a smaller batch on the same lanes: its own batch bucket, nothing rebuilt
    ids3, mask3 = _batch(3)
    _same(_generate(llm, slm, ids3, mask3, engine, ReplayPolicy(ROUTES[:3])),
          _generate(llm, slm, ids3, mask3, "default", ReplayPolicy(ROUTES[:3])))
    assert engine.builds == 2


def test_entropy_routing_equals_default_engine():
    llm, slm = make_pair("llama")
    ids, mask = _batch()
    checked = 0
    for tau in (0.3, 0.5, 0.6):
        ref = llm.generate(ids, attention_mask=mask, assistant_model=slm, stitch_threshold=tau, max_new_tokens=N_NEW,
                           return_dict_in_generate=True, output_logits=True)
        out = llm.generate(ids, attention_mask=mask, assistant_model=slm, stitch_threshold=tau, max_new_tokens=N_NEW,
                           stitch_engine=FastEngine(CPU), return_dict_in_generate=True, output_logits=True)
        _same(out, ref)
        checked += len({tuple(t.roles) for t in ref.stitch}) > 1
    assert checked >= 1  # at least one threshold routed rows differently


def test_rows_finishing_at_different_steps_move_down_and_match():
    llm, slm = make_pair("llama")
    ids, mask = _batch()
    free = _generate(llm, slm, ids, mask, "default", ReplayPolicy(ROUTES))
    t = ids.shape[1]
    eos = [int(free.sequences[1, t + 2]), int(free.sequences[3, t + 6])]  # rows 1 and 3 stop early (at least)
    kw = dict(eos_token_id=eos, pad_token_id=2)
    ref = _generate(llm, slm, ids, mask, "default", ReplayPolicy(ROUTES), **kw)
    engine = FastEngine(CPU)
    out = _generate(llm, slm, ids, mask, engine, ReplayPolicy(ROUTES), **kw)
    _same(out, ref)
    lengths = [tr.n_tokens for tr in ref.stitch]
    assert len(set(lengths)) >= 2, lengths  # rows finished at different steps
    lanes = engine._lanes.values()
    if sum(n < N_NEW for n in lengths) >= 1 and max(lengths) == N_NEW:
        assert any(lane.row_moves for lane in lanes) or all(lane.rows.in_order for lane in lanes)
    _same(_generate(llm, slm, ids, mask, engine, ReplayPolicy(ROUTES), **kw), ref)  # reuse after moves


def test_cache_rows_hold_what_a_recompute_gives_after_rows_leave():
    llm, slm = make_pair("qwen2-full")
    ids, mask = _batch()
    engine = FastEngine(CPU)
    _generate(llm, slm, ids, mask, engine, ReplayPolicy(ROUTES))
    lane = engine._lanes[Role.LLM]
    lane.reset()
    seq = torch.cat([ids, torch.randint(3, 96, (5, 6))], dim=1)
    full = torch.cat([mask, torch.ones(5, 6, dtype=mask.dtype)], dim=1)
    rows, back = torch.ones(5, dtype=torch.bool), torch.zeros(5, dtype=torch.bool)
    lane.advance(seq[:, :-6], full[:, :-6], rows, back)
    lane.keep_rows(torch.tensor([0, 2, 4]))  # 3 live rows -> bucket 4: row 4 moves into cache row 1
    assert lane.rows.slot == [0, 2, 1] and lane.row_moves == 1
    kept = torch.tensor([0, 2, 4])
    logits, _, _ = lane.advance(seq[kept], full[kept], rows[:3], back[:3])
    with torch.no_grad():
        for i, r in enumerate(kept.tolist()):
            pad = int((full[r] == 0).sum())
            want = llm(input_ids=seq[r:r + 1, pad:]).logits[0, -1, :lane.vocab]
            torch.testing.assert_close(logits[i], want.float())  # the lane returns float32 logits


# ---- row bookkeeping ---------------------------------------------------------------------------
def test_batch_sizes():
    assert batch_sizes(1) == (1,)
    assert batch_sizes(8) == (1, 2, 4, 8)
    assert batch_sizes(48) == (1, 2, 4, 8, 16, 32, 48)
    with pytest.raises(ValueError, match="at least one row"):
        batch_sizes(0)


def test_spare_rows_add_batch_buckets_a_few_rows_above_the_batch():
    assert batch_sizes(256 + 64, spare=64) == (1, 2, 4, 8, 16, 32, 64, 128, 256, 272, 288, 320)
    assert batch_sizes(48 + 64, spare=64) == (1, 2, 4, 8, 16, 32, 48, 64, 80, 112)
    assert batch_sizes(4 + 8, spare=8) == (1, 2, 4, 12)
    for spare in (-1, 12):
        with pytest.raises(ValueError, match="spare rows are fewer than a lane's rows"):
            batch_sizes(12, spare=spare)


def test_row_slots_move_only_rows_above_the_smaller_bucket():
    rows = RowSlots(8)
    rows.start([0] * 8)
    assert rows.bucket == 8 and rows.in_order
    assert rows.keep([0, 1, 2, 4, 5, 6, 7]) == []  # 7 rows: still bucket 8, row 3 is dead weight
    assert rows.bucket == 8 and not rows.in_order
    moves = rows.keep([0, 2, 4, 6])  # cache rows 0, 2, 5, 7 -> bucket 4: 5 and 7 move into the free 1 and 3
    assert moves == [(5, 1), (7, 3)] and rows.slot == [0, 2, 1, 3] and rows.bucket == 4
    assert rows.keep([0, 2]) == [] and rows.slot == [0, 1] and rows.bucket == 2 and rows.in_order
    assert rows.keep([1]) == [(1, 0)] and rows.slot == [0] and rows.bucket == 1
    with pytest.raises(IndexError):
        rows.keep([5])


def test_larger_batch_rebuilds_the_lanes():
    llm, slm = make_pair("llama")
    engine = FastEngine(CPU)
    ids, mask = _batch(2)
    _generate(llm, slm, ids, mask, engine, ReplayPolicy(ROUTES[:2]))
    ids, mask = _batch(4)
    _generate(llm, slm, ids, mask, engine, ReplayPolicy(ROUTES[:4]))
    assert engine.builds == 4 and engine._lanes[Role.SLM].max_rows == 4


def test_prompt_mask_with_holes_is_refused():
    llm, slm = make_pair("llama")
    ids, mask = _batch(2)
    mask[1, -3] = 0
    with pytest.raises(ValueError, match="row 1 of the attention mask has holes"):
        _generate(llm, slm, ids, mask, FastEngine(CPU), ReplayPolicy(ROUTES[:2]))


assert hf_rstitch  # generate is patched on import


@pytest.mark.slow
@pytest.mark.parametrize("fuse_add_norm", [None, False])  # the default (residual adds with the norms) and apart
def test_compiled_parts_equal_default_engine(fuse_add_norm):
    """compile="parts": the model's RMSNorm, rotary embedding and gated activation compiled with symbolic
    shapes (one compile each for every batch and length: none at a later batch size); same outputs,
    batched and alone. The models'
    RMSNorm computes in float32 even for float64 weights, and the compiled norm sums in another order,
    so logits agree to float32 rounding carried through the layers (measured: 9e-6), not to 1e-9."""
    from hf_rstitch.fast.patches import regions

    llm, slm = make_pair("qwen2-full")
    forwards, globals_ = regions.plan(llm)
    assert len(forwards) == 2 * 3 + 1 + 3  # two norms and an MLP per layer, the final norm
    assert [g[1] for g in globals_] == ["apply_rotary_pos_emb"]
    ids, mask = _batch()
    engine = FastEngine(FastConfig(max_bucket=4, graphs=False, compile="parts", fuse_add_norm=fuse_add_norm))
    assert engine.config.adds_with_norms == (fuse_add_norm is None)
    _same(_generate(llm, slm, ids, mask, engine, ReplayPolicy(ROUTES)),
          _generate(llm, slm, ids, mask, "default", ReplayPolicy(ROUTES)), tol=1e-4)
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    one = prompt(7)
    _same(_generate(llm, slm, one, torch.ones_like(one), engine, ReplayPolicy(ROUTES[0])),
          _generate(llm, slm, one, torch.ones_like(one), "default", ReplayPolicy(ROUTES[0])), tol=1e-4)
    assert counters["stats"]["unique_graphs"] == graphs  # batch 1 after batch 5: no piece compiled again
    assert "forward" not in llm.model.norm.__dict__  # patches live only inside the lane's calls


@pytest.mark.slow
@pytest.mark.parametrize("arch", FULL_ATTENTION)
def test_compiled_parts_with_fused_add_norm_equal_default_engine(arch):
    """FastConfig(compile="parts", fuse_add_norm=True): pre-norm layers run their middle residual add and
    norm as one compiled piece; outputs as with the pieces apart (float32 rounding, as above)."""
    from hf_rstitch.fast.patches import regions

    llm, slm = make_pair(arch)
    forwards, _ = regions.plan(llm, add_norm=True)
    layers = [m for m, _ in forwards if type(m).__name__.endswith("DecoderLayer")]
    assert layers == list(llm.model.layers)
    ids, mask = _batch()
    engine = FastEngine(FastConfig(max_bucket=4, graphs=False, compile="parts", fuse_add_norm=True))
    _same(_generate(llm, slm, ids, mask, engine, ReplayPolicy(ROUTES)),
          _generate(llm, slm, ids, mask, "default", ReplayPolicy(ROUTES)), tol=1e-4)
    assert not any("forward" in layer.__dict__ for layer in llm.model.layers)  # only inside the lane's calls


def test_fused_add_norm_only_for_the_standard_pre_norm_layer():
    from hf_rstitch.fast.patches import add_norm
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    llm, _ = make_pair("llama")
    assert all(add_norm.pre_norm_layer(layer) for layer in llm.model.layers)

    class PostNormDecoderLayer(LlamaDecoderLayer):
        def forward(self, hidden_states, **kwargs):  # another order of operations: not stood in for
            return self.input_layernorm(hidden_states + self.self_attn(hidden_states=hidden_states, **kwargs)[0])

    layer = llm.model.layers[0]
    layer.__class__ = PostNormDecoderLayer
    assert not add_norm.pre_norm_layer(layer)
    with pytest.raises(ValueError, match="fuse_add_norm=True fuses with compile='parts'"):
        FastConfig(fuse_add_norm=True)


@pytest.mark.parametrize("arch", FULL_ATTENTION)
def test_add_norm_layers_hand_their_closing_norm_to_the_next_layer(arch):
    """Uncompiled pieces (same arithmetic): logits equal the model's own to the bit, and only the first
    layer's input norm runs as a module; the others come from the carry."""
    from hf_rstitch.fast.patches import add_norm, regions

    llm, _ = make_pair(arch)
    calls = []
    for i, layer in enumerate(llm.model.layers):
        layer.input_layernorm.register_forward_hook(lambda *a, i=i: calls.append(i))
    ids = prompt(9)
    with torch.no_grad():
        want = llm(ids).logits
        calls.clear()
        with regions.regions_on((add_norm.plan(llm, lambda key, fn: fn), [])):
            got = llm(ids).logits
    assert torch.equal(got, want)
    assert calls == [0]
