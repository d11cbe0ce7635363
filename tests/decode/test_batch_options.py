"""Batched stitching honours every ``generate`` option as plain batched ``generate`` does.

Specifications (issue: batched stitching as trustworthy as batch size 1):
* processors, stopping criteria and streamers see the caller's rows, in order, for the whole
  generation -- so at tau = 0 the batch equals batched ``llm.generate`` with the same row-indexed
  callables, and at any tau each row equals its prompt alone;
* finished rows get the pad token and scores that make ``compute_transition_scores`` match;
* options stitching cannot honour are refused up front, naming what to do.
"""

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

import hf_rstitch  # noqa: F401  (patches generate)
from tiny_models import Shown, left_pad, make_pair, prompt

ARCHS = ["llama", "qwen2", "gemma3"]  # qwen2: sliding window on every layer; gemma3: hybrid
LENGTHS = [5, 11, 3]
MIXED_TAU = {"llama": 0.55, "qwen2": 0.55, "gemma3": 0.45}
N_NEW = 10


def batch():
    ps = [prompt(n, seed=20 + i) for i, n in enumerate(LENGTHS)]
    ids, mask = left_pad(ps)
    return ps, ids, mask


def allowed_rule(batch_id: int, ids: torch.Tensor) -> list[int]:
    """Row-indexed constraint: row r may only write ids congruent to r mod 3 (pad and eos always)."""
    return [t for t in range(96) if t % 3 == batch_id % 3] + [1, 2]


class StopAfter(StoppingCriteria):
    """Row r stops after r + 1 new tokens (row-indexed, caller's order)."""

    def __init__(self, prompt_width: int):
        self.width = prompt_width

    def __call__(self, input_ids, scores, **kwargs):
        new = input_ids.shape[1] - self.width
        return torch.tensor([new >= r + 1 for r in range(input_ids.shape[0])])


class RowBias(LogitsProcessor):
    """A user processor (not transformers'): finished rows must keep running for it to see them."""

    def __init__(self):
        self.shapes = []

    def __call__(self, input_ids, scores):
        self.shapes.append(tuple(scores.shape))
        bias = torch.zeros_like(scores)
        bias[torch.arange(scores.shape[0]), (torch.arange(scores.shape[0]) * 7 + 5) % scores.shape[1]] = 0.5
        return scores + bias


def stitched(llm, slm, ids, tau, **kw):
    return llm.generate(ids, assistant_model=slm, stitch_threshold=tau, max_new_tokens=N_NEW, **kw)


@pytest.mark.parametrize("arch", ARCHS)
def test_row_indexed_prefix_constraint(arch):
    llm, slm = make_pair(arch)
    ps, ids, mask = batch()
    kw = dict(attention_mask=mask, prefix_allowed_tokens_fn=allowed_rule)
    assert torch.equal(stitched(llm, slm, ids, 0.0, **kw), llm.generate(ids, max_new_tokens=N_NEW, **kw))
    out = stitched(llm, slm, ids, MIXED_TAU[arch], **kw)
    for r, p in enumerate(ps):
        alone = stitched(llm, slm, p, MIXED_TAU[arch], prefix_allowed_tokens_fn=lambda _, x, r=r: allowed_rule(r, x))
        new = alone[0, p.shape[1]:]
        assert torch.equal(out[r, ids.shape[1]: ids.shape[1] + len(new)], new), r
        assert all(t % 3 == r % 3 or t in (1, 2) for t in out[r, ids.shape[1]:].tolist())


@pytest.mark.parametrize("arch", ARCHS)
def test_row_indexed_stopping_criteria_stop_the_right_rows(arch):
    llm, slm = make_pair(arch)
    _, ids, mask = batch()
    kw = dict(attention_mask=mask, pad_token_id=2, return_dict_in_generate=True)
    crit = StoppingCriteriaList([StopAfter(ids.shape[1])])
    plain = llm.generate(ids, max_new_tokens=N_NEW, stopping_criteria=crit, **kw)
    zero = stitched(llm, slm, ids, 0.0, stopping_criteria=crit, **kw)
    assert torch.equal(zero.sequences, plain.sequences)
    mixed = stitched(llm, slm, ids, MIXED_TAU[arch], stopping_criteria=crit, **kw)
    assert [t.n_tokens for t in mixed.stitch] == [1, 2, 3]
    assert (mixed.sequences[0, ids.shape[1] + 1:] == 2).all()


@pytest.mark.parametrize("arch", ARCHS)
def test_transition_scores_of_finished_rows_match_plain_generate(arch):
    llm, slm = make_pair(arch)
    _, ids, mask = batch()
    free = llm.generate(ids, attention_mask=mask, max_new_tokens=N_NEW)
    eos = free[1, ids.shape[1] + 2].item()  # row 1 ends after 3 tokens, the others later
    kw = dict(attention_mask=mask, eos_token_id=eos, pad_token_id=2, output_scores=True, return_dict_in_generate=True)
    plain = llm.generate(ids, max_new_tokens=N_NEW, **kw)
    zero = stitched(llm, slm, ids, 0.0, **kw)
    assert torch.equal(zero.sequences, plain.sequences)
    want = llm.compute_transition_scores(plain.sequences, plain.scores, normalize_logits=True)
    got = llm.compute_transition_scores(zero.sequences, zero.scores, normalize_logits=True)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want)
    mixed = stitched(llm, slm, ids, MIXED_TAU[arch], **kw)
    assert torch.isfinite(llm.compute_transition_scores(mixed.sequences, mixed.scores, normalize_logits=True)).all()


@pytest.mark.parametrize("arch", ARCHS)
def test_user_processor_sees_the_whole_batch_and_rows_equal_solo(arch):
    llm, slm = make_pair(arch)
    ps, ids, mask = batch()
    free = llm.generate(ids, attention_mask=mask, max_new_tokens=N_NEW)
    eos = free[2, ids.shape[1] + 1].item()
    kw = dict(eos_token_id=eos, pad_token_id=2)
    proc = RowBias()
    plain = llm.generate(ids, attention_mask=mask, max_new_tokens=N_NEW, logits_processor=LogitsProcessorList([proc]), **kw)
    proc_z = RowBias()
    zero = stitched(llm, slm, ids, 0.0, attention_mask=mask, logits_processor=LogitsProcessorList([proc_z]), **kw)
    assert torch.equal(zero, plain)
    assert proc_z.shapes == proc.shapes and all(s[0] == 3 for s in proc_z.shapes)


@pytest.mark.parametrize("option", [
    dict(repetition_penalty=1.3), dict(no_repeat_ngram_size=2), dict(min_new_tokens=4), dict(suppress_tokens=[5, 6, 7]),
    dict(bad_words_ids=[[9], [10, 11]]), dict(sequence_bias={(4,): -3.0}), dict(do_sample=True, top_k=20, top_p=0.9,
                                                                                 temperature=0.8),
])
def test_options_batch_like_plain_generate_and_rows_like_solo(option):
    llm, slm = make_pair("qwen2")
    ps, ids, mask = batch()
    free = llm.generate(ids, attention_mask=mask, max_new_tokens=N_NEW)
    kw = dict(eos_token_id=free[0, ids.shape[1] + 3].item(), pad_token_id=2, **option)
    torch.manual_seed(0)
    plain = llm.generate(ids, attention_mask=mask, max_new_tokens=N_NEW, **kw)
    torch.manual_seed(0)
    assert torch.equal(stitched(llm, slm, ids, 0.0, attention_mask=mask, **kw), plain)
    if option.get("do_sample"):
        return  # a sampled row draws from a batch-wide RNG stream: it cannot equal its solo run
    out = stitched(llm, slm, ids, MIXED_TAU["qwen2"], attention_mask=mask, **kw)
    for r, p in enumerate(ps):
        alone = stitched(llm, slm, p, MIXED_TAU["qwen2"], **kw)[0, p.shape[1]:]
        assert torch.equal(out[r, ids.shape[1]: ids.shape[1] + len(alone)], alone), r


def test_streamer_gets_the_whole_batch_each_step():
    llm, slm = make_pair("llama")
    _, ids, mask = batch()

    free = llm.generate(ids, attention_mask=mask, max_new_tokens=N_NEW)
    kw = dict(attention_mask=mask, eos_token_id=free[1, ids.shape[1] + 2].item(), pad_token_id=2, max_new_tokens=N_NEW)
    a, b = Shown(), Shown()
    llm.generate(ids, streamer=a, **kw)
    llm.generate(ids, assistant_model=slm, stitch_threshold=0.0, streamer=b, **kw)
    assert len(a.puts) == len(b.puts) and all(torch.equal(x, y) for x, y in zip(a.puts, b.puts))


@pytest.mark.parametrize("kwargs, match", [
    (dict(prompt_lookup_num_tokens=3), "prompt_lookup_num_tokens"),
    (dict(guidance_scale=1.5), "guidance_scale"),
])
def test_unsupported_options_are_refused_with_a_fix(kwargs, match):
    llm, slm = make_pair("llama")
    _, ids, mask = batch()
    with pytest.raises(ValueError, match=match):
        stitched(llm, slm, ids, 0.5, attention_mask=mask, **kwargs)


def test_bad_inputs_get_clear_errors():
    llm, slm = make_pair("llama", slm_vocab=80)
    ids = prompt(5)
    with pytest.raises(ValueError, match="inputs_embeds.*input_ids"):
        llm.generate(inputs_embeds=llm.get_input_embeddings()(ids), assistant_model=slm, stitch_threshold=0.5,
                     max_new_tokens=3)
    with pytest.raises(ValueError, match="outside the vocabulary both models share"):
        stitched(llm, slm, torch.tensor([[5, 90, 7]]), 0.5)
    with pytest.raises(ValueError, match="at least one row"):
        stitched(llm, slm, torch.zeros(0, 4, dtype=torch.long), 0.5)


def test_finished_rows_leave_the_models_only_when_nobody_can_tell():
    llm, slm = make_pair("llama")
    _, ids, mask = batch()
    free = slm.generate(ids, attention_mask=mask, max_new_tokens=N_NEW)  # tau = 1 below: the SLM writes
    kw = dict(attention_mask=mask, eos_token_id=free[1, ids.shape[1] + 1].item(), pad_token_id=2)
    rows = []
    hook = slm.register_forward_hook(lambda m, a, k, out: rows.append(k["input_ids"].shape[0]), with_kwargs=True)
    try:
        quiet = stitched(llm, slm, ids, 1.0, **kw)
        seen_quiet, rows[:] = list(rows), []
        scored = stitched(llm, slm, ids, 1.0, output_scores=True, return_dict_in_generate=True, **kw)
    finally:
        hook.remove()
    assert torch.equal(quiet, scored.sequences)
    assert seen_quiet[0] == 3 and min(seen_quiet) < 3  # row 1 left the SLM's batch once it finished
    assert set(rows) == {3}  # scores returned: every row runs to the end, as in plain generate


def test_streamer_is_ended_when_stitching_refuses_the_request():
    """generate puts the prompt into the streamer before stitching runs: a refusal must still end it,
    or a consumer iterating a TextIteratorStreamer waits forever."""
    llm, slm = make_pair("llama")

    class Watch:
        ended = False

        def put(self, value):
            pass

        def end(self):
            self.ended = True

    watch = Watch()
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens"):
        llm.generate(prompt(5), assistant_model=slm, stitch_threshold=0.5, max_new_tokens=3, streamer=watch,
                     prompt_lookup_num_tokens=2)
    assert watch.ended


@pytest.mark.parametrize("tau", [1.0, 0.6])
def test_traces_are_the_same_whether_finished_rows_leave_or_keep_running(tau):
    """The trace book records accounted rows only: with finished rows running on (scores returned) each row's
    trace equals the one it gets when finished rows leave the lanes."""
    llm, slm = make_pair("llama")
    _, ids, mask = batch()
    free = stitched(llm, slm, ids, tau, attention_mask=mask, pad_token_id=2)  # no EOS: every row runs to the end
    kw = dict(attention_mask=mask, eos_token_id=free[1, ids.shape[1] + 1].item(), pad_token_id=2,
              return_dict_in_generate=True)
    quiet = stitched(llm, slm, ids, tau, **kw)
    scored = stitched(llm, slm, ids, tau, output_scores=True, **kw)
    assert torch.equal(quiet.sequences, scored.sequences)
    assert min(t.n_tokens for t in quiet.stitch) < N_NEW  # some row finished early
    for a, b in zip(quiet.stitch, scored.stitch):
        assert (a.roles, a.handovers, a.calls) == (b.roles, b.handovers, b.calls)
        assert a.entropies == pytest.approx(b.entropies, abs=1e-6)
        assert [s is None for s in a.slm_entropies] == [s is None for s in b.slm_entropies]
